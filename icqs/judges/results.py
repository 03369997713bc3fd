"""The summaries of a judge run and of a pairwise run, computed from their result logs alone (so `icqs judge`, and
`icqs leaderboard | audit | report DIR` later, say the same), and their tables (icqs.run_tables.Table).

Judge (grades.jsonl + the items): per K the mean expected grade with a 95% bootstrap CI over items (scipy.stats
.bootstrap, each item's grade averaged over the runs first), the grades' agreement with the items' `label` (AUC,
two-level bootstrap CI over runs and items, the score audit's verdict), per model the mean grade with its CI and
rank beside the truth: the share of the model's answers labeled right with its Wilson 95% CI (scipy.stats
.binomtest) and the true rank; the consistency of runs 0 and 1.

Pairwise (verdicts.jsonl): the bias check as measured values beside the values of a judge without bias, the
agreement with the reference `winner` (Wilson CI), the Bradley-Terry leaderboard when every row names its two
models, and the reasons (if any) the bias check gives for distrusting that ranking.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ..aggregate import bootstrap_ci, ranks
from ..audit import auc, two_level_ci, verdict
from ..run_tables import Table, ci, num
from .consistency import consistency_by_k
from .pairwise import decide, summarize_pairwise

CI_ROUNDS = 2000


def mean_ci(values, seed: int = 0) -> list[float] | None:
    """95% percentile-bootstrap CI of the mean (icqs.aggregate.bootstrap_ci), None for fewer than 2 values, the
    value itself where all are equal."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    if np.all(x == x[0]):
        return [float(x[0]), float(x[0])]
    return list(bootstrap_ci(x, n_resamples=CI_ROUNDS, seed=seed))


def share_ci(successes: int, n: int) -> list[float] | None:
    """Wilson 95% CI of a share successes / n (None for n = 0)."""
    if n == 0:
        return None
    interval = stats.binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(interval.low), float(interval.high)]


def _binary(label) -> int | None:
    """A label as 1 / 0 when it is one (True, 1, 1.0, ...), else None (a graded label such as 0.5)."""
    return int(label) if label in (0, 1) else None


def _ranks(values: list[float]) -> list[int]:
    """1 = the largest; equal values share the better rank (icqs.aggregate.ranks over positions)."""
    by_position = ranks(dict(enumerate(values)))
    return [by_position[i] for i in range(len(values))]


# ---- judge ----------------------------------------------------------------------------------------------------------
def judge_summary(items: list[dict], rows: list[dict]) -> dict:
    """The summary of a judge run from its items (id, optional model, label) and grades rows (id, k, run, expected,
    argmax, probs, optional parsed); `warnings` lists the `warning:` lines."""
    by_id = {it["id"]: it for it in items}
    rows = [r for r in rows if r["id"] in by_id]
    ks = sorted({r["k"] for r in rows})
    runs = sorted({r["run"] for r in rows})
    summary = {"items": len(items), "shots": ks, "runs": len(runs), "by_k": [], "by_model": [], "agreement": []}
    warnings = []
    for k in ks:
        part = [r for r in rows if r["k"] == k]
        grade = _per_item(part)  # id -> the mean expected grade over the runs
        entry = {
            "k": k,
            "rows": len(part),
            "items": len(grade),
            "mean_expected": round(float(np.mean(list(grade.values()))), 3),
            "ci": mean_ci(list(grade.values())),
        }
        if "parsed" in part[0]:
            entry["unscored"] = sum(r.get("parsed") is None for r in part)
        summary["by_k"].append(entry)
        summary["by_model"] += _by_model(k, grade, by_id)
        agreement = _agreement(k, part, by_id, runs)
        if agreement:
            summary["agreement"].append(agreement)
            if agreement["verdict"] in ("at chance", "inverted"):
                lo, hi = agreement["ci"]
                warnings.append(
                    f"warning: judge with K={k}: agreement with the reference labels, AUC "
                    f"{agreement['auc']:.2f} [{lo:.2f},{hi:.2f}], is {agreement['verdict']}: its grades "
                    f"are not evidence"
                )
    if 0 in runs and 1 in runs:
        summary["consistency"] = consistency_by_k(
            [r for r in rows if r["run"] == 0], [r for r in rows if r["run"] == 1]
        )
    summary["warnings"] = warnings
    return summary


def _per_item(part: list[dict]) -> dict:
    grades: dict = {}
    for r in part:
        grades.setdefault(r["id"], []).append(r["expected"])
    return {i: float(np.mean(g)) for i, g in grades.items()}


def _by_model(k: int, grade: dict, by_id: dict) -> list[dict]:
    per_model: dict[str, list] = {}
    for i in grade:
        if "model" in by_id[i]:
            per_model.setdefault(by_id[i]["model"], []).append(i)
    if not per_model:
        return []
    models = sorted(per_model, key=lambda m: -np.mean([grade[i] for i in per_model[m]]))
    means = [float(np.mean([grade[i] for i in per_model[m]])) for m in models]
    out = []
    for m, mean, rank in zip(models, means, _ranks(means)):
        ids = per_model[m]
        entry = {
            "k": k,
            "model": m,
            "n": len(ids),
            "mean_expected": round(mean, 3),
            "ci": mean_ci([grade[i] for i in ids]),
            "rank": rank,
        }
        labels = [by_id[i]["label"] for i in ids if "label" in by_id[i]]
        if labels:
            binary = [_binary(v) for v in labels]
            entry["truth"] = round(float(np.mean(labels)), 3)
            entry["truth_n"] = len(labels)
            entry["truth_ci"] = share_ci(sum(binary), len(binary)) if None not in binary else mean_ci(labels)
        out.append(entry)
    truthful = [e for e in out if "truth" in e]
    if len(truthful) == len(out):
        for e, rank in zip(truthful, _ranks([e["truth"] for e in truthful])):
            e["true_rank"] = rank
    return out


def _agreement(k: int, part: list[dict], by_id: dict, runs: list[int]) -> dict | None:
    """AUC of the expected grade for label 1 vs 0 over the items graded in every run (each run a draw of the
    two-level bootstrap), or None with fewer than 2 items of either label."""
    table: dict = {}
    for r in part:
        table.setdefault(r["id"], {})[r["run"]] = r["expected"]
    ids = [i for i, g in table.items() if len(g) == len(runs) and _binary(by_id[i].get("label")) is not None]
    truths = np.array([_binary(by_id[i]["label"]) for i in ids], dtype=int)
    if min((truths == 1).sum(), (truths == 0).sum()) < 2:
        return None
    scores = np.array([[table[i][run] for i in ids] for run in runs])
    value = float(np.mean([auc(s, truths) for s in scores]))
    interval = two_level_ci(scores, truths)
    return {"k": k, "n": len(ids), "auc": value, "ci": list(interval), "verdict": verdict(value, interval)}


def judge_tables(summary: dict) -> list[Table]:
    """Per K (grades, agreement with labels), per model (grade beside truth), and the runs' consistency."""
    audit = judge_audit_tables(summary)
    board = judge_model_table(summary)
    return audit[:1] + ([board] if board else []) + audit[1:]


def judge_audit_tables(summary: dict) -> list[Table]:
    """Per K: the grades and their agreement with the labels; the consistency of runs 0 and 1."""
    agreement = {a["k"]: a for a in summary["agreement"]}
    labeled = bool(agreement)
    unscored = any("unscored" in e for e in summary["by_k"])
    cols = (
        ["K", "items", "mean grade", "95% CI"]
        + (["unscored"] if unscored else [])
        + (["AUC vs labels", "95% CI", "verdict"] if labeled else [])
    )
    rows, flags = [], set()
    for e in summary["by_k"]:
        row = [str(e["k"]), str(e["items"]), num(e["mean_expected"]), ci(e["ci"])]
        row += [str(e.get("unscored", "-"))] if unscored else []
        a = agreement.get(e["k"])
        if labeled:
            row += [num(a["auc"]), ci(a["ci"]), a["verdict"]] if a else ["-", "-", "-"]
            if a and a["verdict"] in ("at chance", "inverted"):
                flags.add(len(rows))
        rows.append(tuple(row))
    runs = summary.get("runs", 1)
    over = f", averaged over the {runs} runs" if runs > 1 else ""
    notes = [
        f"mean grade: the expected grade 1-10 (from the rating tokens' probabilities){over}; 95% CI: bootstrap "
        f"over items"
    ]
    if labeled:
        notes.append(
            "AUC vs labels: the chance that an answer labeled right gets a higher grade than one labeled "
            "wrong (0.5 = chance); CI: bootstrap over runs and items"
        )
    else:
        notes.append(
            "no reference labels (a `label` field, 1 right / 0 wrong, on at least 2 rows of each): the "
            "grades are not checked against any truth"
        )
    if flags:
        notes.append("! rows marked ! : agreement with the labels at chance or inverted, the grades are not evidence")
    tables = [Table("judge: grades per number of demos (K)", tuple(cols), tuple(rows), tuple(notes), frozenset(flags))]
    if summary.get("consistency"):
        tables.append(_consistency_table(summary["consistency"]))
    return tables


def judge_model_table(summary: dict) -> Table | None:
    """Per K and model: the mean grade with its CI and rank beside the truth (None: the rows name no models)."""
    models = summary["by_model"]
    if not models:
        return None
    agreement = {a["k"]: a for a in summary["agreement"]}
    truth = any("truth" in m for m in models)
    cols = ["K", "model", "n", "mean grade", "95% CI", "rank"] + (["truth", "95% CI", "true rank"] if truth else [])
    rows, flags = [], set()
    for m in models:
        row = [str(m["k"]), m["model"], str(m["n"]), num(m["mean_expected"]), ci(m["ci"]), f"#{m['rank']}"]
        if truth:
            row += [num(m.get("truth")), ci(m.get("truth_ci")), f"#{m['true_rank']}" if "true_rank" in m else "-"]
        a = agreement.get(m["k"])
        if a and a["verdict"] in ("at chance", "inverted"):
            flags.add(len(rows))
        rows.append(tuple(row))
    notes = []
    if truth:
        notes.append("truth: the share of the model's answers labeled right (Wilson 95% CI); rank 1 = best")
        for k in sorted({m["k"] for m in models}):
            ms = [m for m in models if m["k"] == k and "true_rank" in m]
            if len(ms) >= 3 and len({m["mean_expected"] for m in ms}) > 1 and len({m["truth"] for m in ms}) > 1:
                rho = stats.spearmanr([m["mean_expected"] for m in ms], [m["truth"] for m in ms]).statistic
                notes.append(
                    f"K={k}: Spearman between the models' mean grades and their truth: "
                    f"{'-' if math.isnan(rho) else f'{rho:+.2f}'}"
                )
    if flags:
        notes.append(
            "! rows marked ! are ranked by a judge whose agreement with the labels is at chance or "
            "inverted: that ranking is not evidence"
        )
    return Table(
        "judge: per model (rank 1 = the highest mean grade)", tuple(cols), tuple(rows), tuple(notes), frozenset(flags)
    )


def _consistency_table(rows: list[dict]) -> Table:
    cols = ["K", "items", "same argmax", "within 1", "sampled same", "mean |grade gap|"]
    body = [
        (
            str(r["k"]),
            str(r["items"]),
            num(r.get("logprob_exact")),
            num(r.get("logprob_within1")),
            num(r.get("sampled_exact")),
            num(r.get("expected_gap")),
        )
        for r in rows
    ]
    return Table(
        "judge: consistency of runs 0 and 1 (independent demo draws)",
        tuple(cols),
        tuple(body),
        (
            "same argmax / within 1: the most likely grades agree exactly / within 1; sampled same: the chance "
            "that two grades sampled from the two runs agree",
        ),
    )


# ---- pairwise -------------------------------------------------------------------------------------------------------
# Each bias measure: its key in bias_report, its name, the value of a judge without bias (None: no ideal value).
CHECKS = (
    ("position_flip_rate", "verdict changes when the answers swap places", 0.0),
    ("symbol_flip_rate", "verdict changes when the symbols A and B swap", 0.0),
    ("order_flip_rate", "verdict changes when both swap", 0.0),
    ("first_position_share", "share of decisive verdicts for the answer shown first", 0.5),
    ("symbol_A_share", "share of decisive verdicts for the symbol A", 0.5),
    ("tie_share", "share of tie verdicts", None),
)
BIASED = 0.5  # a flip rate at or above this: the verdict follows the layout in most swaps
TIES_DOMINATE = 0.5  # a tie share at or above this: the ranking says little


def pairwise_summary(rows: list[dict], bootstrap: int = 200, seed: int = 0) -> dict:
    """summarize_pairwise, the bias check (measured beside ideal), the agreement with the reference winner, the
    Bradley-Terry leaderboard (every row names model_a and model_b) and `distrusted`: why the bias check distrusts
    the ranking (empty: it does not); `warnings` lists the `warning:` lines."""
    summary = summarize_pairwise(rows)
    bias = summary["logprob"]["bias"]
    checks = [
        {
            "measure": key,
            "what": what,
            "measured": bias.get(key),
            "ideal": ideal,
            **({"generated": summary["generated"]["bias_on_fully_parsed"].get(key)} if "generated" in summary else {}),
        }
        for key, what, ideal in CHECKS
    ]
    warnings, distrusted = [], []
    if bias.get("pairs") and bias["tie_share"] >= TIES_DOMINATE:
        warnings.append(
            f"warning: ties are {bias['tie_share']:.0%} of the verdicts: the ranking says little; use "
            f"--no-tie for two-way verdicts, or --rubric to say what makes an answer better"
        )
        distrusted.append(f"ties are {bias['tie_share']:.0%} of the verdicts")
    for name in ("position", "symbol"):
        rate = bias.get(f"{name}_flip_rate")
        if rate is not None and rate >= BIASED:
            warnings.append(
                f"warning: the verdict changes with the {name} of the answers in {rate:.0%} of the "
                f"swaps: this judge is biased"
            )
            distrusted.append(f"the verdict follows the answers' {name} in {rate:.0%} of the swaps")
    agreement = None
    decisive = [r for r in rows if r.get("winner") in ("model_a", "model_b")]  # a reference tie has no right side
    if decisive:
        right = sum(decide(r["aggregate"], decisive=True) == r["winner"] for r in decisive)
        agreement = {"n": len(decisive), "accuracy": right / len(decisive), "ci": share_ci(right, len(decisive))}
        if agreement["ci"][1] < 0.5:
            warnings.append(
                f"warning: the judge disagrees with the reference winner in most pairs "
                f"(agreement {agreement['accuracy']:.2f}, 95% CI {ci(agreement['ci'])}): its verdicts "
                f"are inverted"
            )
            distrusted.append("its verdicts disagree with the reference winner in most pairs")
    summary["audit"] = {"checks": checks, "agreement": agreement, "warnings": warnings}
    if rows and all("model_a" in r and "model_b" in r for r in rows):
        from .bradley_terry import leaderboard

        battles = [(r["model_a"], r["model_b"], r["verdict"]) for r in rows]
        summary["leaderboard"] = leaderboard(battles, rounds=bootstrap, seed=seed)
        summary["leaderboard_bootstrap"] = bootstrap
    summary["distrusted"] = distrusted
    summary["warnings"] = warnings
    return summary


def pairwise_audit_table(summary: dict) -> Table:
    """The bias check: each measure as measured beside its value for a judge without bias."""
    checks = summary["audit"]["checks"]
    generated = any("generated" in c for c in checks)
    cols = ["check", "measured"] + (["measured (generated)"] if generated else []) + ["without bias", "what it is"]
    rows, flags = [], set()
    for c in checks:
        if c["measure"].endswith("flip_rate") and c["measured"] is not None and c["measured"] >= BIASED:
            flags.add(len(rows))
        if c["measure"] == "tie_share" and c["measured"] is not None and c["measured"] >= TIES_DOMINATE:
            flags.add(len(rows))
        rows.append(
            (
                c["measure"].replace("_", " "),
                num(c["measured"]),
                *([num(c.get("generated"))] if generated else []),
                "-" if c["ideal"] is None else num(c["ideal"]),
                c["what"],
            )
        )
    pairs = summary["logprob"]["bias"].get("pairs", 0)
    notes = [
        "measured on the verdicts read from the [[A]]/[[B]]/[[C]] log-probs; 'without bias' is what a judge "
        "that ignores the layout would show"
    ]
    a = summary["audit"]["agreement"]
    if a:
        notes.append(
            f"agreement with the reference winner: {num(a['accuracy'])} of the {a['n']} pairs whose "
            f"reference names one (the judge's tie option ignored), 95% CI {ci(a['ci'])} (a perfect judge: "
            f"1.00)"
        )
    if flags:
        notes.append(
            "! rows marked ! : far from a judge without bias (flips in half the swaps or more, or mostly "
            "ties): the ranking is not evidence"
        )
    return Table(
        f"pairwise bias check: {pairs} pairs x 4 prompts (answer order x verdict symbols swapped)",
        tuple(cols),
        tuple(rows),
        tuple(notes),
        frozenset(flags),
    )


def pairwise_leaderboard_table(summary: dict) -> Table | None:
    board = summary.get("leaderboard")
    if not board:
        return None
    distrusted = summary.get("distrusted", [])
    rows = tuple(
        (f"#{r['rank']}", r["model"], f"{r['score']:.1f}", f"[{r['lower']:.1f}, {r['upper']:.1f}]", str(r["battles"]))
        for r in board
    )
    rounds = summary.get("leaderboard_bootstrap", "?")
    notes = [
        f"Bradley-Terry strengths on the Elo scale (mean 1000), 95% CI from {rounds} bootstrap rounds; rank: "
        f"1 + the models whose CI lies wholly above"
    ]
    if distrusted:
        notes.append(
            "! DISTRUSTED RANKING: the judge's own bias check failed ("
            + "; ".join(distrusted)
            + "): this order is not evidence of which model is better"
        )
    title = "pairwise leaderboard" + (" (! distrusted: see the bias check)" if distrusted else "")
    return Table(
        title,
        ("rank", "model", "score", "95% CI", "battles"),
        rows,
        tuple(notes),
        frozenset(range(len(rows))) if distrusted else frozenset(),
    )


def pairwise_tables(summary: dict) -> list[Table]:
    """The bias check, then the leaderboard (when the rows name their models)."""
    board = pairwise_leaderboard_table(summary)
    return [pairwise_audit_table(summary)] + ([board] if board else [])
