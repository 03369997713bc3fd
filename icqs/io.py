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

from engine.errors import UserError
# re-exported: the icqs layer reads its inputs and keeps its result logs with these
from commands.jsonl import ResultWriter, read_jsonl, read_results  # noqa: F401

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


def check_text(value, what: str, path=None, line=None) -> None:
    """A string (or a structure of strings, e.g. from YAML) must be valid Unicode text: a lone UTF-16 surrogate
    ("\\ud800") is not. (JSONL input is checked by read_jsonl.)"""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what} holds a lone UTF-16 surrogate (not valid Unicode text)", path, line) from None


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
