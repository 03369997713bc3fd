"""Files in and out: JSONL reading with file:line errors, resumable append-only result logs, atomic writes."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from engine.errors import UserError
# re-exported: the icqs layer reads its inputs and keeps its result logs with these
from engine.jsonl import ResultWriter, read_jsonl, read_results  # noqa: F401


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
