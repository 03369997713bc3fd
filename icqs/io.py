"""Files in and out: JSONL reading with file:line errors, resumable append-only result logs, atomic writes, and
YAML read within bounds (`read_yaml`: a size cap and a budget of nodes counting every alias expansion, so an alias
bomb is a one-line error, not minutes of work and gigabytes of memory).

Every output file gets the user's umask (0644 by default), whether appended to or written through a temporary
file; a temporary file is removed on any exit that runs Python's cleanup (an error, Ctrl-C, SIGTERM: the CLIs turn
it into SystemExit), and one left by a hard kill is removed by the next run in that directory (RunDir.start)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import yaml

# re-exported: the icqs layer reads its inputs and keeps its result logs with these
from commands.jsonl import ResultWriter, check_regular_file, read_jsonl, read_results  # noqa: F401
from engine.errors import UserError

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


MAX_YAML_BYTES = 16 << 20  # a task or template file; large example pools belong in a JSONL file it names
MAX_YAML_NODES = 1_000_000  # scalars, lists and mappings, an alias counted as the whole subtree it repeats


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no tags beyond the safe ones) whose documents are composed, then sized with every alias
    expanded, before anything is constructed."""


def _expanded_size(root, budget: int) -> int:
    """Nodes of the YAML graph `root` with every alias expanded (each node's size computed once); stops past
    `budget`. Raises ValueError for an alias that refers to itself."""
    sizes: dict[int, int] = {}
    pending: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = (
            node.value
            if isinstance(node, yaml.SequenceNode)
            else [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else []
        )
        if done:
            pending.discard(key)
            size = 1 + sum(sizes[id(c)] for c in children)
            sizes[key] = min(size, budget + 1)
            continue
        if key in pending:
            raise ValueError("a recursive alias (a node that contains itself)")
        pending.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def read_yaml(path, what: str = "a YAML file") -> tuple[object, object]:
    """(node, data) of a YAML file (node: the composed document, for line numbers; None for an empty file), read
    with the safe loader within bounds: a regular file of at most MAX_YAML_BYTES, at most MAX_YAML_NODES nodes once
    every alias is expanded, not nested too deeply. Any problem is a one-line UserError naming file:line."""
    path = str(path)
    check_regular_file(path, what)
    if os.path.getsize(path) > MAX_YAML_BYTES:
        raise UserError(
            f"larger than the cap of {MAX_YAML_BYTES >> 20} MiB for {what} (put large example pools in a JSONL file)",
            path,
        )
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_YAML_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} here ({e.__class__.__name__}: {e})", path) from None
    loader = None
    try:
        loader = _BoundedLoader(text)  # a character YAML does not allow (NUL) fails here
        node = loader.get_single_node()
        if node is None:
            return None, None
        try:
            size = _expanded_size(node, MAX_YAML_NODES)
        except ValueError as e:
            raise UserError(f"invalid YAML: {e}", path) from None
        if size > MAX_YAML_NODES:
            raise UserError(
                f"too large: more than {MAX_YAML_NODES:,} YAML nodes once its aliases are expanded (an alias bomb?)",
                path,
            )
        return node, loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or "invalid YAML"
        line = mark.line + 1 if mark else text.count("\n", 0, e.position) + 1 if hasattr(e, "position") else None
        raise UserError(f"invalid YAML: {problem}", path, line) from None
    except RecursionError:
        raise UserError("invalid YAML: nested too deeply", path) from None
    finally:
        if loader is not None:
            loader.dispose()
