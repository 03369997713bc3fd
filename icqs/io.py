"""Files in and out: JSONL reading with file:line errors, resumable append-only result logs, atomic writes."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from engine.errors import UserError
from engine.jsonl import read_jsonl  # noqa: F401  (re-exported: the icqs layer reads its inputs with it)


def atomic_write(path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename: readers see the old file
    or the whole new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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


def open_run(out, meta: dict, accumulate: dict | None = None) -> None:
    """Create OUT/run.json holding `meta`, or check that an existing one was started with the same `meta` (a resume
    with other settings is refused). `accumulate`: list-valued keys whose entries add up across runs instead."""
    path = Path(out) / "run.json"
    written = dict(meta)
    old = json.loads(path.read_text()) if path.exists() else {}
    for key, value in meta.items():
        if path.exists() and old.get(key) != value:
            raise UserError(f"this run directory holds results for a different {key} ({old.get(key)!r}, now "
                            f"{value!r}); use another --out", str(path))
    for key, values in (accumulate or {}).items():
        written[key] = sorted(set(old.get(key, [])) | set(values))
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(written, indent=1, ensure_ascii=False) + "\n")
