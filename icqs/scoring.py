"""ICQS and ICQS-Epistemic: the log-likelihood of each candidate answer under the demo sets of every ratio.

For demo set (l, j) and candidate (x, y) the engine scores
    context      = header + the N demos (each rendered by the template, then the separator) + the x part of x,
    continuation = the y part of the template with y filled in,
so the demo text is a prefix shared by every candidate (computed once), and with coupled demo sets neighbouring
ratios share long prefixes too. One engine call covers all M + 1 ratios for one repeat l and one chunk of
candidates; its rows are appended to the result log, so a killed run resumes at the next unfinished chunk.

ICQS (Algorithm 1) reads the curve of repeat l = 0; ICQS-Epistemic (Algorithm 2) the mean curve over l < L.

Calibration (task option `calibrate`, contextual calibration after Zhao et al. 2021): the same demo set is also
followed by a content-free input (`content_free`, "N/A") and the candidate's answer, and the calibrated curve is
    l_j^cal(x, y) = log P(y | demo set j, x) - log P(y | demo set j, content-free x),
their diagonal correction diag(p_cf)^-1 in log space (without renormalising over labels, which free-text answers
do not have). It removes what a demo set makes likely whatever the input, e.g. an answer that a low-ratio set
shows more often; the scores read on it (`score_cal`, `expected_cal`) are reported beside the raw ones. It costs
one more request per distinct answer and demo set, sharing the demo prefix.
"""

from __future__ import annotations

import numpy as np

from engine.progress import progress_bar

from . import posterior as post
from .candidates import Candidate
from .io import ResultWriter
from .sampler import DemoSet, demo_sets
from .task import Task

CHUNK = 64  # candidates per engine call (per repeat): the unit of resumption


def mixture_requests(
    task: Task, sets: list[DemoSet], candidates: list[Candidate], x: str | None = None
) -> list[tuple[str, str]]:
    """(context, continuation) for every (demo set, candidate), demo set major; `x`: the same input for every
    candidate instead of its own (the content-free input of calibration)."""
    requests = []
    for s in sets:
        demos = task.demo_text(list(s.examples))
        requests += [(demos + task.x_part(c.x if x is None else x), task.y_part(c.y)) for c in candidates]
    return requests


def compute_loglik(
    engine,
    task: Task,
    candidates: list[Candidate],
    writer: ResultWriter,
    sampler: str = "coupled",
    repeats: int = 1,
    chunk: int = CHUNK,
    progress: bool = True,
) -> np.ndarray:
    """log P(y | demo set (l, j), x) for each candidate, repeat l < `repeats` and ratio j -> array [C, repeats,
    M + 1]. Rows already in `writer` (key: sampler, l, id) are reused, missing ones computed and appended. Each row
    holds `tokens`, the answer's token count (for per-token likelihoods); with task.calibrate also `loglik_cf`, the
    curve after the content-free input."""
    sets = demo_sets(task, sampler, repeats)
    batches = [(l, candidates[i : i + chunk]) for l in range(repeats) for i in range(0, len(candidates), chunk)]
    todo = [(l, [c for c in part if not writer.done((sampler, l, c.id))]) for l, part in batches]
    todo = [(l, part) for l, part in todo if part]
    for l, part in progress_bar(todo, desc=f"ICQS {sampler} demo sets", unit="batch", disable=not progress or not todo):
        requests = mixture_requests(task, sets[l], part)
        answers = list({c.y: c for c in part}.values())  # calibration: one request per distinct answer
        if task.calibrate:
            requests += mixture_requests(task, sets[l], answers, x=task.content_free)
        results = engine.score(requests, share_prefix=True, progress=progress)
        lp = np.array([r.logprob for r in results], dtype=np.float64)
        raw = lp[: len(part) * (task.M + 1)].reshape(task.M + 1, len(part))
        tokens = [r.num_tokens for r in results[task.M * len(part) : (task.M + 1) * len(part)]]  # after ratio 1
        cf = (
            {c.y: lp[len(raw.flat) :].reshape(task.M + 1, len(answers))[:, i] for i, c in enumerate(answers)}
            if task.calibrate
            else {}
        )
        for i, c in enumerate(part):
            row = {"sampler": sampler, "l": l, "id": c.id, "loglik": raw[:, i].tolist(), "tokens": tokens[i]}
            writer.write(row | ({"loglik_cf": cf[c.y].tolist()} if task.calibrate else {}))
    return loglik_table(writer.rows, candidates, sampler, repeats, task.M + 1)


def loglik_table(
    rows: list[dict], candidates: list[Candidate], sampler: str, repeats: int, n_ratios: int, field: str = "loglik"
) -> np.ndarray:
    """The [C, repeats, M + 1] array of `field` (loglik, or loglik_cf) from result rows; NaN where missing."""
    index = {c.id: i for i, c in enumerate(candidates)}
    table = np.full((len(candidates), repeats, n_ratios), np.nan)
    for row in rows:
        if row["sampler"] == sampler and row["l"] < repeats and row["id"] in index and field in row:
            table[index[row["id"]], row["l"]] = row[field]
    return table


def icqs_scores(
    table: np.ndarray, ratios: list[float], epistemic: bool, cf_table: np.ndarray | None = None
) -> list[dict]:
    """Per-candidate ICQS numbers: `score` (argmax ratio), `expected` (posterior mean), `ci_low`/`ci_high` (90%
    credible interval), `posterior`, `curve`. ICQS uses repeat 0; ICQS-Epistemic the mean over the repeats.
    With `cf_table` (the content-free curves), also `score_cal`, `expected_cal` and `curve_cal` read on the
    calibrated curve."""
    pick = post.epistemic_curve if epistemic else (lambda t: t[:, 0, :])
    out = [post.summarize(curve, ratios) for curve in pick(table)]
    if cf_table is not None:
        for row, curve in zip(out, pick(table - cf_table)):
            cal = post.summarize(curve, ratios)
            row.update(score_cal=cal["score"], expected_cal=cal["expected"], curve_cal=cal["curve"])
    return out


def answer_tokens(rows: list[dict], sampler: str) -> dict:
    """{candidate id: the answer's token count} from the rows that carry it."""
    return {r["id"]: r["tokens"] for r in rows if r["sampler"] == sampler and "tokens" in r}


def method_scores(
    rows: list[dict], candidates: list[Candidate], task: Task, sampler: str, epistemic: bool
) -> list[dict] | None:
    """ICQS (or ICQS-Epistemic) scores of every candidate from the result rows; None while some are missing."""
    repeats = task.L if epistemic else 1
    table = loglik_table(rows, candidates, sampler, repeats, task.M + 1)
    cf = loglik_table(rows, candidates, sampler, repeats, task.M + 1, "loglik_cf") if task.calibrate else None
    if np.isnan(table).any() or (cf is not None and np.isnan(cf).any()):
        return None
    return icqs_scores(table, task.ratios, epistemic, cf)
