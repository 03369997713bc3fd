"""JSONL in and out, with one-line file:line errors (used by the engine CLI and the icqs layer).

`read_jsonl` reads an input file whole and checks every line before any work: readable UTF-8 text, each line a JSON
object in strict JSON (no NaN / Infinity) holding valid Unicode (no lone UTF-16 surrogates from `\\ud800`-style
escapes), with the required fields. `ResultWriter` is the append-only result log that makes long jobs resumable.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

from engine.errors import UserError


def _strict_constant(name: str):
    raise ValueError(f"{name} is not standard JSON")


def parse_line(text: str):
    """One strict JSON value (NaN / Infinity refused). Raises ValueError (JSONDecodeError included), RecursionError."""
    return json.loads(text, parse_constant=_strict_constant)


def dump_line(row: dict) -> str:
    """A row as one line of strict JSON (a NaN or infinite number raises ValueError instead of writing `NaN`)."""
    return json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"


def _read_text(path: str) -> list[str]:
    if os.path.isdir(path):
        raise UserError("is a directory, expected a JSONL file", path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UserError("no such file", path) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", path) from None
    if b"\0" in data:
        raise UserError("a binary file (NUL byte), expected UTF-8 JSONL text", path, data.count(b"\n", 0,
                                                                                              data.index(b"\0")) + 1)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"not UTF-8 text (byte 0x{data[e.start]:02x})", path, line) from None
    return text.splitlines()


def _has_lone_surrogate(row) -> bool:
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_jsonl(path, required: Iterable[str] = (), validate: Callable[[dict], str | None] | None = None,
               with_lines: bool = False) -> list:
    """Rows of a JSONL file (blank lines skipped). A line that is not a JSON object, or lacks a required field,
    raises a one-line UserError naming file:line; so does a row for which `validate` returns a message.
    with_lines: (line number, row) pairs instead of rows."""
    path = str(path)
    required = tuple(required)
    rows = []
    for number, text in enumerate(_read_text(path), 1):
        if not text.strip():
            continue
        try:
            row = parse_line(text)
        except json.JSONDecodeError as e:
            raise UserError(f"not valid JSON ({e.msg} at column {e.colno})", path, number) from None
        except ValueError as e:  # NaN / Infinity, an integer of thousands of digits
            raise UserError(f"not valid JSON ({str(e).split(';')[0]})", path, number) from None
        except RecursionError:
            raise UserError("not valid JSON (nested too deeply)", path, number) from None
        if not isinstance(row, dict):
            raise UserError(f"expected a JSON object, got {type(row).__name__}", path, number)
        if "\\u" in text and _has_lone_surrogate(row):
            raise UserError("a lone UTF-16 surrogate escape (\\ud800-\\udfff): not valid Unicode text", path, number)
        missing = [k for k in required if k not in row]
        if missing:
            raise UserError(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                            path, number)
        problem = validate(row) if validate else None
        if problem:
            raise UserError(problem, path, number)
        rows.append((number, row) if with_lines else row)
    return rows


# --- result logs -------------------------------------------------------------------------------------------------

def _read_complete(path: Path) -> tuple[list[dict], int, int]:
    """(rows, bytes of complete lines, file size). Each row is written as one `json + "\\n"`, so a kill in the
    middle of a write leaves a tail without its newline: that tail is not a row."""
    if not path.exists():
        return [], 0, 0
    if path.is_dir():
        raise UserError("is a directory, expected a JSONL result file", str(path))
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    rows = []
    for number, raw in enumerate(data[:complete].splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = parse_line(raw)
        except (ValueError, RecursionError):
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
    appends one row of strict JSON and flushes it to disk (fsync) before returning.
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
        self._file.write(dump_line(row))
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
