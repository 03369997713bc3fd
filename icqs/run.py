"""One run directory convention for every evaluation command: `icqs score`, `judge`, `pairwise` and `allure run`.

  OUT/run.json   the command and the settings the run was started with; a rerun in OUT with other settings is
                 refused (`fixed` keys), `accumulate` keys add up across runs (e.g. the methods asked for), and
                 `engine_stats` sums the engine's work (tokens requested, computed, cached; seconds) over every run
  OUT/.lock      an OS lock (fcntl.flock) held while a command works in OUT: a second process on the same OUT stops
                 at once with one line naming the holder (pid, host)
  result logs    append-only JSONL (icqs.io.ResultWriter): a killed run resumes from them
  derived files  written whole through a temporary file and a rename (icqs.io.atomic_write)

Nothing is written before the run can start: `RunDir(out, command, settings)` only reads (is OUT usable, does an
existing run.json agree); the command then validates its inputs and loads the model; `run.start()` creates OUT,
takes the lock, checks run.json again under the lock, removes temporary files a hard kill left, and writes run.json.
`read_run_json` reads an existing run directory for the commands that only report on it (leaderboard, report).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from commands.cli_args import check_output_path, output_path
from commands.factory import seed_int
from engine.errors import UserError
from engine.stats import COUNTERS, EngineStats, describe

from .io import TMP_SUFFIX, atomic_write, strict_json

LOCK = ".lock"
# The engine's counters a run sums (Engine.last_stats: engine/stats.py) and the wall-clock seconds of its engine calls,
# with what each one counts (written beside the counters in run.json).
STAT_KEYS = (*COUNTERS, "seconds")
STAT_HELP = {**{name: describe(name) for name in COUNTERS}, "seconds": "wall-clock seconds of the engine calls"}


def read_run_json(out, command: str | None = None) -> dict:
    """The run.json of an existing run directory (of `command` when given); a one-line UserError otherwise."""
    out = Path(out)
    path = out / "run.json"
    if not out.is_dir() or not path.is_file():
        what = {"allure": "an ALLURE", None: "a"}.get(command, f"a {command}")
        raise UserError(f"not {what} run directory (no run.json)", str(out))
    meta = _load(path)
    if meta is None:
        raise UserError("not a run directory (no run.json)", str(out))
    if command is not None and meta.get("command", command) != command:
        raise UserError(f"this is a `{meta['command']}` run directory, not a `{command}` one", str(out))
    return meta


def _load(path: Path) -> dict | None:
    """run.json checked against its schema (icqs.contracts: strict JSON, known fields of the right type and range);
    None when there is none."""
    from .run_files import read_run_file

    return read_run_file(path, fix="corrupt run.json: remove the run directory to start over")


def check_output_dir(out, flag: str = "--out") -> Path:
    """OUT may be created or written in: not a file, and its nearest existing folder writable. Nothing is made."""
    out = Path(check_output_path(out, flag))
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} is a file, not a directory", str(out))
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag}: {parent} is a file, not a directory", str(out))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: no permission to write in {parent}", str(out))
    return out


class RunDir:
    def __init__(
        self,
        out,
        command: str,
        settings: dict,
        fixed: tuple[str, ...] | None = None,
        accumulate: dict | None = None,
        created: dict | None = None,
    ):
        """Check, without writing anything, that OUT can hold this run: `settings` are recorded in run.json,
        `fixed` (default: all of them) must match an existing run.json, `accumulate` maps keys to lists that
        are merged with the existing ones, `created` holds values recorded by the run that creates OUT (kept by
        the runs that resume it)."""
        self.path = check_output_dir(out)
        self.command, self.given, self.created = command, settings, created or {}
        self.fixed = tuple(settings) if fixed is None else fixed
        self.accumulate = accumulate or {}
        self._fd: int | None = None
        self._depth = 0
        self.meta = self._merge(_load(self.path / "run.json") if self.path.is_dir() else None)

    def _merge(self, old: dict | None) -> dict:
        meta = {"command": self.command, **self.created, **(old or {}), **self.given}
        if old is not None:
            if old.get("command", self.command) != self.command:
                raise UserError(
                    f"this directory holds a `{old['command']}` run, not a `{self.command}` one; use another --out",
                    str(self.path),
                )
            changed = [c for key in self.fixed for c in changes(key, old.get(key), self.given.get(key))]
            if changed:
                raise UserError(
                    f"this run directory holds results for other settings: {'; '.join(changed[:6])}"
                    f"{'; ...' if len(changed) > 6 else ''}; use another --out (or the same settings)",
                    str(self.path / "run.json"),
                )
        for key, values in self.accumulate.items():
            meta[key] = sorted(set((old or {}).get(key, [])) | set(values))
        return meta

    # ---- the working state: directory, lock, run.json ----------------------------------------------------------
    def start(self) -> "RunDir":
        """Create OUT, take its lock, check run.json again under the lock and write it. Nested starts share the
        lock; each is ended by close() (or the `with` block)."""
        self._depth += 1
        if self._fd is not None:
            return self
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            self._depth -= 1
            raise UserError(
                f"another command is working in this run directory ({holder}); wait for it to end or use another --out",
                str(self.path),
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        try:
            self.meta = self._merge(_load(self.path / "run.json"))  # another process may have written it meanwhile
            for tmp in self.path.glob(f".*{TMP_SUFFIX}"):  # left by a hard kill in the middle of an atomic write
                tmp.unlink()
            self.save()
        except BaseException:
            self._release()
            raise
        return self

    def save(self) -> None:
        atomic_write(self.path / "run.json", json.dumps(strict_json(self.meta), indent=1, ensure_ascii=False) + "\n")

    def add_stats(self, part: str, stats: dict, key: str = "engine_stats") -> dict:
        """Add one run's engine stats for `part` (a method, a stage) to run.json's running totals under `key`
        (engine_stats: the run's own work; audit_stats: the evaluator audit's); returns them."""
        self.meta["stats_help"] = STAT_HELP
        totals = self.meta.setdefault(key, {})
        old = totals.get(part, {})
        totals[part] = {k: round(old.get(k, 0) + stats.get(k, 0), 3) for k in STAT_KEYS}
        self.save()
        return totals[part]

    def close(self) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        self._depth = 0

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def changes(name: str, old, new) -> list[str]:
    """The settings that differ between two recorded values, as 'name.key: old -> new' (dicts compared key by key,
    lists of different lengths by their length, others item by item)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            c
            for k in list(old) + [k for k in new if k not in old]
            for c in changes(f"{name}.{k}", old.get(k), new.get(k))
        ]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{name}: {len(old)} items -> {len(new)} items"]
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in changes(f"{name}[{i}]", a, b)]
    return [f"{name}: {_short(old)} -> {_short(new)}"]


class MeteredEngine:
    """An engine whose score and generate calls are counted: after each call its Engine.last_stats are added to
    `.stats`, with the call's wall-clock seconds, and handed to `on_call` (a run records them in run.json there, call
    by call, so that a killed run's finished calls are counted). Everything else is the engine's own."""

    def __init__(self, engine, on_call=None):
        self.engine, self.on_call = engine, on_call
        self.totals, self.seconds = EngineStats(), 0.0

    @property
    def stats(self) -> dict:
        """The summed counters and seconds, as run.json records them (STAT_KEYS)."""
        return {**self.totals.counters(), "seconds": self.seconds}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def score(self, *args, **kwargs):
        return self._counted(self.engine.score, args, kwargs)

    def generate(self, *args, **kwargs):
        return self._counted(self.engine.generate, args, kwargs)

    def _counted(self, call, args, kwargs):
        before = self.engine.last_stats
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            counted = self.engine.last_stats if self.engine.last_stats is not before else EngineStats()
            seconds = time.perf_counter() - t0  # each call's counters are a new EngineStats
            self.totals, self.seconds = self.totals.plus(counted), self.seconds + seconds
            if self.on_call is not None:
                self.on_call({**counted.counters(), "seconds": seconds})


def format_stats(stats: dict) -> str:
    """One line: tokens requested, computed, cached; seconds."""
    return (
        f"{stats.get('tokens_requested', 0):,} tokens requested, {stats.get('tokens_computed', 0):,} computed, "
        f"{stats.get('cache_hit_tokens', 0):,} cached, {stats.get('seconds', 0):.1f} s"
    )


# ---- the options every run command shares ------------------------------------------------------------------------
def add_run_args(p: argparse.ArgumentParser, seed_default: int | None = 0, seed_help: str = "sampling seed") -> None:
    """--out (the run directory), --seed and --quiet, as every run command takes them."""
    p.add_argument("--out", required=True, type=output_path, help="run directory (a killed run resumes from it)")
    p.add_argument("--seed", type=seed_int, default=seed_default, help=seed_help)
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing but warnings and errors (no progress bars, no tables: the results are in --out)",
    )


def deterministic_by_default(p: argparse.ArgumentParser) -> None:
    """Evaluation commands run the engine in its deterministic mode unless told otherwise: a score does not depend
    on what else is in the job, so adding a method or an option never moves another method's scores."""
    p.set_defaults(deterministic=True)
    p.add_argument(
        "--nondeterministic",
        dest="deterministic",
        action="store_false",
        help="faster batched kernels whose bf16 scores move with the batch (by up to ~0.1 nats)",
    )
