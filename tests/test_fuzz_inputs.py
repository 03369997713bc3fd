"""Fuzz: malformed JSONL rows, task YAML, run directories and option values, fed in-process to every command
(`python -m engine score`, `icqs score | judge | pairwise | allure run | leaderboard | report | demo`). Each must
end with exit status 2, exactly one stderr line starting with `error:`, and no file created or changed.

Input that is wrong on its own is refused before the model loads: Engine.load is replaced by a tripwire, so a case
that gets that far fails at once (and fast). Only a broken --model reaches the loader, which must refuse it.
Each command's untouched baseline is checked to reach the model (or, for leaderboard/report, to succeed), so every
refusal is caused by the one thing a case breaks."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.engine_cli import main as engine_main
from engine.engine import Engine
from icqs.cli import main as icqs_main

EXAMPLES = 100  # per command; COUNTS holds how many were generated
COUNTS: Counter = Counter()


class ModelLoaded(Exception):
    """Raised by the tripwire that replaces Engine.load: the command accepted its input."""


@dataclass
class Case:
    command: str
    kind: str
    files: dict = field(default_factory=dict)  # name -> bytes (a name ending in "/" is a folder)
    argv: list = field(default_factory=list)  # "{d}" is the case's folder, "{model}" the tiny model
    loads_model: bool = False  # a broken --model: the real loader runs and must refuse it


# --- valid baselines ---------------------------------------------------------------------------------------------


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


TASK = {
    "name": "tiny",
    "template": "Q: {x}\nA: {y}",
    "good": [{"x": "one", "y": "yes"}, {"x": "two", "y": "no"}],
    "bad": [{"x": "one", "y": "no"}, {"x": "two", "y": "yes"}],
    "labels": ["yes", "no"],
    "M": 2,
    "N": 2,
    "L": 1,
}

ROWS = {
    "engine score": [
        {"context": "Reading is a", "continuation": " quiet way", "id": 1},
        {"context": "Time", "continuation": " flies"},
    ],
    "icqs score": [
        {"id": "g0", "model": "good", "x": "four", "y": "yes", "truth": 1.0},
        {"id": "b0", "model": "bad", "x": "four", "y": "no", "truth": 0.0},
    ],
    "icqs judge": [
        {"id": "a", "question": "What is 2+2?", "response": "4"},
        {"id": "b", "question": "Capital of France?", "response": "Paris"},
    ],
    "icqs pairwise": [
        {
            "id": "p",
            "question": "2+2?",
            "answer_a": "4",
            "answer_b": "5",
            "model_a": "m1",
            "model_b": "m2",
            "winner": "model_a",
        }
    ],
    "icqs allure run": [
        {"id": "i1", "response": "The answer is 4", "answer": "4"},
        {"id": "i2", "response": "It is 7", "answer": "6"},
    ],
}
TEXT_FIELDS = {
    "engine score": ("context", "continuation"),
    "icqs score": ("model", "x", "y"),
    "icqs judge": ("question", "response"),
    "icqs pairwise": ("question", "answer_a", "answer_b"),
    "icqs allure run": ("response",),
}
REQUIRED = {**TEXT_FIELDS, "icqs score": ("id", "model", "x", "y"), "icqs allure run": ("response", "answer")}
HAS_IDS = ("icqs score", "icqs judge", "icqs pairwise", "icqs allure run")

ENGINE = ["--model", "{model}", "--dtype", "float32"]
ARGV = {
    "engine score": ["score", "--input", "{d}/in.jsonl", "--output", "{d}/out.jsonl", *ENGINE, "--quiet"],
    "icqs score": ["score", "{d}/task.yaml", "{d}/in.jsonl", "--out", "{d}/run", *ENGINE, "--quiet"],
    "icqs judge": ["judge", "{d}/in.jsonl", "--out", "{d}/run", "--shots", "0,1", *ENGINE, "--quiet"],
    "icqs pairwise": ["pairwise", "{d}/in.jsonl", "--out", "{d}/run", *ENGINE, "--quiet"],
    "icqs allure run": ["allure", "run", "{d}/in.jsonl", "--out", "{d}/run", *ENGINE],
    "icqs demo": ["demo", "--out", "{d}/run", *ENGINE, "--quiet"],
    "icqs leaderboard": ["leaderboard", "{d}/run"],
    "icqs report": ["report", "{d}/run"],
}
COMMANDS = tuple(ARGV)
MODEL_COMMANDS = COMMANDS[:6]
MAIN = {c: engine_main if c == "engine score" else icqs_main for c in COMMANDS}
SCORED_RUN: dict = {}  # the files of a finished `icqs score` run (filled by the scored_run fixture)


def baseline(command: str) -> Case:
    files = {}
    if command in ROWS:
        files["in.jsonl"] = jsonl(ROWS[command])
    if command == "icqs score":
        files["task.yaml"] = yaml.safe_dump(TASK).encode()
    if command == "engine score":  # outputs an --output case may point at: another job's, and not JSONL
        files["other.jsonl"] = jsonl([{"context": "another", "continuation": " job", "logprob": -1.0}])
        files["notes.txt"] = b"my notes, not results\n"
    if command in ("icqs leaderboard", "icqs report"):
        files.update({f"run/{name}": data for name, data in SCORED_RUN.items()})
    if command == "icqs allure run":  # a template a --template case may name: a field padded to a gigabyte
        files["wide.yaml"] = b'system: Grade.\nuser: "R: {response:>999999999}\\nA: {answer}"\n'
    return Case(command, "baseline", files, list(ARGV[command]))


def with_option(case: Case, flag: str, value: str, kind: str) -> Case:
    argv = list(case.argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return Case(case.command, kind, case.files, argv, loads_model=flag == "--model")


# --- malformed rows (JSONL) --------------------------------------------------------------------------------------

NOT_AN_OBJECT = [
    "{",
    "[1, 2]",
    "null",
    '"text"',
    "42",
    '{"a": 1,}',
    "{'single': 'quotes'}",
    "NaN",
    "[]",
    "true",
    '{"a": }',
    '{"a": 1} {"b": 2}',
    "\ufeff{}x",
    "[" * 5000 + "]" * 5000,
    "1" * 5000,
]
WRONG_VALUES = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _json_line_strategy():
    def not_object(text):
        try:
            return not isinstance(json.loads(text), dict)
        except ValueError:
            return True

    return st.one_of(
        st.sampled_from(NOT_AN_OBJECT),
        st.text(min_size=1, max_size=30).filter(
            lambda t: t.strip() and "\n" not in t and "\r" not in t and not_object(t)
        ),
    )


@st.composite
def malformed_rows(draw, command: str) -> Case:
    case = baseline(command)
    rows = [dict(r) for r in ROWS[command]]
    i = draw(st.integers(0, len(rows) - 1))
    lines = [json.dumps(r).encode() for r in rows]
    options = [
        "not_json",
        "missing_field",
        "wrong_type",
        "lone_surrogate",
        "nan",
        "bad_bytes",
        "no_rows",
        "input_is_folder",
        "input_missing",
        "binary_file",
        "huge_number",
        "input_is_fifo",
        "input_is_device",
    ]
    options += ["duplicate_id"] if command in HAS_IDS else []
    options += {
        "engine score": ["empty_continuation"],
        "icqs pairwise": ["bad_winner"],
        "icqs score": ["bad_truth", "bad_truth_dist"],
        "icqs allure run": ["bad_split", "bad_match"],
    }.get(command, [])
    kind = draw(st.sampled_from(options))
    row = rows[i]
    if kind == "not_json":
        lines[i] = draw(_json_line_strategy()).encode("utf-8", "surrogatepass")
    elif kind == "missing_field":
        del row[draw(st.sampled_from(REQUIRED[command]))]
    elif kind == "wrong_type":
        row[draw(st.sampled_from(TEXT_FIELDS[command]))] = draw(WRONG_VALUES)
    elif kind == "lone_surrogate":
        key = draw(st.sampled_from(TEXT_FIELDS[command]))
        row[key] = draw(st.text(max_size=5)) + chr(draw(st.integers(0xD800, 0xDFFF))) + row[key]
    elif kind == "nan":
        row[draw(st.sampled_from(["score", "weight", *row]))] = draw(
            st.sampled_from([float("nan"), float("inf"), float("-inf")])
        )
    elif kind == "huge_number":  # parses as infinity: refused naming its field
        number = draw(st.sampled_from(["1e400", "-1e999", "2.5e308", "1E+309"]))
        key = draw(st.sampled_from(["weight", "meta", *row]))
        text = json.dumps({k: v for k, v in row.items() if k != key})
        value = draw(st.sampled_from(["{n}", '{{"deep": [0, {n}]}}'])).format(n=number)
        lines[i] = (text[:-1] + (", " if len(text) > 2 else "") + f'"{key}": {value}}}').encode()
    elif kind == "bad_bytes":
        text = json.dumps(row, ensure_ascii=False).encode()
        cut = text.index(b'"', text.index(b":") + 1) + 1  # inside the first string value
        lines[i] = (
            text[:cut] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x00", b"\x80abc"])) + text[cut:]
        )
    elif kind == "no_rows":
        lines = [b""] * draw(st.integers(0, 3))
    elif kind == "duplicate_id":
        other = dict(rows[1 - i] if len(rows) > 1 else row)
        other["id"] = row["id"]
        lines.append(json.dumps(other).encode())
    elif kind == "empty_continuation":
        row["continuation"] = ""
    elif kind == "bad_winner":
        row["winner"] = draw(
            st.one_of(st.text(max_size=8), st.integers()).filter(lambda w: w not in ("model_a", "model_b", "tie"))
        )
    elif kind == "bad_truth":
        row["truth"] = draw(
            st.one_of(
                st.floats(min_value=1.0, exclude_min=True),
                st.floats(max_value=0.0, exclude_max=True),
                st.text(max_size=3),
                st.lists(st.integers(), max_size=2),
            )
        )
    elif kind == "bad_truth_dist":
        row["truth_dist"] = draw(
            st.one_of(
                st.lists(st.floats(0, 1), max_size=4).filter(lambda d: len(d) < 2 or abs(sum(d) - 1) > 1e-2),
                st.text(max_size=3),
                st.just([0.25] * 4),
            )
        )  # M + 1 = 3
    elif kind == "bad_split":
        row["split"] = draw(st.text(max_size=8).filter(lambda s: s not in ("audit", "holdout")))
    elif kind == "bad_match":
        row["match"] = draw(
            st.one_of(
                st.text(max_size=8).filter(
                    lambda s: s not in ("number", "option", "node_list", "regex", "label", "exact")
                ),
                st.integers(),
                st.just({"kind": "regex"}),
            )
        )
    if kind not in ("not_json", "bad_bytes", "no_rows", "duplicate_id", "huge_number"):
        lines[i] = json.dumps(row).encode()
    files = dict(case.files)
    files["in.jsonl"] = b"".join(line + b"\n" for line in lines)
    if kind == "input_is_folder":
        files = {**{k: v for k, v in files.items() if k != "in.jsonl"}, "in.jsonl/": b""}
    elif kind == "input_missing":
        files = {k: v for k, v in files.items() if k != "in.jsonl"}
    elif kind == "binary_file":
        files["in.jsonl"] = draw(st.binary(min_size=1, max_size=64)) + b"\x00"
    elif kind == "input_is_fifo":  # opening it would block for ever
        files = {**{k: v for k, v in files.items() if k != "in.jsonl"}, "in.jsonl|": b""}
    elif kind == "input_is_device":  # reading it would never end
        return Case(
            command,
            f"row:{kind}",
            files,
            [a.replace("{d}/in.jsonl", draw(st.sampled_from(["/dev/zero", "/dev/urandom"]))) for a in case.argv],
        )
    return Case(command, f"row:{kind}", files, case.argv)


# --- malformed task YAML (icqs score) ----------------------------------------------------------------------------

TASK_KINDS = [
    "missing_key",
    "bad_count",
    "bad_template",
    "unknown_key",
    "bad_pool",
    "bad_labels",
    "bad_judge_question",
    "yaml_syntax",
    "not_mapping",
    "bad_bytes",
    "bad_seed",
    "task_is_folder",
    "bad_separator",
    "alias_bomb",
    "count_too_large",
    "task_is_fifo",
]


def _alias_bomb(levels: int, width: int) -> str:
    """A YAML document of a few hundred bytes that expands to width**levels nodes."""
    out = "a0: &a0 [" + ", ".join(["x"] * width) + "]\n"
    for k in range(1, levels):
        out += f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * width) + "]\n"
    return out


@st.composite
def malformed_task(draw) -> Case:
    case = baseline("icqs score")
    task = json.loads(json.dumps(TASK))
    kind = draw(st.sampled_from(TASK_KINDS))
    text = None
    if kind == "missing_key":
        del task[draw(st.sampled_from(["template", "good", "bad"]))]
    elif kind == "bad_count":
        task[draw(st.sampled_from(["M", "N", "L"]))] = draw(
            st.one_of(st.integers(max_value=0), st.text(max_size=3), st.floats(0.1, 9.9), st.booleans(), st.none())
        )
    elif kind == "bad_template":
        task["template"] = draw(
            st.one_of(
                st.sampled_from(["no fields", "{y} before {x}", "{x} {x} {y}", "{x} only", "{y} only", "{x}{y}{y}"]),
                st.integers(),
                st.none(),
            )
        )
    elif kind == "unknown_key":
        task[
            draw(
                st.text(min_size=1, max_size=8).filter(
                    lambda k: k not in TASK and k not in ("separator", "header", "judge_question", "seed")
                )
            )
        ] = 1
    elif kind == "bad_pool":
        task[draw(st.sampled_from(["good", "bad"]))] = draw(
            st.one_of(
                st.just([]),
                st.integers(),
                st.just([{"x": "only x"}]),
                st.just(["plain"]),
                st.just("missing.jsonl"),
                st.just({"x": "a", "y": "b"}),
            )
        )
    elif kind == "bad_labels":
        task["labels"] = draw(st.one_of(st.just(["only"]), st.just(["a", "a"]), st.just("yes"), st.integers()))
    elif kind == "bad_judge_question":
        task["judge_question"] = draw(st.one_of(st.just("no x here"), st.just("{x} and {x}"), st.integers()))
    elif kind == "count_too_large":  # M, N, L beyond what any context holds: before any list of that size
        key = draw(st.sampled_from(["M", "N", "L"]))
        task[key] = draw(st.integers(min_value={"M": 257, "N": 4097, "L": 1025}[key], max_value=10**30))
    elif kind == "bad_seed":
        task["seed"] = draw(st.one_of(st.integers(max_value=-1), st.text(max_size=3), st.floats(0.1, 9.9)))
    elif kind == "bad_separator":
        task[draw(st.sampled_from(["separator", "header"]))] = draw(
            st.one_of(st.integers(), st.lists(st.integers(), max_size=2))
        )
    elif kind == "yaml_syntax":
        text = draw(
            st.sampled_from(
                [
                    "name: [unclosed",
                    "template: 'Q: {x}\nA: {y}",
                    "a: b: c",
                    "\t- tab",
                    "{",
                    "]",
                    "key: &anchor\nother: *missing",
                    "%YAML 9.9\n---\na: 1",
                ]
            )
        )
    elif kind == "not_mapping":
        text = draw(st.sampled_from(["- a\n- b", "just text", "42", "", "null", "[1, 2]"]))
    files = dict(case.files)
    files["task.yaml"] = text.encode() if text is not None else yaml.safe_dump(task, allow_unicode=True).encode()
    if kind == "alias_bomb":  # inside a known key: a node budget, not minutes and gigabytes
        key = draw(st.sampled_from(["labels", "good", "bad", "name", "template"]))
        body = yaml.safe_dump({k: v for k, v in task.items() if k != key}, allow_unicode=True).encode()
        levels, width = draw(st.sampled_from([(9, 10), (7, 20), (30, 2)]))
        files["task.yaml"] = (_alias_bomb(levels, width) + f"{key}: *a{levels - 1}\n").encode() + body
    if kind == "bad_bytes":
        files["task.yaml"] = files["task.yaml"].replace(b"tiny", draw(st.sampled_from([b"t\xffny", b"\x00", b"\xc3("])))
    elif kind == "task_is_folder":
        files = {**{k: v for k, v in files.items() if k != "task.yaml"}, "task.yaml/": b""}
    elif kind == "task_is_fifo":
        files = {**{k: v for k, v in files.items() if k != "task.yaml"}, "task.yaml|": b""}
    return Case("icqs score", f"yaml:{kind}", files, case.argv)


# --- malformed options -------------------------------------------------------------------------------------------

NON_INTEGER = st.sampled_from(["x", "1.5", "", "1e3", "one", "--", "0x10", "nan"])
NOT_POSITIVE = st.one_of(st.integers(max_value=0).map(str), NON_INTEGER)
NEGATIVE = st.one_of(st.integers(max_value=-1).map(str), NON_INTEGER)
BAD_DEVICES = ["tpu", "gpu", "cpu:0", "cuda:x", "", "mps", "CPU", "cuda:-1", "cuda:99"] + (
    [] if torch.cuda.is_available() else ["cuda", "cuda:0", "cuda:1"]
)
BAD_MODELS = {
    "missing": None,
    "empty_folder": "dir",
    "text_file": b"not a model\n",
    "truncated_gguf": b"GGUF\x03\x00",
    "garbage_gguf": b"GGUF" + bytes(range(256)) * 2,
}

OPTIONS = {  # command -> {flag: strategy of bad values}
    "engine": {
        "--token-budget": NOT_POSITIVE,
        "--kv-tokens": NOT_POSITIVE,
        "--threads": NOT_POSITIVE,
        "--dtype": st.text(max_size=8).filter(lambda t: t not in ("bfloat16", "float32")),
        "--device": st.sampled_from(BAD_DEVICES),
    },
    "engine score": {
        "--output": st.sampled_from(
            ["{d}", "{d}/missing/out.jsonl", "{d}/in.jsonl", "{d}/other.jsonl", "{d}/notes.txt", "/dev/null"]
        ),
        "--input": st.sampled_from(["{d}", "{d}/missing.jsonl"]),
    },
    "icqs score": {
        "--M": st.one_of(NOT_POSITIVE, st.integers(257, 10**40).map(str)),
        "--N": st.one_of(NOT_POSITIVE, st.integers(4097, 10**40).map(str)),
        "--L": st.one_of(NOT_POSITIVE, st.integers(1025, 10**40).map(str)),
        "--seed": NEGATIVE,
        "--method": st.sampled_from(["bogus", "ICQS", ""]),
        "--sampler": st.sampled_from(["random", ""]),
        "--out": st.sampled_from(["{d}/in.jsonl", "{d}/task.yaml"]),
    },
    "icqs judge": {
        "--batch": NOT_POSITIVE,
        "--runs": NOT_POSITIVE,
        "--demo-tokens": NEGATIVE,
        "--seed": NEGATIVE,
        "--max-tokens": NEGATIVE,
        "--method": st.sampled_from(["bogus", ""]),
        "--shots": st.sampled_from(["x", "1,,a", "-1", "0,-2", "", "auto,1", "1.5"]),
        "--demos": st.sampled_from(["{d}/missing.jsonl", "{d}"]),
        "--out": st.just("{d}/in.jsonl"),
    },
    "icqs pairwise": {
        "--batch": NOT_POSITIVE,
        "--bootstrap": NEGATIVE,
        "--seed": NEGATIVE,
        "--max-tokens": NEGATIVE,
        "--out": st.just("{d}/in.jsonl"),
    },
    "icqs allure run": {
        "--rounds": NOT_POSITIVE,
        "--seed": NEGATIVE,
        "--max-icl": NEGATIVE,
        "--clusters": NOT_POSITIVE,
        "--holdout": st.sampled_from(["-0.1", "1", "1.5", "nan", "inf", "x", ""]),
        "--sweep": st.sampled_from(["a", "1,b", "-1", "4,-8", "1.5"]),
        "--template": st.sampled_from(["bogus", "{d}/missing.yaml", "{d}", "{d}/wide.yaml"]),
        "--memory": st.just("{d}"),
        "--out": st.just("{d}/in.jsonl"),
    },
    "icqs demo": {"--out": st.just("{d}/file.txt")},
}


@st.composite
def malformed_option(draw, command: str) -> Case:
    case = baseline(command)
    flags = {**OPTIONS["engine"], **OPTIONS[command]}
    flag = draw(st.sampled_from(sorted(flags) + ["--model"]))
    if flag == "--model":
        name = draw(st.sampled_from(sorted(BAD_MODELS)))
        data, files, path = BAD_MODELS[name], dict(case.files), "{d}/model"
        if data == "dir":
            files["model/"] = b""
        elif data is not None:
            files["model"] = data
        return with_option(Case(command, case.kind, files, case.argv), "--model", path, f"option:--model {name}")
    value = draw(flags[flag])
    if command == "icqs demo" and flag == "--out":
        case = Case(command, case.kind, {**case.files, "file.txt": b"x"}, case.argv)
    return with_option(case, flag, value, f"option:{flag}")


# --- corrupt run directories (leaderboard, report) ---------------------------------------------------------------

RUN_KINDS = [
    "run_json_not_json",
    "run_json_not_object",
    "run_json_missing_key",
    "run_json_bad_task",
    "run_json_binary",
    "candidates_missing",
    "candidates_corrupt",
    "results_corrupt",
    "no_run_json",
    "dir_missing",
    "dir_is_file",
    "results_bad_row",
    "run_json_huge_count",
]


@st.composite
def corrupt_run(draw, command: str) -> Case:
    case = baseline(command)
    files = dict(case.files)
    meta = json.loads(files["run/run.json"])
    kinds = RUN_KINDS + (
        ["output_is_folder", "output_folder_missing", "output_in_run_dir", "output_not_a_report"]
        if command == "icqs report"
        else []
    )
    kind = draw(st.sampled_from(kinds))
    argv = list(case.argv)
    if kind == "run_json_not_json":
        files["run/run.json"] = draw(st.sampled_from([b"{", b"", b"{'a': 1}", b'{"task": NaN}']))
    elif kind == "run_json_not_object":
        files["run/run.json"] = draw(st.sampled_from([b"[]", b"42", b"null", b'"run"']))
    elif kind == "run_json_missing_key":  # keys both commands read
        del meta[draw(st.sampled_from(["task", "methods", "sampler"]))]
        files["run/run.json"] = json.dumps(meta).encode()
    elif kind == "run_json_bad_task":
        key = draw(st.sampled_from(["M", "L", "template", "good", "bad"]))
        meta["task"][key] = draw(
            st.one_of(
                st.none(),
                st.integers(max_value=0),
                st.just("no fields"),
                st.just([[1]]) if key in ("good", "bad") else st.just([]),
            )
        )
        files["run/run.json"] = json.dumps(meta).encode()
    elif kind == "run_json_binary":
        files["run/run.json"] = b"\xff\xfe\x00garbage"
    elif kind == "candidates_missing":
        del files["run/candidates.jsonl"]
    elif kind == "candidates_corrupt":
        files["run/candidates.jsonl"] = draw(st.sampled_from([b"{\n", b'{"id": 1}\n', b"\xff\n", b"[]\n"]))
    elif kind == "results_corrupt":
        files["run/loglik.jsonl"] = files["run/loglik.jsonl"] + draw(st.sampled_from([b"[1]\n", b"{not json}\n"]))
    elif kind == "results_bad_row":  # valid JSON, wrong shape: a file:line error, never another ranking
        rows = files["run/loglik.jsonl"].splitlines()
        j = draw(st.integers(0, len(rows) - 1))
        row = json.loads(rows[j])
        field_ = draw(st.sampled_from(["loglik", "l", "sampler", "id"]))
        row[field_] = draw(
            st.one_of(
                st.sampled_from([[1], [], "x", None, [0.0, "a", 0.0], -1, 10**6, {}]),
                st.lists(st.floats(-5, 0), min_size=4, max_size=6),
            )
        )
        rows[j] = json.dumps(row).encode()
        files["run/loglik.jsonl"] = b"".join(r + b"\n" for r in rows)
    elif kind == "run_json_huge_count":
        meta["task"][draw(st.sampled_from(["M", "N", "L"]))] = draw(st.integers(5000, 10**12))
        files["run/run.json"] = json.dumps(meta).encode()
    elif kind == "output_in_run_dir":
        argv += [
            "--output",
            "{d}/run/" + draw(st.sampled_from(["run.json", "loglik.jsonl", "candidates.jsonl", "other.html"])),
        ]
    elif kind == "output_not_a_report":
        files["notes.txt"] = b"my notes\n"
        argv += ["--output", "{d}/notes.txt"]
    elif kind == "no_run_json":
        del files["run/run.json"]
    elif kind == "dir_missing":
        files = {}
    elif kind == "dir_is_file":
        files = {"run": b"a file"}
    elif kind == "output_is_folder":
        argv += ["--output", "{d}/run"]
    elif kind == "output_folder_missing":
        argv += ["--output", "{d}/missing/report.html"]
    return Case(command, f"run:{kind}", files, argv)


def malformed(command: str):
    strategies = [malformed_option(command)] if command in MODEL_COMMANDS else [corrupt_run(command)]
    if command in ROWS:
        strategies.append(malformed_rows(command))
    if command == "icqs score":
        strategies.append(malformed_task())
    return st.one_of(strategies)


# --- running a case ----------------------------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def _tripwire(*args, **kwargs):
    raise ModelLoaded("the model was loaded: the command accepted the input")


def run_case(case: Case, model_dir: Path) -> tuple[object, str, list[str]]:
    """(exit status or 'traceback: ...', stderr, files created / changed / removed)."""
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        for name, data in case.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith("|"):
                os.mkfifo(folder / name[:-1])
            else:
                path.mkdir() if name.endswith("/") else path.write_bytes(data)
        argv = [a.replace("{d}", str(folder)).replace("{model}", str(model_dir)) for a in case.argv]
        before = _snapshot(folder)
        err = io.StringIO()
        with (
            redirect_stdout(io.StringIO()),
            redirect_stderr(err),
            mock.patch.object(Engine, "load", Engine.load if case.loads_model else _tripwire),
        ):
            try:
                status = MAIN[case.command](argv)
            except SystemExit as e:
                status = e.code
            except BaseException as e:  # noqa: BLE001  (a traceback is a finding, reported with the case)
                status = f"traceback: {type(e).__name__}: {str(e)[:200]}"
        after = _snapshot(folder)
        changed = sorted(k for k in set(before) | set(after) if before.get(k, 0) != after.get(k, 0))
        return status, err.getvalue(), changed
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def problem(case: Case, model_dir: Path) -> str | None:
    """What is wrong with how the command handled the case, or None."""
    status, err, changed = run_case(case, model_dir)
    lines = err.strip().splitlines()
    if status != 2 or len(lines) != 1 or not lines[0].startswith("error: ") or changed:
        return f"{case.command} {case.kind}: exit {status}, stderr {err.strip()[:300]!r}, files changed {changed}"
    return None


# --- the tests ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scored_run(tiny_model_dir, tmp_path_factory):
    """A finished (tiny) `icqs score` run, the valid baseline that leaderboard and report cases corrupt."""
    d = tmp_path_factory.mktemp("scored")
    (d / "task.yaml").write_text(yaml.safe_dump(TASK))
    (d / "c.jsonl").write_bytes(jsonl(ROWS["icqs score"]))
    with redirect_stdout(io.StringIO()):
        assert (
            icqs_main(
                [
                    "score",
                    str(d / "task.yaml"),
                    str(d / "c.jsonl"),
                    "--out",
                    str(d / "run"),
                    "--model",
                    str(tiny_model_dir),
                    "--dtype",
                    "float32",
                    "--method",
                    "icqs",
                    "--draws",
                    "1",
                    "--quiet",
                ]
            )
            == 0
        )
    SCORED_RUN.update(
        {
            p.name: p.read_bytes()
            for p in (d / "run").iterdir()
            if p.name in ("run.json", "candidates.jsonl", "loglik.jsonl")
        }
    )
    return SCORED_RUN


@pytest.mark.parametrize("command", COMMANDS)
def test_baseline_is_valid(command, tiny_model_dir, scored_run):
    """The unbroken inputs get as far as loading the model (leaderboard and report: succeed)."""
    status, err, _ = run_case(baseline(command), tiny_model_dir)
    if command in MODEL_COMMANDS:
        assert status == "traceback: ModelLoaded: the model was loaded: the command accepted the input", err
    else:
        assert status == 0, err


@pytest.mark.parametrize("command", COMMANDS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_malformed_input_is_one_error_line_exit_2_nothing_written(command, data, tiny_model_dir, scored_run):
    case = data.draw(malformed(command))
    COUNTS[command] += 1
    assert problem(case, tiny_model_dir) is None


def test_count_of_generated_inputs():
    """Runs last: how many malformed inputs the fuzz tests above generated (print with -s)."""
    print(f"\nfuzz: {sum(COUNTS.values())} malformed inputs checked: {dict(COUNTS)}")


@pytest.mark.parametrize(
    "main, argv, expected",
    [
        (engine_main, [], "the following arguments are required: COMMAND"),
        (engine_main, ["nope"], "argument COMMAND: invalid choice: 'nope'"),
        (engine_main, ["score", "--input", "x"], "the following arguments are required: --output"),
        (
            engine_main,
            ["score", "--input", "x", "--output", "y", "--dtype", "float8"],
            "argument --dtype: invalid choice",
        ),
        (icqs_main, ["judge", "x", "--out", "y", "--batch", "many"], "argument --batch: "),
        (icqs_main, ["allure", "run"], "the following arguments are required: items, --out"),
        (icqs_main, ["score", "t.yaml", "c.jsonl", "--out", "o", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_option_errors_are_one_line_without_usage(main, argv, expected, capsys):
    """Before: argparse printed its usage block before the error line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
