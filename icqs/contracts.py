"""The input formats of the evaluation commands, as JSON Schemas shipped in icqs/schemas/ (`icqs schema NAME` prints
one): the task YAML and candidates JSONL of `icqs score`, the inputs of `icqs judge`, `icqs pairwise` and
`icqs allure run` and the ALLURE template. The readers validate every row or file against them with jsonschema
and turn the first violation into one line `file:line: what is wrong` that says what the field holds.

The files a run directory holds and later commands read back have their schemas here too; icqs.run_files reads
them.

Text must be text: YAML reads unquoted `no`, `yes`, `true`, `null`, `3` or `!!binary ...` as a boolean, null,
number or bytes, which would reach the prompts as "False", "None" or "b'...'". Where a schema wants a string,
such a value is an error naming the line (from PyYAML's node marks) and saying to quote it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from engine.errors import UserError, did_you_mean

if TYPE_CHECKING:  # imported where used: the engine's GPU check runs the job builders without jsonschema
    import jsonschema

SCHEMA_DIR = Path(__file__).with_name("schemas")
NAMES = ("task", "candidates", "judge", "pairwise", "allure", "allure-template")
FORMATS = {  # what each command reads, for its --help
    "score": "TASK: a task YAML (`icqs schema task`); CANDIDATES: a JSONL file of answers (`icqs schema candidates`)",
    "judge": "INPUT: a JSONL file of question/response rows (`icqs schema judge`)",
    "pairwise": "INPUT: a JSONL file of question/answer_a/answer_b rows (`icqs schema pairwise`)",
    "allure": "ITEMS: a JSONL file of response rows with answer or label (`icqs schema allure`); --template FILE: a "
    "YAML template (`icqs schema allure-template`)",
}


@lru_cache(maxsize=None)
def schema(name: str) -> dict:
    if name not in NAMES:
        raise UserError(f"no input format {name!r} (known: {', '.join(NAMES)})")
    return json.loads((SCHEMA_DIR / f"{name}.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def _validator(name: str) -> jsonschema.Draft202012Validator:
    import jsonschema

    return jsonschema.Draft202012Validator(schema(name))


def unknown_key(key, known, where: str = "", what: str = "key") -> str:
    """The message of an unknown key: its name, a close known one, and the known ones."""
    return f"unknown {what} {key!r}{where}{did_you_mean(key, known)} (known: {', '.join(sorted(known))})"


MAX_LISTED = 50  # problems of one file listed in its error line; more are counted


def field_help(name: str, key: str) -> str:
    """The schema's description of a top-level field ('' when it has none)."""
    return schema(name).get("properties", {}).get(key, {}).get("description", "")


_YAML_KINDS = {
    "tag:yaml.org,2002:bool": "boolean",
    "tag:yaml.org,2002:null": "null",
    "tag:yaml.org,2002:int": "number",
    "tag:yaml.org,2002:float": "number",
    "tag:yaml.org,2002:binary": "binary",
    "tag:yaml.org,2002:timestamp": "date",
}


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, bytes):
        return "binary"
    return type(value).__name__


def _where(path) -> str:
    """A readable name of a place in a document: 'labels' item 2, 'good' item 3 field 'y'."""
    parts = list(path)
    if not parts:
        return "the file"
    text = repr(parts[0])
    for p in parts[1:]:
        text += f" item {p + 1}" if isinstance(p, int) else f" field {p!r}"
    return text


def _node_at(node, path):
    """The deepest YAML node along `path` (mapping keys and sequence indices)."""
    for p in path:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if k.value == p), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            found = node.value[p]
        else:
            found = None
        if found is None:
            break
        node = found
    return node


def _message(name: str, error: jsonschema.ValidationError, node=None) -> str:
    path = list(error.absolute_path)
    if error.validator == "type" and "string" in (
        error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    ):
        if node is not None and isinstance(node, yaml.ScalarNode) and node.tag in _YAML_KINDS:
            return (
                f'{_where(path)} is the YAML {_YAML_KINDS[node.tag]} {node.value!r}, not text; quote it: "{node.value}"'
            )
        if error.instance is None or isinstance(error.instance, (bool, int, float, bytes)):
            shown = json.dumps(error.instance) if not isinstance(error.instance, bytes) else "b'...'"
            return f'{_where(path)} is the {_json_kind(error.instance)} {shown}, not text; quote it: "{shown}"'
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        sub = schema(name)
        props = (
            sub.get("properties", {})
            if not path and missing in sub.get("properties", {})
            else sub.get("$defs", {}).get("example", {}).get("properties", {})
        )
        help_ = props.get(missing, {}).get("description", "")
        return (
            f"missing {'key' if not path else 'field'} {missing!r}"
            + (f" in {_where(path)}" if path else "")
            + (f": {help_}" if help_ else "")
            + f" (see `icqs schema {name}`)"
        )
    if error.validator == "anyOf" and all(set(sub) == {"required"} for sub in error.validator_value):
        props = error.schema.get("properties", {})
        names = [
            f"{k!r} ({props[k]['description']})" if props.get(k, {}).get("description") else repr(k)
            for sub in error.validator_value
            for k in sub["required"]
        ]
        return f"missing field {' or '.join(names)} (see `icqs schema {name}`)"
    if error.validator == "additionalProperties":
        known = error.schema.get("properties", {})
        extra = sorted(set(error.instance) - set(known))
        return unknown_key(extra[0], known, f" in {_where(path)}" if path else "")
    if error.validator == "oneOf" and error.context:
        # the pool is a path or a list: report the list alternative's first problem, if it is one
        deepest = max(error.context, key=lambda e: len(e.absolute_path))
        if len(deepest.absolute_path) > len(path):
            return _message(name, deepest, node)
    help_ = field_help(name, path[0]) if path and isinstance(path[0], str) else ""
    what = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    return f"{_where(path)}: {what}" + (f" ({help_})" if help_ else "")


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors to report for one violation: for a `oneOf` (a pool is a path or a list), every error of the
    alternative that got furthest into the document (the list's items), else the violation itself."""
    if error.validator != "oneOf" or not error.context:
        return [error]
    branches: dict = {}
    for c in error.context:
        branches.setdefault(c.relative_schema_path[0], []).append(c)
    deepest = max(branches.values(), key=lambda cs: max(len(c.absolute_path) for c in cs))
    if max(len(c.absolute_path) for c in deepest) <= len(error.absolute_path):
        return [error]
    return [leaf for c in deepest for leaf in _leaves(c)]


def check_yaml(name: str, data, root, path: str) -> None:
    """Validate a YAML document (data: its value, root: its composed node) against schema `name`. Every violation
    is listed, in file order, in one UserError naming the first one's line (so that a file with many mistakes,
    such as unquoted yes/no answers, is fixed in one pass)."""
    located = set()
    for e in _validator(name).iter_errors(data):
        for leaf in _leaves(e):
            node = _node_at(root, leaf.absolute_path)
            line = node.start_mark.line + 1
            if leaf.validator == "additionalProperties" and isinstance(node, yaml.MappingNode):
                known = leaf.schema.get("properties", {})
                where = f" in {_where(leaf.absolute_path)}" if leaf.absolute_path else ""
                located |= {
                    (k.start_mark.line + 1, unknown_key(k.value, known, where))
                    for k, _ in node.value
                    if k.value not in known
                }
            else:
                located.add((line, _message(name, leaf, node)))
    if not located:
        return
    problems = sorted(located)
    (line, first), rest = problems[0], problems[1:MAX_LISTED]
    text = first + "".join(f"; line {n}: {m}" for n, m in rest)
    if len(problems) > 1:
        more = len(problems) - MAX_LISTED
        text += (f"; and {more} more" if more > 0 else "") + f" ({len(problems)} problems)"
    raise UserError(text, path, line)


def check_row(name: str, row, path, line: int | None, definition: str | None = None) -> None:
    """Validate one JSONL row against schema `name` (or its `$defs` entry `definition`: the task's pool files hold
    `example` rows); a violation is a UserError naming file:line."""
    import jsonschema

    validator = (
        _validator(name) if definition is None else jsonschema.Draft202012Validator(schema(name)["$defs"][definition])
    )
    error = jsonschema.exceptions.best_match(validator.iter_errors(row))
    if error is not None:
        raise UserError(_message(name, error), str(path), line)


def print_schema(name: str) -> str:
    return json.dumps(schema(name), indent=2, ensure_ascii=False) + "\n"
