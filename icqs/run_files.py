"""The JSON files a run directory holds and later commands read back (run.json, audit.json, leaderboard.json,
failure_modes.json), each with its JSON Schema in icqs/schemas/ (RUN_FILES). `read_run_file` reads one within
bounds (a size cap, strict JSON: no NaN or Infinity, no nesting past Python's limit) and validates it, one line
`file: field ...: what is wrong` otherwise. The schemas name the methods as a placeholder, filled in from
icqs.methods.METHODS when loaded, so they cannot go stale."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from engine.errors import UserError

from .contracts import SCHEMA_DIR
from .methods import METHODS

RUN_FILES = {
    "run.json": "run-meta",
    "audit.json": "run-audit",
    "leaderboard.json": "run-leaderboard",
    "failure_modes.json": "run-failure-modes",
}
MAX_RUN_FILE_BYTES = 64 << 20  # a run's JSON file: its largest, a leaderboard of 100k models, is a few MB
METHODS_PLACEHOLDER = "<the methods of icqs.methods.METHODS>"  # in the run files' schemas: filled in when loaded


@lru_cache(maxsize=None)
def run_file_schema(name: str) -> dict:
    """The schema of a run file (a value of RUN_FILES), the method names filled in."""
    text = (SCHEMA_DIR / f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text.replace(json.dumps(METHODS_PLACEHOLDER), ", ".join(json.dumps(m) for m in METHODS)))


@lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema

    return jsonschema.Draft202012Validator(run_file_schema(name))


def _field(path) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return f"field {text!r}" if text else "the file"


def read_run_file(path, fix: str = "run the command again to rewrite it") -> object | None:
    """A run directory's JSON file (one of RUN_FILES, by its name), checked against its schema; None when it does
    not exist. Anything else wrong (unreadable, too large, not strict JSON, a field of the wrong type or range) is a
    one-line UserError naming the file and the field, ending with `fix`."""
    import jsonschema

    from commands.jsonl import check_regular_file, parse_line

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    check_regular_file(str(path), "a JSON file")
    if path.stat().st_size > MAX_RUN_FILE_BYTES:
        raise UserError(
            f"larger than the {MAX_RUN_FILE_BYTES >> 20} MiB a run's {path.name} may hold; {fix}", str(path)
        )
    try:
        value = parse_line(path.read_bytes())
    except RecursionError:
        raise UserError(f"not valid JSON (nested too deeply); {fix}", str(path)) from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        what = e.strerror if isinstance(e, OSError) else " ".join(str(e).split())[:200]
        raise UserError(f"not valid JSON ({what}); {fix}", str(path)) from None
    error = jsonschema.exceptions.best_match(_validator(RUN_FILES[path.name]).iter_errors(value))
    if error is not None:
        message = " ".join(error.message.split())
        message = message if len(message) <= 160 else message[:157] + "..."
        raise UserError(f"{_field(error.absolute_path)}: {message} (not what the command writes; {fix})", str(path))
    return value
