"""JSONL input with one-line file:line errors (used by the engine CLI and the icqs layer)."""
from __future__ import annotations

import json
from typing import Callable, Iterable

from .errors import UserError


def read_jsonl(path, required: Iterable[str] = (), validate: Callable[[dict], str | None] | None = None) -> list[dict]:
    """Rows of a JSONL file (blank lines skipped). A line that is not a JSON object, or lacks a required field,
    raises a one-line UserError naming file:line; so does a row for which `validate` returns a message."""
    path = str(path)
    required = tuple(required)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UserError("no such file", path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read: {e}", path) from None
    rows = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"not valid JSON ({e.msg} at column {e.colno})", path, number) from None
        if not isinstance(row, dict):
            raise UserError(f"expected a JSON object, got {type(row).__name__}", path, number)
        missing = [k for k in required if k not in row]
        if missing:
            raise UserError(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                            path, number)
        problem = validate(row) if validate else None
        if problem:
            raise UserError(problem, path, number)
        rows.append(row)
    return rows
