"""Files in and out: JSONL reading with file:line errors, resumable append-only result logs, atomic writes.

Every output file gets the user's umask (0644 by default), whether appended to or written through a temporary
file; a temporary file is removed on any exit that runs Python's cleanup (an error, Ctrl-C, SIGTERM: the CLIs turn
it into SystemExit), and one left by a hard kill is removed by the next run in that directory (RunDir.start)."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

from engine.errors import UserError
from engine.jsonl import read_jsonl as _read_jsonl

TMP_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def strict_json(obj):
    """`obj` with every NaN / inf float replaced by None, so that json.dumps writes standard JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def read_jsonl(path, required=(), validate=None) -> list[dict]:
    """engine.jsonl.read_jsonl (one-line file:line errors), also refusing strings that are not valid Unicode text."""
    def check(row: dict) -> str | None:
        bad = _bad_text(row)
        return f"{bad} holds a lone UTF-16 surrogate (not valid Unicode text)" if bad else \
            validate(row) if validate else None
    return _read_jsonl(path, required=required, validate=check)


def _bad_text(value, where: str = "a value") -> str | None:
    """Where in a JSON value a string holds a lone surrogate (json.loads accepts "\\ud800"), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
    elif isinstance(value, dict):
        for k, v in value.items():
            bad = _bad_text(k, "a field name") or _bad_text(v, f"field {k!r}" if isinstance(k, str) else where)
            if bad:
                return bad
    elif isinstance(value, list):
        for v in value:
            if bad := _bad_text(v, where):
                return bad
    return None


def read_jsonl_lines(path, required=()) -> list[tuple[int, dict]]:
    """(line number, row) for each row of a JSONL file (read_jsonl's rows, blank lines skipped)."""
    rows = read_jsonl(path, required=required)
    with open(path, encoding="utf-8") as f:
        numbers = [n for n, text in enumerate(f.read().splitlines(), 1) if text.strip()]
    return list(zip(numbers, rows))


def check_text(value, what: str, path=None, line=None) -> None:
    """A string (or a structure of strings) must be valid Unicode text: a lone UTF-16 surrogate is not."""
    if _bad_text(value):
        raise UserError(f"{what} holds a lone UTF-16 surrogate (not valid Unicode text)", path, line)


def atomic_write(path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename: readers see the old file
    or the whole new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; an output is as readable as any new file
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_complete(path: Path) -> tuple[list[dict], int, int]:
    """(rows, bytes of complete lines, file size). Each row is written as one `json + "\\n"`, so a kill in the
    middle of a write leaves a tail without its newline: that tail is not a row."""
    if not path.exists():
        return [], 0, 0
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    rows = []
    for number, raw in enumerate(data[:complete].splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise UserError("corrupt result line (not a JSON object); remove the file to start over", str(path),
                            number)
        rows.append(row)
    return rows, complete, len(data)


def read_results(path) -> list[dict]:
    """The complete rows of a result log (a torn last line is ignored, the file is not changed); [] if absent."""
    return _read_complete(Path(path))[0]


class ResultWriter:
    """Append-only JSONL log of finished results, so that a killed run resumes without recomputing.

    `key` names the field (str), the fields (tuple of str) or a function row -> hashable that identifies a result.
    On opening, the rows already in the file are loaded (`.rows`); a torn last line, left by a kill in the middle of
    a write, is dropped and cut from the file. `.done(k)` says whether a result with key k is there; `.write(row)`
    appends one row and flushes it to disk (fsync) before returning.
    """

    def __init__(self, path, key: str | tuple[str, ...] | Callable[[dict], object]):
        self.path = Path(path)
        if isinstance(key, str):
            self._key = lambda row: row[key]
        elif isinstance(key, tuple):
            self._key = lambda row: tuple(row[k] for k in key)
        else:
            self._key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._load()
        self._file = open(self.path, "a", encoding="utf-8")

    def _load(self) -> None:
        self.rows, complete, size = _read_complete(self.path)
        self._done = {self._key(row) for row in self.rows}
        if complete < size:  # cut the torn tail so that appends start on a fresh line
            with open(self.path, "r+b") as f:
                f.truncate(complete)

    def done(self, key) -> bool:
        return key in self._done

    def __len__(self) -> int:
        return len(self.rows)

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.rows.append(row)
        self._done.add(self._key(row))

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
