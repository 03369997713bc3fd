"""JSONL in and out, with one-line file:line errors (used by the engine CLI and the icqs layer).

`read_jsonl` streams an input file line by line (never the whole file in memory) and checks every line before any
work: a regular file (a FIFO or a device such as /dev/zero is refused: it could block or never end), lines split on
`\\n` only (as JSONL says: a raw U+2028 or U+0085 inside a string is text, not a line end), each line at most
MAX_LINE_BYTES, readable UTF-8, a JSON object in strict JSON (no NaN / Infinity, and no number that overflows to
infinity such as `1e400`, named by its field) holding valid Unicode (no lone UTF-16 surrogates from `\\ud800`-style
escapes), with the required fields. `ResultWriter` is the append-only result log that makes long jobs resumable.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Callable, Iterable, Iterator

from engine.errors import UserError

from .output_lock import lock_fd

# The longest legitimate line: a request filling the longest context of the supported models (131,072 tokens) with
# tokens of up to 16 bytes of text each, every byte written as a 4-byte JSON escape at worst: 131072 * 16 * 4 = 8 MiB.
LONGEST_CONTEXT_TOKENS = 131_072
MAX_LINE_BYTES = LONGEST_CONTEXT_TOKENS * 16 * 4


class _NonFinite(float):
    """A JSON number that overflows a float (`1e400`): kept as a marker so the row's check can name its field."""

    def __new__(cls, text: str):
        self = super().__new__(cls, math.inf)
        self.text = text
        return self


def _strict_constant(name: str):
    raise ValueError(f"{name} is not standard JSON")


def _strict_float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite_field(value, where: str = "") -> str | None:
    """The path of the first _NonFinite number in a parsed value ('' for the value itself), or None."""
    if isinstance(value, _NonFinite):
        return where or "the value"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _non_finite_field(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _non_finite_field(v, f"{where}[{i}]")
            if found:
                return found
    return None


def parse_line(text: str | bytes):
    """One strict JSON value: NaN / Infinity refused, and a number that overflows a float (`1e400`) refused naming
    its field. Raises ValueError (JSONDecodeError included), RecursionError."""
    value = json.loads(text, parse_constant=_strict_constant, parse_float=_strict_float)
    where = _non_finite_field(value)
    if where:
        raise ValueError(f"field {where!r}: a number too large for a float (it would be infinite)")
    return value


def dump_line(row: dict) -> str:
    """A row as one line of strict JSON (a NaN or infinite number raises ValueError instead of writing `NaN`)."""
    return json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"


def check_regular_file(path: str, what: str = "a JSONL file") -> None:
    """`path` must be an existing regular file (a folder, FIFO, socket or device is refused before it is opened:
    opening a FIFO blocks, and /dev/zero never ends)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError("no such file", path) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", path) from None
    if stat.S_ISDIR(mode):
        raise UserError(f"is a directory, expected {what}", path)
    if not stat.S_ISREG(mode):
        raise UserError(f"not a regular file (a pipe, socket or device), expected {what}", path)


def iter_lines(path: str, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 text file, read as a stream and split on `\\n` only; a line longer
    than max_line_bytes, a NUL byte or bytes that are not UTF-8 are one-line errors naming file:line."""
    check_regular_file(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", path) from None
    with f:
        number = 0
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except OSError as e:
                raise UserError(f"cannot read: {e.strerror or e}", path, number + 1) from None
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes and not (len(raw) == max_line_bytes + 1 and raw.endswith(b"\n")):
                raise UserError(
                    f"line longer than the cap of {max_line_bytes:,} bytes ({max_line_bytes >> 20} MiB: "
                    f"the longest request a {LONGEST_CONTEXT_TOKENS:,}-token context can hold)",
                    path,
                    number,
                )
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if b"\0" in raw:
                raise UserError("a binary file (NUL byte), expected UTF-8 JSONL text", path, number)
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise UserError(f"not UTF-8 text (byte 0x{raw[e.start]:02x})", path, number) from None


def _has_lone_surrogate(row) -> bool:
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def iter_jsonl(
    path,
    required: Iterable[str] = (),
    validate: Callable[[dict], str | None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, dict]]:
    """(line number, row) of each row of a JSONL file, streamed (blank lines skipped). A line that is not a JSON
    object, or lacks a required field, raises a one-line UserError naming file:line; so does a row for which
    `validate` returns a message."""
    path = str(path)
    required = tuple(required)
    for number, text in iter_lines(path, max_line_bytes):
        if not text.strip():
            continue
        try:
            row = parse_line(text)
        except json.JSONDecodeError as e:
            raise UserError(f"not valid JSON ({e.msg} at column {e.colno})", path, number) from None
        except ValueError as e:  # NaN / Infinity / 1e400, an integer of thousands of digits
            raise UserError(f"not valid JSON ({str(e).split(';')[0]})", path, number) from None
        except RecursionError:
            raise UserError("not valid JSON (nested too deeply)", path, number) from None
        if not isinstance(row, dict):
            raise UserError(f"expected a JSON object, got {type(row).__name__}", path, number)
        if "\\u" in text and _has_lone_surrogate(row):
            raise UserError("a lone UTF-16 surrogate escape (\\ud800-\\udfff): not valid Unicode text", path, number)
        missing = [k for k in required if k not in row]
        if missing:
            raise UserError(
                f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}", path, number
            )
        problem = validate(row) if validate else None
        if problem:
            raise UserError(problem, path, number)
        yield number, row


def read_jsonl(
    path,
    required: Iterable[str] = (),
    validate: Callable[[dict], str | None] | None = None,
    with_lines: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list:
    """Rows of a JSONL file (iter_jsonl, all checked before returning). with_lines: (line number, row) pairs."""
    pairs = iter_jsonl(path, required, validate, max_line_bytes)
    return list(pairs) if with_lines else [row for _, row in pairs]


# --- result logs -------------------------------------------------------------------------------------------------


def _read_complete(path: Path, validate: Callable[[dict], str | None] | None = None) -> tuple[list[dict], int, int]:
    """(rows, bytes of complete lines, file size), read as a stream. Each row is written as one `json + "\\n"`, so
    a kill in the middle of a write leaves a tail without its newline: that tail is not a row. `validate` (row ->
    message or None) checks each row against the log's schema: a bad row is a file:line error."""
    if not path.exists():
        return [], 0, 0
    check_regular_file(str(path), "a JSONL result file")
    rows, complete, number = [], 0, 0
    with open(path, "rb") as f:
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    raise UserError(
                        f"corrupt result line (longer than {MAX_LINE_BYTES:,} bytes); remove the file to start over",
                        str(path),
                        number + 1,
                    )
                size = complete + len(raw)  # a torn tail (or nothing): not a row
                break
            number += 1
            complete += len(raw)
            if not raw.strip():
                continue
            try:
                row = parse_line(raw)
            except (ValueError, RecursionError):
                row = None
            if not isinstance(row, dict):
                raise UserError(
                    "corrupt result line (not a JSON object); remove the file to start over", str(path), number
                )
            problem = validate(row) if validate else None
            if problem:
                raise UserError(f"corrupt result row ({problem}); remove the file to start over", str(path), number)
            rows.append(row)
    return rows, complete, size


def read_results(path, validate: Callable[[dict], str | None] | None = None) -> list[dict]:
    """The complete rows of a result log (a torn last line is ignored, the file is not changed); [] if absent.
    `validate` checks each row (a message for a bad one: a file:line error)."""
    return _read_complete(Path(path), validate)[0]


class ResultWriter:
    """Append-only JSONL log of finished results, so that a killed run resumes without recomputing.

    `key` names the field (str), the fields (tuple of str) or a function row -> hashable that identifies a result.
    On opening, the rows already in the file are loaded (`.rows`); a torn last line, left by a kill in the middle of
    a write, is dropped and cut from the file. `.done(k)` says whether a result with key k is there; `.write(row)`
    appends one row of strict JSON and flushes it to disk (fsync) before returning. `validate` (row -> message or
    None) checks every row read back against the log's schema.

    The file is held under an OS lock (commands.output_lock) from opening to close(): a second writer of the same
    log stops at once naming the holder. A log this writer created and left empty by a failure is removed.
    """

    def __init__(
        self,
        path,
        key: str | tuple[str, ...] | Callable[[dict], object],
        validate: Callable[[dict], str | None] | None = None,
    ):
        self.path = Path(path)
        if isinstance(key, str):
            self._key = lambda row: row[key]
        elif isinstance(key, tuple):
            self._key = lambda row: tuple(row[k] for k in key)
        else:
            self._key = key
        self._validate = validate
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = not self.path.exists()
        self._file = open(self.path, "a", encoding="utf-8")
        try:
            lock_fd(self._file.fileno(), str(self.path))
            self._load()
        except BaseException:
            self._file.close()
            self._remove_if_empty()
            raise

    def _remove_if_empty(self) -> None:
        if self._created and self.path.is_file() and self.path.stat().st_size == 0:
            self.path.unlink()

    def _load(self) -> None:
        self.rows, complete, size = _read_complete(self.path, self._validate)
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
            self._file.close()  # releases the lock
            self._remove_if_empty()

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
