"""ICQS and ICQS-Epistemic: the log-likelihood of each candidate answer under the demo sets of every ratio.

For demo set (l, j) and candidate (x, y) the engine scores
    context      = header + the N demos (each rendered by the template, then the separator) + the x part of x,
    continuation = the y part of the template with y filled in,
so the demo text is a prefix shared by every candidate (computed once), and with coupled demo sets neighbouring
ratios share long prefixes too. One engine call covers all M + 1 ratios for one repeat l and one chunk of
candidates; its rows are appended to the result log, so a killed run resumes at the next unfinished chunk.

ICQS (Algorithm 1) reads the curve of repeat l = 0; ICQS-Epistemic (Algorithm 2) the mean curve over l < L.
"""
from __future__ import annotations

import numpy as np
from tqdm import tqdm

from . import posterior as post
from .candidates import Candidate
from .io import ResultWriter
from .sampler import DemoSet, demo_sets
from .task import Task

CHUNK = 64  # candidates per engine call (per repeat): the unit of resumption


def mixture_requests(task: Task, sets: list[DemoSet], candidates: list[Candidate]) -> list[tuple[str, str]]:
    """(context, continuation) for every (demo set, candidate), demo set major."""
    requests = []
    for s in sets:
        demos = task.demo_text(list(s.examples))
        requests += [(demos + task.x_part(c.x), task.y_part(c.y)) for c in candidates]
    return requests


def compute_loglik(engine, task: Task, candidates: list[Candidate], writer: ResultWriter, sampler: str = "coupled",
                   repeats: int = 1, chunk: int = CHUNK, progress: bool = True) -> np.ndarray:
    """log P(y | demo set (l, j), x) for each candidate, repeat l < `repeats` and ratio j -> array [C, repeats,
    M + 1]. Rows already in `writer` (key: sampler, l, id) are reused, missing ones computed and appended."""
    sets = demo_sets(task, sampler, repeats)
    batches = [(l, candidates[i:i + chunk]) for l in range(repeats) for i in range(0, len(candidates), chunk)]
    todo = [(l, [c for c in part if not writer.done((sampler, l, c.id))]) for l, part in batches]
    todo = [(l, part) for l, part in todo if part]
    for l, part in tqdm(todo, desc=f"ICQS {sampler} demo sets", unit="batch", disable=not progress or not todo):
        results = engine.score(mixture_requests(task, sets[l], part), share_prefix=True, progress=progress)
        lp = np.array([r.logprob for r in results], dtype=np.float64).reshape(task.M + 1, len(part))
        for i, c in enumerate(part):
            writer.write({"sampler": sampler, "l": l, "id": c.id, "loglik": lp[:, i].tolist()})
    return loglik_table(writer.rows, candidates, sampler, repeats, task.M + 1)


def loglik_table(rows: list[dict], candidates: list[Candidate], sampler: str, repeats: int, n_ratios: int
                 ) -> np.ndarray:
    """The [C, repeats, M + 1] array from result rows; NaN where a row is missing."""
    index = {c.id: i for i, c in enumerate(candidates)}
    table = np.full((len(candidates), repeats, n_ratios), np.nan)
    for row in rows:
        if row["sampler"] == sampler and row["l"] < repeats and row["id"] in index:
            table[index[row["id"]], row["l"]] = row["loglik"]
    return table


def icqs_scores(table: np.ndarray, ratios: list[float], epistemic: bool) -> list[dict]:
    """Per-candidate ICQS numbers: `score` (argmax ratio), `expected` (posterior mean), `ci_low`/`ci_high` (90%
    credible interval), `posterior`, `curve`. ICQS uses repeat 0; ICQS-Epistemic the mean over the repeats."""
    curves = post.epistemic_curve(table) if epistemic else table[:, 0, :]
    return [post.summarize(curve, ratios) for curve in curves]
