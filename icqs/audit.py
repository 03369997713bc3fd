"""The evaluator audit: does a method tell right answers from wrong ones on this task, with this model?

Every `icqs score` run checks each requested method on the task's own labeled pool by k-fold cross-validation:
the good and bad pools are split into k folds (stratified by label in a label task); for fold f the held-out good
examples are candidates with truth 1 and the held-out bad ones candidates with truth 0, and the demo sets are drawn
from the other folds with the run's sampler, balance, M, N and L. This is repeated for every demo draw of the run
(seed, seed + 1, ...: the folds and the demo sets are drawn anew), so the audit sees the same variation as the
leaderboard. k is the fewest folds (2 to 5) whose training part holds N good and N bad examples: each fold draws
its own demo sets, the audit's main cost. The scores are computed by the same engine as the run, in the same
process after it (the engine's prefix cache kept: what the run computed is reused), into their own logs
(audit_loglik.jsonl, audit_icl.jsonl, audit_judge.jsonl), so a killed audit resumes too.

Per (method, measure) audit.json holds
  auc        the mean over draws of the AUC of the measure for held-out good vs bad pool answers
  ci         [low, high]: 95% two-level bootstrap (draws, then pool items within each class)
  auc_draws  the AUC of each draw (their spread is what the demo draw alone moves)
  n          the pool items scored (n_good + n_bad)
  label_auc  label tasks: how well the score alone tells which label the answer carries (AUC of the score for
             the second label vs the first; for more labels the one-vs-rest AUC farthest from 0.5). 0.5 is the
             wanted value: far from it, the scores track the label, not the answer's correctness.
  verdict    `inverted` (the CI lies below 0.5), `at chance` (it includes 0.5), `reliable` (AUC >= 0.7), `weak`
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold

from engine.errors import UserError

from .candidates import Candidate
from .io import ResultWriter, atomic_write, read_results, strict_json
from .methods import MEASURE_NAMES, METHODS, ordered
from .run import MeteredEngine
from .sampler import demo_sets

AUDIT_FILE = "audit.json"
MAX_FOLDS = 5
RELIABLE = 0.7
BAD_VERDICTS = ("at chance", "inverted")


def n_folds(task) -> int:
    """The fewest folds (2 to 5, at most the smaller pool's size) whose training part still holds N good and N bad
    examples: every fold draws its own demo sets, so fewer folds cost less; with none, the most (the largest
    training part; its demos repeat)."""
    most = max(2, min(MAX_FOLDS, len(task.good), len(task.bad)))
    for k in range(2, most + 1):
        if all(len(pool) - math.ceil(len(pool) / k) >= task.N for pool in (task.good, task.bad)):
            return k
    return most


def _split(examples, k: int, seed: int, stratify: bool) -> list[np.ndarray]:
    """The held-out indices of each of k folds."""
    index = np.arange(len(examples))
    labels = [e.y for e in examples]
    counts = {lab: labels.count(lab) for lab in set(labels)}
    if stratify and min(counts.values()) >= k:
        splitter = StratifiedKFold(k, shuffle=True, random_state=seed)
        return [test for _, test in splitter.split(index, labels)]
    return [test for _, test in KFold(k, shuffle=True, random_state=seed).split(index)]


def folds(task, draw: int) -> list[tuple]:
    """[(training task, held-out candidates)] of one demo draw: k folds of the good and of the bad pool."""
    if min(len(task.good), len(task.bad)) < 2:
        raise UserError("cross-validation needs at least 2 good and 2 bad examples")
    k = n_folds(task)
    seed = task.seed + draw
    stratify = task.is_label_task
    good_folds = _split(task.good, k, seed, stratify)
    bad_folds = _split(task.bad, k, seed + 1000, stratify)
    out = []
    for f in range(k):
        held_g, held_b = set(good_folds[f].tolist()), set(bad_folds[f].tolist())
        train = dataclasses.replace(task, good=[e for i, e in enumerate(task.good) if i not in held_g],
                                    bad=[e for i, e in enumerate(task.bad) if i not in held_b], seed=seed)
        cands = [Candidate(f"d{draw}/f{f}/good{i}", "pool", task.good[i].x, task.good[i].y, 1.0)
                 for i in sorted(held_g)]
        cands += [Candidate(f"d{draw}/f{f}/bad{i}", "pool", task.bad[i].x, task.bad[i].y, 0.0) for i in sorted(held_b)]
        out.append((train, cands))
    return out


def audit_log(method) -> str:
    return f"audit_{method.log}"


def compute_audit(engine, task, run, methods, sampler: str, draws: int, progress: bool = False) -> list[dict]:
    """Score the held-out pool answers with every method (resuming from the audit logs), write audit.json, add the
    engine's work to run.json (`audit_stats`), and return the audit entries."""
    per_method = {}
    try:
        for draw in range(draws):  # every fold's demo sets drawn before any work: a pool too small fails here
            for train, _ in folds(task, draw):
                demo_sets(train, sampler)
    except UserError as e:
        entries = [{"method": name, "measure": "-", "verdict": "skipped", "auc": None, "ci": [None, None],
                    "draws": draws, "folds": n_folds(task), "note": f"the pool is too small to cross-validate: {e}"}
                   for name in ordered(methods)]
        atomic_write(run.path / AUDIT_FILE, json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
        return entries
    for name in ordered(methods):
        method = METHODS[name]
        metered = MeteredEngine(engine, on_call=lambda stats, name=name: run.add_stats(name, stats,
                                                                                       key="audit_stats"))
        scored = []  # (draw, item, truth, label, scores)
        with ResultWriter(run.path / audit_log(method), method.key) as writer:
            for draw in range(draws if method.demos else 1):
                for train, cands in folds(task, draw):
                    method.compute(metered, train, cands, writer, sampler, progress)
                    scores = method.score(train, cands, writer.rows, sampler)
                    scored += [(draw, c.id.split("/", 2)[2], c.truth, c.y, s) for c, s in zip(cands, scores)]
        per_method[name] = scored
    entries = audit_entries(task, per_method, draws)
    atomic_write(run.path / AUDIT_FILE, json.dumps(strict_json(entries), indent=1, ensure_ascii=False) + "\n")
    return entries


def _auc_matrix(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUC (Mann-Whitney, ties half) of positives vs negatives along the last axis; leading axes are batches."""
    diff = pos[..., :, None] - neg[..., None, :]
    return (diff > 0).mean(axis=(-2, -1)) + 0.5 * (diff == 0).mean(axis=(-2, -1))


def auc(scores, truths) -> float:
    scores, truths = np.asarray(scores, dtype=np.float64), np.asarray(truths)
    pos, neg = scores[truths == 1], scores[truths == 0]
    return float(_auc_matrix(pos, neg)) if len(pos) and len(neg) else math.nan


def two_level_ci(table: np.ndarray, truths: np.ndarray, rounds: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of the mean AUC over draws: resample the draws (rows of `table` [D, items]), then the good
    and the bad items (columns, each class apart), `rounds` times."""
    rng = np.random.default_rng(seed)
    pos_cols, neg_cols = np.flatnonzero(truths == 1), np.flatnonzero(truths == 0)
    D = table.shape[0]
    chunk = max(1, int(2e7 // (D * len(pos_cols) * len(neg_cols))))  # bounds the [chunk, D, P, N] comparison
    aucs = []
    for start in range(0, rounds, chunk):
        r = min(chunk, rounds - start)
        d = rng.integers(0, D, size=(r, D))
        p = pos_cols[rng.integers(0, len(pos_cols), size=(r, len(pos_cols)))]
        n = neg_cols[rng.integers(0, len(neg_cols), size=(r, len(neg_cols)))]
        pos = table[d[:, :, None], p[:, None, :]]  # [r, D, P]
        neg = table[d[:, :, None], n[:, None, :]]
        aucs.append(_auc_matrix(pos, neg).mean(axis=1))
    aucs = np.concatenate(aucs)
    tail = (1 - level) / 2
    return float(np.quantile(aucs, tail)), float(np.quantile(aucs, 1 - tail))


def label_auc(scores: np.ndarray, labels: list[str], options: list[str]) -> float:
    """How well the score predicts the answer's label (0.5: not at all); see the module docstring."""
    present = [o for o in options if o in labels]
    if len(present) < 2:
        return math.nan
    if len(present) == 2:
        return auc(scores, np.array([lab == present[1] for lab in labels], dtype=int))
    one_vs_rest = [auc(scores, np.array([lab == o for lab in labels], dtype=int)) for o in present]
    return max(one_vs_rest, key=lambda a: abs(a - 0.5))


def verdict(value: float, ci: tuple[float, float]) -> str:
    if math.isnan(value) or math.isnan(ci[0]):
        return "unscored"
    if ci[1] < 0.5:
        return "inverted"
    if ci[0] <= 0.5:
        return "at chance"
    return "reliable" if value >= RELIABLE else "weak"


def audit_entries(task, per_method: dict, draws: int) -> list[dict]:
    entries = []
    for name, scored in per_method.items():
        items = sorted({s[1] for s in scored})
        col = {it: i for i, it in enumerate(items)}
        used_draws = sorted({s[0] for s in scored})
        truths = np.zeros(len(items), dtype=int)
        labels = [""] * len(items)
        for _, it, t, y, _ in scored:
            truths[col[it]], labels[col[it]] = int(t), y
        for measure in METHODS[name].measures:
            if not any(measure in s[4] for s in scored):
                continue  # a calibrated measure of a run without calibration
            table = np.full((len(used_draws), len(items)), np.nan)
            for d, it, _, _, s in scored:
                if s.get(measure) is not None:
                    table[used_draws.index(d), col[it]] = s[measure]
            keep = ~np.isnan(table).any(axis=0)  # items scored in every draw (a judge's unparsable text is not)
            t, sub = truths[keep], table[:, keep]
            entry = {"method": name, "measure": measure, "n": int(keep.sum()), "n_good": int((t == 1).sum()),
                     "n_bad": int((t == 0).sum()), "draws": len(used_draws), "folds": n_folds(task)}
            if entry["n_good"] >= 2 and entry["n_bad"] >= 2:
                per_draw = [auc(row, t) for row in sub]
                value = float(np.mean(per_draw))
                ci = two_level_ci(sub, t)
                lab = label_auc(sub.mean(axis=0), [lab for lab, k in zip(labels, keep) if k], task.labels) \
                    if task.is_label_task else None
            else:
                per_draw, value, ci, lab = [], math.nan, (math.nan, math.nan), None
            entry.update(auc=value, ci=list(ci), auc_draws=per_draw, label_auc=lab, verdict=verdict(value, ci))
            entries.append(entry)
    return entries


def read_audit(out) -> list[dict] | None:
    path = Path(out) / AUDIT_FILE
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the audit ({e}); run `icqs score` again to redo it", str(path)) from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and {"method", "measure", "auc", "ci", "verdict"}
                                                <= set(e) for e in entries):
        raise UserError("not an audit file (a list of method/measure/auc/ci/verdict objects)", str(path))
    return entries


def flagged(entries: list[dict] | None) -> dict:
    """{(method, measure): verdict} of the measures whose verdict is at chance or inverted."""
    return {(e["method"], e["measure"]): e["verdict"] for e in entries or [] if e["verdict"] in BAD_VERDICTS}


def _num(v, fmt: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def format_audit(entries: list[dict], task=None, stats: dict | None = None) -> str:
    """The audit as a plain-text table, with its share of the run's engine work."""
    if not entries:
        return "evaluator audit: none (run with the audit to have one)\n"
    e0 = entries[0]
    pool = f" ({len(task.good)} good, {len(task.bad)} bad)" if task is not None else ""
    lines = [f"evaluator audit: {e0['folds']}-fold cross-validation over the task's pool{pool}, "
             f"{max(e['draws'] for e in entries)} demo draw(s); AUC = how well each score separates held-out good "
             f"from bad pool answers (0.5 = chance)",
             f"{'method':<10} {'measure':<11} {'AUC [95% CI]':<19} {'draws':<17} {'label_auc':>9}  verdict"]
    for e in entries:
        if e["verdict"] == "skipped":
            lines.append(f"{e['method']:<10} skipped: {e.get('note', '')}")
            continue
        draws = " ".join(_num(a) for a in e.get("auc_draws", [])) if e.get("draws", 1) > 1 else ""
        lines.append(f"{e['method']:<10} {MEASURE_NAMES.get(e['measure'], e['measure']):<11} "
                     f"{_num(e['auc'])} [{_num(e['ci'][0])},{_num(e['ci'][1])}]".ljust(43)
                     + f"{draws:<17} {_num(e.get('label_auc')):>9}  {e['verdict']}")
    if any(e.get("label_auc") is not None and not math.isnan(e["label_auc"] or math.nan) and abs(e["label_auc"] - 0.5) >= 0.2
           for e in entries):
        lines.append("  label_auc far from 0.5: that score tracks which label the answer is, not whether it is right")
    if stats:
        lines.append(f"  audit cost: {stats['audit_tokens']:,} of {stats['total_tokens']:,} tokens computed "
                     f"({stats['token_share']:.0%}), {stats['audit_seconds']:.1f} of {stats['total_seconds']:.1f} s "
                     f"({stats['time_share']:.0%})")
    return "\n".join(lines) + "\n"


def audit_share(meta: dict) -> dict | None:
    """The audit's share of the run's computed tokens and engine seconds (run.json's audit_stats vs engine_stats)."""
    audit, run = meta.get("audit_stats") or {}, meta.get("engine_stats") or {}
    if not audit:
        return None
    a_tok = sum(p.get("tokens_computed", 0) for p in audit.values())
    a_sec = sum(p.get("seconds", 0) for p in audit.values())
    r_tok = sum(p.get("tokens_computed", 0) for p in run.values())
    r_sec = sum(p.get("seconds", 0) for p in run.values())
    return {"audit_tokens": a_tok, "total_tokens": a_tok + r_tok, "token_share": a_tok / max(a_tok + r_tok, 1),
            "audit_seconds": a_sec, "total_seconds": a_sec + r_sec, "time_share": a_sec / max(a_sec + r_sec, 1e-9)}


def warnings(entries: list[dict]) -> list[str]:
    """One `warning:` line per measure whose verdict is at chance or inverted."""
    out = []
    for e in entries:
        if e["verdict"] in BAD_VERDICTS:
            what = "below chance: it ranks wrong answers above right ones" if e["verdict"] == "inverted" else \
                "at chance: it does not tell right from wrong answers on this task"
            out.append(f"warning: {e['method']} {MEASURE_NAMES.get(e['measure'], e['measure'])}: audit AUC "
                       f"{_num(e['auc'])} [{_num(e['ci'][0])},{_num(e['ci'][1])}] is {what}; its leaderboard "
                       f"rows (marked !) are not evidence")
    return out
