"""Candidates (JSONL): one row per answer to score.

    {"id": "m1-q7", "model": "model-a", "x": "the film is a delight", "y": "positive", "truth": 1.0}

`id` (unique), `model` (who produced the answer), `x` (the question / input), `y` (the answer) are required.
Optional truth fields: `truth`, the answer's true quality in [0, 1] (1 = correct), whose per-model mean gives the
truth ranking; `truth_dist`, a distribution over the M+1 ratios from r = 0 to r = 1 (e.g. ChaosNLI's human
label shares ordered contradiction, neutral, entailment with M = 2), compared with the ICQS posterior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import UserError

from .contracts import check_row
from .io import read_jsonl


@dataclass
class Candidate:
    id: str
    model: str
    x: str
    y: str
    truth: float | None = None
    truth_dist: list[float] | None = None
    extra: dict = field(default_factory=dict)
    line: int | None = None  # where it is in the candidates file, for error messages


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_candidates(path) -> list[Candidate]:
    """Read and check a candidates file; any problem is a one-line UserError naming file:line."""
    path = str(path)
    seen: dict[str, int] = {}
    out = []
    for line, row in read_jsonl(path, required=("id", "model", "x", "y"), with_lines=True):
        check_row("candidates", row, path, line)
        cid = str(row["id"])
        if cid in seen:
            raise UserError(f"duplicate id {cid!r} (first on line {seen[cid]})", path, line)
        seen[cid] = line
        truth = row.get("truth")
        if truth is not None and not (_number(truth) and 0.0 <= truth <= 1.0):
            raise UserError("field 'truth' must be a number in [0, 1]", path, line)
        dist = row.get("truth_dist")
        if dist is not None:
            if not (
                isinstance(dist, list)
                and len(dist) >= 2
                and all(_number(p) and p >= 0 for p in dist)
                and abs(sum(dist) - 1.0) < 1e-3
            ):
                raise UserError(
                    "field 'truth_dist' must be a list of >= 2 non-negative numbers summing to 1", path, line
                )
        extra = {k: v for k, v in row.items() if k not in ("id", "model", "x", "y", "truth", "truth_dist")}
        out.append(
            Candidate(
                cid,
                row["model"],
                row["x"],
                row["y"],
                None if truth is None else float(truth),
                None if dist is None else [float(p) for p in dist],
                extra,
                line,
            )
        )
    if not out:
        raise UserError("no candidates", path)
    return out


def check_truth_dists(candidates: list[Candidate], n_ratios: int, path: str) -> None:
    """Distributional truths are compared with the posterior over the ratios, so they need M + 1 entries."""
    for c in candidates:
        if c.truth_dist is not None and len(c.truth_dist) != n_ratios:
            raise UserError(
                f"candidate {c.id!r}: 'truth_dist' has {len(c.truth_dist)} entries but the task has "
                f"{n_ratios} ratios (M + 1)",
                path,
                c.line,
            )


def check_labels(candidates: list[Candidate], task, path: str) -> None:
    """In a label task every answer is one of the labels: another answer ("Yes." for "yes") would never match."""
    if not task.is_label_task:
        return
    for c in candidates:
        if c.y not in task.labels:
            raise UserError(
                f"candidate {c.id!r}: answer {c.y!r} is none of the task's labels "
                f"({', '.join(map(repr, task.labels))}); write it as one of them",
                path,
                c.line,
            )


def candidate_row(c: Candidate) -> dict:
    """The candidate as a JSONL row (the inverse of read_candidates)."""
    row = {"id": c.id, "model": c.model, "x": c.x, "y": c.y, **c.extra}
    if c.truth is not None:
        row["truth"] = c.truth
    if c.truth_dist is not None:
        row["truth_dist"] = c.truth_dist
    return row
