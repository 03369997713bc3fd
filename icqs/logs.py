"""The schemas of every log and record the icqs commands read back, and their row-by-row checks.

A result log (icqs.io.ResultWriter) or run.json read back by a later command (a resume, `icqs leaderboard`,
`icqs report`) is checked row by row against the JSON Schema of what its command writes (types, lengths, the run's
M / labels / ratings, ranges), so a damaged or edited row is a one-line `file:line` error instead of a silently
different result. Numbers are finite by construction: the JSONL reader (commands.jsonl.parse_line) refuses NaN,
Infinity and overflowing numbers such as `1e400`.

`validator(schema)` turns a schema into the `validate(row) -> message or None` that commands.jsonl's readers take.
"""

from __future__ import annotations

from typing import Callable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from .baselines import RATING_OPTIONS
from .judges.grading import HIGH, LOW
from .judges.pairwise import OUTCOMES, VARIANTS

# The largest run a report or leaderboard reads back: ratios, demos per set and demo sets beyond these come from a
# damaged or edited run.json (no model context holds 4,096 demos), and would make megabytes of report from nothing.
MAX_M, MAX_N, MAX_L = 256, 4096, 1024

_ID = {"type": ["string", "integer"]}
_COUNT = {"type": "integer", "minimum": 0}
_LOGPROB = {"type": "number", "maximum": 1e-3}  # a log-probability (up to rounding)
_PROB = {"type": "number", "minimum": 0, "maximum": 1}


def _logprobs(n: int) -> dict:
    return {"type": "array", "items": _LOGPROB, "minItems": n, "maxItems": n}


def _probs(n: int) -> dict:
    return {"type": "array", "items": _PROB, "minItems": n, "maxItems": n}


def _row(properties: dict, required: tuple[str, ...]) -> dict:
    return {"type": "object", "properties": properties, "required": list(required)}


def loglik_schema(M: int, repeats: int | None = None) -> dict:
    """loglik.jsonl (icqs / epistemic): one curve of M + 1 log-likelihoods per (sampler, demo-set repeat, id)."""
    l_range = {"type": "integer", "minimum": 0, **({"maximum": repeats - 1} if repeats else {})}
    return _row(
        {
            "sampler": {"type": "string"},
            "l": l_range,
            "id": _ID,
            "loglik": _logprobs(M + 1),
            "loglik_cf": _logprobs(M + 1),
            "tokens": {"type": "integer", "minimum": 1},
        },
        ("sampler", "l", "id", "loglik"),
    )


def zeroshot_schema() -> dict:
    """zeroshot.jsonl (loglik / loglik_norm): the answer's log-likelihood with no demos and its token count."""
    return _row(
        {"id": _ID, "loglik": _LOGPROB, "tokens": {"type": "integer", "minimum": 1}}, ("id", "loglik", "tokens")
    )


def icl_schema(labels: list[str]) -> dict:
    """icl.jsonl: the label options' log-probs and the predicted label."""
    return _row(
        {"id": _ID, "label_logprobs": _logprobs(len(labels)), "predicted": {"enum": list(labels)}},
        ("id", "label_logprobs", "predicted"),
    )


def judge_schema() -> dict:
    """judge.jsonl (the verbalized-judge baseline): the rating tokens' log-probs and the generated text."""
    return _row(
        {"id": _ID, "rating_logprobs": _logprobs(len(RATING_OPTIONS)), "text": {"type": "string"}},
        ("id", "rating_logprobs", "text"),
    )


def grades_schema() -> dict:
    """grades.jsonl (`icqs judge`): the rating distribution of one (item, shots, run)."""
    n = HIGH - LOW + 1
    return _row(
        {
            "id": _ID,
            "k": _COUNT,
            "run": _COUNT,
            "seed": _COUNT,
            "probs": _probs(n),
            "expected": {"type": "number", "minimum": LOW - 1e-3, "maximum": HIGH + 1e-3},
            "argmax": {"type": "integer", "minimum": LOW, "maximum": HIGH},
            "generated": {"type": "string"},
            "parsed": {"type": ["integer", "null"], "minimum": LOW, "maximum": HIGH},
        },
        ("id", "k", "run", "probs", "expected", "argmax"),
    )


def verdicts_schema() -> dict:
    """verdicts.jsonl (`icqs pairwise`): per-variant outcome distributions and verdicts, and their aggregate."""
    outcome = {"enum": list(OUTCOMES)}
    names = [v.name for v in VARIANTS]
    probs = {
        "type": "object",
        "required": list(OUTCOMES),
        "additionalProperties": False,  # labeled: {model_a, ...}
        "properties": {o: {"type": "number", "minimum": 0, "maximum": 1 + 1e-6} for o in OUTCOMES},
    }
    per = {"type": "object", "properties": {n: probs for n in names}, "required": names}
    verdicts = {"type": "object", "properties": {n: outcome for n in names}, "required": names}
    return _row(
        {
            "id": _ID,
            "model_a": {"type": "string"},
            "model_b": {"type": "string"},
            "winner": {"enum": [*OUTCOMES, None]},
            "variants": per,
            "verdicts": verdicts,
            "aggregate": probs,
            "verdict": outcome,
            "generated": {"type": "object"},
        },
        ("id", "variants", "verdicts", "aggregate", "verdict"),
    )


def allure_stage_schema() -> dict:
    """stages.jsonl (`icqs allure run`): a stage's name, kind and the memory ids of its ICL examples."""
    return _row(
        {
            "stage": {"type": "string"},
            "kind": {"type": "string"},
            "icl_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        },
        ("stage", "kind", "icl_ids"),
    )


def allure_eval_schema() -> dict:
    """evals.jsonl (`icqs allure run`): one item's label in one stage."""
    return _row(
        {
            "stage": {"type": "string"},
            "id": _ID,
            "split": {"type": "string"},
            "truth": {"enum": [0, 1]},
            "p_correct": _PROB,
            "label": {"enum": [0, 1]},
        },
        ("stage", "id", "split", "truth", "p_correct", "label"),
    )


def allure_memory_schema() -> dict:
    """An example of the ALLURE ICL memory (SQLite, icqs.allure.memory), its provenance parsed from JSON."""
    text, maybe_text = {"type": "string"}, {"type": ["string", "null"]}
    label = {"enum": [0, 1]}
    return _row(
        {
            "id": {"type": "integer", "minimum": 0},
            "item_id": text,
            "user_text": text,
            "assistant_text": text,
            "response": text,
            "answer": maybe_text,
            "correct_label": label,
            "evaluator_label": {"enum": [0, 1, None]},
            "evaluator_prob": {"anyOf": [_PROB, {"type": "null"}]},
            "error_kind": maybe_text,
            "failure_mode": maybe_text,
            "status": {"enum": ["pending", "accepted", "rejected"]},
            "run_id": maybe_text,
            "round": {"type": ["integer", "null"], "minimum": 0},
            "provenance": {"type": "object"},
            "created_at": text,
            "reviewed_at": maybe_text,
        },
        (
            "id",
            "item_id",
            "user_text",
            "assistant_text",
            "response",
            "correct_label",
            "status",
            "provenance",
            "created_at",
        ),
    )


def run_task_schema() -> dict:
    """The task a score run's run.json records, as far as a report or leaderboard reads it: M, N, L in range."""
    return {
        "type": "object",
        "properties": {
            "M": {"type": "integer", "minimum": 1, "maximum": MAX_M},
            "N": {"type": "integer", "minimum": 1, "maximum": MAX_N},
            "L": {"type": "integer", "minimum": 1, "maximum": MAX_L},
        },
        "required": ["M", "N", "L"],
    }


def _where(error) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return f"field {path!r}" if path else "the row"


def _short(message: str, limit: int = 120) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def problem(schema_validator: Draft202012Validator, row) -> str | None:
    """The first thing wrong with `row` (one line naming the field), or None."""
    error = best_match(schema_validator.iter_errors(row))
    return None if error is None else f"{_where(error)}: {_short(error.message)}"


def validator(schema: dict) -> Callable[[dict], str | None]:
    """row -> one-line message naming the field, or None: what commands.jsonl's readers take as `validate`."""
    checker = Draft202012Validator(schema)
    return lambda row: problem(checker, row)


def score_log_validator(method: str, task, ids=None, sampler: str | None = None) -> Callable[[dict], str | None]:
    """The check of a row of `icqs score`'s log for `method` (icqs.methods.METHODS[method].log) under `task`; with
    the run's candidate `ids` and `sampler`, a row of another candidate or sampler (a damaged or mixed log) is
    refused too."""
    if method in ("icqs", "epistemic", "fewshot"):  # one log for all three: repeats up to L
        check = validator(loglik_schema(task.M, task.L))
    elif method in ("loglik", "loglik_norm"):
        check = validator(zeroshot_schema())
    elif method == "icl":
        check = validator(icl_schema(task.labels))
    elif method == "judge":
        check = validator(judge_schema())
    else:
        raise KeyError(method)
    known = None if ids is None else set(ids)

    def validate(row: dict) -> str | None:
        bad = check(row)
        if bad is None and known is not None and row["id"] not in known:
            bad = f"field 'id': {_short(repr(row['id']), 60)} is not a candidate of this run"
        if bad is None and sampler is not None and "sampler" in row and row["sampler"] != sampler:
            bad = f"field 'sampler': {_short(repr(row['sampler']), 60)} is not this run's sampler ({sampler})"
        return bad

    return validate
