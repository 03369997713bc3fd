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
  auc        the AUC of the measure for held-out good vs bad pool answers, each answer's score its mean over the
             demo draws: what the leaderboard ranks by (it averages every candidate's score over the draws)
  ci         [low, high]: 95% two-level bootstrap (draws, then pool items within each class)
  auc_draws  the AUC of each draw alone (their spread is what the demo draw alone moves)
  n          the pool items scored (n_good + n_bad)
  label_auc  label tasks: how well the score alone tells which label the answer carries (AUC of the score for
             the second label vs the first; for more labels the one-vs-rest AUC farthest from 0.5). 0.5 is the
             wanted value: far from it (LABEL_BIAS), the scores track the label, not the answer's correctness,
             and `label_bias` is true: such a measure is marked and never the headline.
  verdict    `constant` (every pool answer scored alike), `inverted` (the CI lies below 0.5), `at chance` (it
             includes 0.5), `reliable` (AUC >= 0.7), `weak`
  family     the measures this audit scored (k), among which the headline picks the best one, and
  ci_family  that AUC's two-level bootstrap CI at the level 1 - 0.05 / k (Bonferroni): the best of k measures at
             chance has its 95% CI above 0.5 far more often than 1 time in 40 (with k = 11 about 1 in 4 when they
             are independent); the headline needs this CI above 0.5 too. Absent when k = 1 (ci is then the same).
  truth_auc  where candidates carry `truth`: the same AUC on the candidates themselves (truth > 0.5 right,
  truth_ci   < 0.5 wrong), its CI resampling the draws and then the questions (answers to one question move
             together); absent when no candidate carries truth. `agrees`: whether the two CIs overlap.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold

from engine.errors import UserError
from engine.progress import progress_bar

from .aggregate import mark_symbol
from .candidates import Candidate
from .io import ResultWriter, atomic_write, strict_json
from .methods import METHODS, measure_name, ordered
from .run import MeteredEngine
from .sampler import demo_sets

AUDIT_FILE = "audit.json"
MAX_FOLDS = 5
RELIABLE = 0.7
LABEL_BIAS = 0.2  # |label_auc - 0.5| from which a score is said to follow the label
BAD_VERDICTS = ("at chance", "inverted", "constant")


def n_folds(task) -> int:
    """The fewest folds (2 to 5, at most the smaller pool's size) whose training part still holds N good and N bad
    examples: every fold draws its own demo sets, so fewer folds cost less; with none, the most (the largest
    training part; its demos repeat)."""
    most = max(2, min(MAX_FOLDS, len(task.good), len(task.bad)))
    for k in range(2, most + 1):
        if all(len(pool) - math.ceil(len(pool) / k) >= task.N for pool in (task.good, task.bad)):
            return k
    return most


def fold_note(task) -> str | None:
    """What a reader must know when the folds' training parts are too small for the run's N to draw different demo
    sets (each holds exactly N good or N bad examples: every demo set of a fold shows the same examples, in other
    orders, while the run's N of the whole pool vary); None when they can vary."""
    k = n_folds(task)
    train = min(len(pool) - math.ceil(len(pool) / k) for pool in (task.good, task.bad))
    if train > task.N:
        return None
    return (
        f"each fold trains on {train} good and {train} bad examples and N = {task.N}: every demo set of a fold "
        f"shows the same examples (in other orders), where the run's sets draw {task.N} of "
        f"{min(len(task.good), len(task.bad))}; the audit sees less demo variation than the leaderboard (more "
        f"pool examples, or a smaller N, lift this)"
    )


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
        train = dataclasses.replace(
            task,
            good=[e for i, e in enumerate(task.good) if i not in held_g],
            bad=[e for i, e in enumerate(task.bad) if i not in held_b],
            seed=seed,
        )
        cands = [
            Candidate(f"d{draw}/f{f}/good{i}", "pool", task.good[i].x, task.good[i].y, 1.0) for i in sorted(held_g)
        ]
        cands += [Candidate(f"d{draw}/f{f}/bad{i}", "pool", task.bad[i].x, task.bad[i].y, 0.0) for i in sorted(held_b)]
        out.append((train, cands))
    return out


def audit_skipped(task, sampler: str, draws: int) -> str | None:
    """Why the audit cannot run on this task (a pool too small to cross-validate: every fold's demo sets are drawn
    first, nothing is scored), or None. The one check of `icqs score` (the audit then records it) and `icqs
    preview` (which says so)."""
    try:
        for draw in range(draws):
            for train, _ in folds(task, draw):
                demo_sets(train, sampler)
    except UserError as e:
        return f"the pool is too small to cross-validate: {e}"
    return None


def audit_log(method) -> str:
    return f"audit_{method.log}"


def compute_audit(
    engine,
    task,
    run,
    methods,
    sampler: str,
    draws: int,
    progress: bool = False,
    rows: list[dict] | None = None,
    candidates=None,
) -> list[dict]:
    """Score the held-out pool answers with every method (resuming from the audit logs), write audit.json, add the
    engine's work to run.json (`audit_stats`), and return the audit entries; with the run's score `rows` and its
    `candidates`, each entry also holds the AUC against the candidates' truth (add_truth)."""
    per_method = {}
    skipped = audit_skipped(task, sampler, draws)  # before any work
    if skipped is not None:
        entries = [
            {
                "method": name,
                "measure": "-",
                "verdict": "skipped",
                "auc": None,
                "ci": [None, None],
                "draws": draws,
                "folds": n_folds(task),
                "note": skipped,
            }
            for name in ordered(methods)
        ]
        atomic_write(run.path / AUDIT_FILE, json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
        return entries
    parts = sum((draws if METHODS[name].demos else 1) * n_folds(task) for name in methods)
    bar = progress_bar(
        total=parts, desc="evaluator audit", unit="fold", disable=not progress
    )  # one bar for the audit: the methods' own bars stay off
    with bar:
        for name in ordered(methods):
            method = METHODS[name]
            metered = MeteredEngine(
                engine, on_call=lambda stats, name=name: run.add_stats(name, stats, key="audit_stats")
            )
            scored = []  # (draw, item, truth, label, scores)
            with ResultWriter(run.path / audit_log(method), method.key) as writer:
                for draw in range(draws if method.demos else 1):
                    for train, cands in folds(task, draw):
                        method.compute(metered, train, cands, writer, sampler, False)
                        scores = method.score(train, cands, writer.rows, sampler)
                        scored += [(draw, c.id.split("/", 2)[2], c.truth, c.y, s) for c, s in zip(cands, scores)]
                        bar.update(1)
            per_method[name] = scored
    entries = audit_entries(task, per_method, draws)
    if rows is not None and candidates is not None:
        add_truth(entries, rows, candidates)
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


def _weighted_auc(scores: np.ndarray, pos: np.ndarray, neg: np.ndarray, wp: np.ndarray, wn: np.ndarray) -> np.ndarray:
    """AUC per round: scores [R, items], the positive and negative columns, their weights [R, P] and [R, N] (how
    often each was drawn); NaN for a round that drew no positive or no negative."""
    diff = scores[:, pos, None] - scores[:, None, neg]  # [R, P, N]
    wins = (diff > 0) + 0.5 * (diff == 0)
    num = np.einsum("rp,rpn,rn->r", wp, wins, wn)
    den = wp.sum(axis=1) * wn.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def two_level_ci(
    table: np.ndarray, truths: np.ndarray, rounds: int = 2000, seed: int = 0, level: float = 0.95, groups=None
) -> tuple[float, float]:
    """Percentile CI of the AUC of the items' mean score over draws (rows of `table` [D, items]): each round
    resamples the draws, then the items: within each class (pool items), or, with `groups` (one label per item,
    e.g. its question), whole groups, so that items that move together are resampled together."""
    rng = np.random.default_rng(seed)
    truths = np.asarray(truths)
    pos, neg = np.flatnonzero(truths == 1), np.flatnonzero(truths == 0)
    D, n = table.shape
    if groups is not None:
        _, gid = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    chunk = max(1, int(2e7 // max(1, len(pos) * len(neg) + D * n)))  # bounds the [chunk, P, N] comparison
    aucs = []
    for start in range(0, rounds, chunk):
        r = min(chunk, rounds - start)
        d = rng.integers(0, D, size=(r, D))
        scores = table[d].mean(axis=1)  # [r, items]: each item's mean over the resampled draws
        if groups is None:
            wp = np.stack([np.bincount(rng.integers(0, len(pos), len(pos)), minlength=len(pos)) for _ in range(r)])
            wn = np.stack([np.bincount(rng.integers(0, len(neg), len(neg)), minlength=len(neg)) for _ in range(r)])
        else:
            counts = np.stack(
                [np.bincount(rng.integers(0, gid.max() + 1, gid.max() + 1), minlength=gid.max() + 1) for _ in range(r)]
            )  # [r, groups]
            w = counts[:, gid]
            wp, wn = w[:, pos], w[:, neg]
        aucs.append(_weighted_auc(scores, pos, neg, wp.astype(np.float64), wn.astype(np.float64)))
    aucs = np.concatenate(aucs)
    tail = (1 - level) / 2
    return float(np.nanquantile(aucs, tail)), float(np.nanquantile(aucs, 1 - tail))


def label_auc(scores: np.ndarray, labels: list[str], options: list[str]) -> float:
    """How well the score predicts the answer's label (0.5: not at all); see the module docstring."""
    present = [o for o in options if o in labels]
    if len(present) < 2:
        return math.nan
    if len(present) == 2:
        return auc(scores, np.array([lab == present[1] for lab in labels], dtype=int))
    one_vs_rest = [auc(scores, np.array([lab == o for lab in labels], dtype=int)) for o in present]
    return max(one_vs_rest, key=lambda a: abs(a - 0.5))


def verdict(value: float, ci: tuple[float, float], constant: bool = False) -> str:
    if constant:
        return "constant"
    if math.isnan(value) or math.isnan(ci[0]):
        return "unscored"
    if ci[1] < 0.5:
        return "inverted"
    if ci[0] <= 0.5:
        return "at chance"
    return "reliable" if value >= RELIABLE else "weak"


def audit_entries(task, per_method: dict, draws: int) -> list[dict]:
    entries, tables = [], []
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
            entry = {
                "method": name,
                "measure": measure,
                "n": int(keep.sum()),
                "n_good": int((t == 1).sum()),
                "n_bad": int((t == 0).sum()),
                "draws": len(used_draws),
                "folds": n_folds(task),
            }
            if METHODS[name].demos and fold_note(task):
                entry["fold_note"] = fold_note(task)
            if entry["n_good"] >= 2 and entry["n_bad"] >= 2:
                per_draw = [auc(row, t) for row in sub]
                value = auc(sub.mean(axis=0), t)  # the draws' mean score, as the leaderboard ranks by
                ci = two_level_ci(sub, t)
                lab = (
                    label_auc(sub.mean(axis=0), [lab for lab, k in zip(labels, keep) if k], task.labels)
                    if task.is_label_task
                    else None
                )
            else:
                per_draw, value, ci, lab = [], math.nan, (math.nan, math.nan), None
            constant = bool(sub.size) and bool(np.all(sub == sub.flat[0]))
            entry.update(
                auc=value,
                ci=list(ci),
                auc_draws=per_draw,
                label_auc=lab,
                label_bias=lab is not None and not math.isnan(lab) and abs(lab - 0.5) >= LABEL_BIAS,
                verdict=verdict(value, ci, constant),
            )
            entries.append(entry)
            tables.append((sub, t) if not math.isnan(value) else None)
    family = sum(x is not None for x in tables)
    if family > 1:  # the headline picks among them: its bound counts them (module docstring: ci_family)
        for entry, x in zip(entries, tables):
            if x is not None:
                entry.update(family=family, ci_family=list(two_level_ci(*x, rounds=4000, level=1 - 0.05 / family)))
    return entries


def truth_auc(rows: list[dict], method: str, measure: str, question: dict) -> dict | None:
    """The candidate-level AUC of one measure against the candidates' own truth (truth > 0.5 right, < 0.5 wrong;
    0.5 left out), each candidate's score its mean over the draws as the leaderboard takes it, with a CI resampling
    the draws and then the questions (`question`: id -> x); None when fewer than 2 right or 2 wrong candidates."""
    rows = [r for r in rows if r["method"] == method and r.get("truth") is not None and r["truth"] != 0.5]
    draws = sorted({r.get("draw", 0) for r in rows})
    ids = sorted({r["id"] for r in rows})
    if not ids:
        return None
    table = np.full((len(draws), len(ids)), np.nan)
    col = {i: k for k, i in enumerate(ids)}
    truth = np.zeros(len(ids), dtype=int)
    for r in rows:
        truth[col[r["id"]]] = int(r["truth"] > 0.5)
        if r.get(measure) is not None:
            table[draws.index(r.get("draw", 0)), col[r["id"]]] = r[measure]
    keep = ~np.isnan(table).any(axis=0)
    t, sub = truth[keep], table[:, keep]
    if (t == 1).sum() < 2 or (t == 0).sum() < 2:
        return None
    groups = [question.get(i, i) for i, k in zip(ids, keep) if k]
    return {
        "auc": auc(sub.mean(axis=0), t),
        "ci": list(two_level_ci(sub, t, groups=groups)),
        "n": int(keep.sum()),
        "n_right": int((t == 1).sum()),
        "n_wrong": int((t == 0).sum()),
    }


def add_truth(entries: list[dict], rows: list[dict], candidates) -> list[dict]:
    """Each audit entry gains `truth_auc`, `truth_ci`, `truth_n` and `agrees` (the pool's and the candidates' CIs
    overlap) where the candidates carry truth; entries are left as they are otherwise."""
    question = {c.id: c.x for c in candidates}
    for e in entries:
        if e["verdict"] == "skipped" or e.get("measure") in (None, "-"):
            continue
        t = truth_auc(rows, e["method"], e["measure"], question)
        if t is None:
            continue
        e.update(truth_auc=t["auc"], truth_ci=t["ci"], truth_n=t["n"])
        if not any(v is None or math.isnan(v) for v in (*e["ci"], *t["ci"])):
            e["agrees"] = bool(e["ci"][0] <= t["ci"][1] and t["ci"][0] <= e["ci"][1])
    return entries


def read_audit(out) -> list[dict] | None:
    """audit.json of a run directory, checked against its schema (icqs.contracts: a damaged or edited file is a
    one-line error naming the field); None when there is none."""
    from .run_files import read_run_file

    return read_run_file(Path(out) / AUDIT_FILE, fix="run `icqs score` again to redo the audit")


def marked(entry: dict) -> str | None:
    """Why a measure's leaderboard cells carry a mark (None: reliable and not following the label): its verdict
    when it is not `reliable`, else `label-following`."""
    if entry["verdict"] != "reliable":
        return entry["verdict"]
    return "label-following" if entry.get("label_bias") else None


def flagged(entries: list[dict] | None) -> dict:
    """{(method, measure): reason} of the measures whose cells are marked (marked())."""
    return {
        (e["method"], e["measure"]): marked(e)
        for e in entries or []
        if e["verdict"] != "skipped" and marked(e) is not None
    }


def _num(v, fmt: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _ci(ci) -> str:
    return f"[{_num(ci[0])}, {_num(ci[1])}]"


def format_audit(entries: list[dict], task=None, stats: dict | None = None) -> str:
    """The audit as a plain-text table (the AUC against the candidates' truth beside it where they carry truth),
    with its share of the run's engine work."""
    if not entries:
        return "evaluator audit: none (run with the audit to have one)\n"
    e0 = entries[0]
    truth = any("truth_auc" in e for e in entries)
    pool = f" ({len(task.good)} good, {len(task.bad)} bad)" if task is not None else ""
    lines = [
        f"evaluator audit: {e0['folds']}-fold cross-validation over the task's pool{pool}, "
        f"{max(e['draws'] for e in entries)} demo draw(s); AUC = how well each score (mean over the draws) "
        f"separates held-out good from bad pool answers (0.5 = chance)"
        + ("; truth AUC = the same on the candidates, against their own truth" if truth else ""),
        f"{'method':<11} {'measure':<11} {'AUC [95% CI]':<19} {'draws':<17} {'label_auc':>9}  "
        + (f"{'truth AUC [95% CI]':<19} " if truth else "")
        + "verdict",
    ]
    for e in entries:
        if e["verdict"] == "skipped":
            lines.append(f"{e['method']:<11} skipped: {e.get('note', '')}")
            continue
        draws = " ".join(_num(a) for a in e.get("auc_draws", [])) if e.get("draws", 1) > 1 else ""
        reason = marked(e)
        mark = f" {mark_symbol(reason)}" if reason else ""
        tcol = ""
        if truth:
            tcol = (f"{_num(e['truth_auc'])} {_ci(e['truth_ci'])}" if "truth_auc" in e else "-").ljust(19) + " "
        lines.append(
            f"{e['method']:<11} {measure_name(e['method'], e['measure']):<11} {_num(e['auc'])} {_ci(e['ci'])}".ljust(44)
            + f"{draws:<17} {_num(e.get('label_auc')):>9}  "
            + tcol
            + e["verdict"]
            + (" (follows the label)" if e.get("label_bias") else "")
            + mark
        )
    if any(e.get("label_bias") for e in entries):
        lines.append("  label_auc far from 0.5: that score tracks which label the answer is, not whether it is right")
    note = next((e["fold_note"] for e in entries if e.get("fold_note")), None)
    if note:
        lines.append(f"  note: {note}")
    if truth:
        lines.append("  truth AUC: candidates' truth > 0.5 right, < 0.5 wrong; CI over the draws and the questions")
    if stats:
        lines.append(
            f"  audit cost: {stats['audit_tokens']:,} of {stats['total_tokens']:,} tokens computed "
            f"({stats['token_share']:.0%}), {stats['audit_seconds']:.1f} of {stats['total_seconds']:.1f} s "
            f"({stats['time_share']:.0%})"
        )
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
    return {
        "audit_tokens": a_tok,
        "total_tokens": a_tok + r_tok,
        "token_share": a_tok / max(a_tok + r_tok, 1),
        "audit_seconds": a_sec,
        "total_seconds": a_sec + r_sec,
        "time_share": a_sec / max(a_sec + r_sec, 1e-9),
    }


def warnings(entries: list[dict]) -> list[str]:
    """One `warning:` line per measure that is not plain reliable (what was measured, and what it means), and one
    per measure whose pool audit and truth AUC disagree."""
    out = []
    for e in entries:
        if e["verdict"] == "skipped":
            continue
        name = f"{e['method']} {measure_name(e['method'], e['measure'])}"
        n = e.get("n", "the")
        figure = f"audit AUC {_num(e['auc'])} {_ci(e['ci'])}"
        what = {
            "constant": f"constant: it gave every one of {n} pool answers the same score, so it cannot rank; its "
            f"leaderboard rows (marked !) are not evidence",
            "at chance": f"no evidence that it tells right from wrong on {n} pool answers ({figure}, the CI "
            f"includes 0.5); its leaderboard rows (marked !) are not evidence",
            "inverted": f"it scores the pool's wrong answers above its right ones ({figure}, below 0.5 on {n} pool "
            f"answers); its leaderboard ranking (marked !) is likely reversed",
            "weak": f"weak: some evidence that it tells right from wrong on {n} pool answers ({figure}), below the "
            f"{RELIABLE} a ranking needs; its rows are marked ? and it is not the headline",
            "unscored": "unscored: too few pool answers got a score to audit it; its rows are marked !",
        }.get(e["verdict"])
        if what:
            out.append(f"warning: {name}: {what}")
        if e.get("label_bias"):
            out.append(
                f"warning: {name}: its score follows the answer's label (label AUC {_num(e['label_auc'])}): "
                f"it may rate one label higher whatever the answer's correctness, and the pool's labels need "
                f"not go with correctness as the candidates' do; marked ?, never the headline"
            )
        if e.get("agrees") is False:
            out.append(
                f"warning: {name}: the pool audit ({figure}) and the candidates' own truth (AUC "
                f"{_num(e['truth_auc'])} {_ci(e['truth_ci'])}) disagree, their CIs apart: the measure does "
                f"not separate the pool's answers as it does the candidates' (the pool's right and wrong "
                f"answers are not like the candidates', or the CIs miss); on this run trust the truth, and "
                f"make the pool's answers like the ones being scored"
            )
    return out
