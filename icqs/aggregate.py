"""From per-candidate scores to leaderboards: per-model mean with a bootstrap 95% CI, the ranking, Spearman and
Kendall correlations with the truth ranking, and MAE / cross-entropy against distributional truths (ChaosNLI).

Score rows are dicts with at least `model`, `method` and the measures (`score`; `expected` for the ICQS methods;
`generated_score` for the judge, None when unscored) and optionally `truth` and `truth_dist` / `posterior`.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from .methods import MEASURE_NAMES, METHODS
from .run import format_stats


def bootstrap_ci(values, level: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (NaN for fewer than two values)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return math.nan, math.nan
    res = stats.bootstrap((values,), np.mean, n_resamples=n_resamples, confidence_level=level,
                          method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def ranks(values: dict) -> dict:
    """Rank 1 = highest value; ties share the average rank."""
    names = list(values)
    r = stats.rankdata([-values[n] for n in names])
    return {n: float(k) for n, k in zip(names, r)}


def rank_correlation(predicted: dict, truth: dict) -> dict:
    """Spearman and Kendall correlation of the per-model predicted and true values (models present in both)."""
    common = [m for m in predicted if m in truth and not math.isnan(predicted[m])]
    if len(common) < 2:
        return {"spearman": math.nan, "kendall": math.nan}
    p, t = [predicted[m] for m in common], [truth[m] for m in common]
    if len(set(p)) < 2 or len(set(t)) < 2:
        return {"spearman": math.nan, "kendall": math.nan}
    return {"spearman": float(stats.spearmanr(p, t).statistic), "kendall": float(stats.kendalltau(p, t).statistic)}


def distribution_metrics(truth_dists, predicted_dists, eps: float = 1e-12) -> dict:
    """Mean over candidates of the MAE |phi - phi_hat|_1 and the cross-entropy -sum phi log phi_hat."""
    phi = np.asarray(truth_dists, dtype=np.float64)
    phi_hat = np.asarray(predicted_dists, dtype=np.float64)
    return {"mae": float(np.abs(phi - phi_hat).sum(axis=1).mean()),
            "cross_entropy": float(-(phi * np.log(np.clip(phi_hat, eps, None))).sum(axis=1).mean())}


def model_truth(rows: list[dict]) -> dict:
    """Per-model mean of the candidates' `truth` (models without any truth left out)."""
    by_model: dict[str, list] = {}
    for r in rows:
        if r.get("truth") is not None:
            by_model.setdefault(r["model"], []).append(r["truth"])
    return {m: float(np.mean(v)) for m, v in by_model.items()}


def leaderboard(rows: list[dict], method: str, seed: int = 0) -> dict:
    """One method's leaderboard: for each measure, per model n, mean, 95% CI, rank, and the correlations with the
    truth ranking; `unscored` counts the rows whose measure is None; `distribution` holds MAE / CE when there are
    distributional truths."""
    rows = [r for r in rows if r["method"] == method]
    truth = model_truth(rows)
    out = {"method": method, "truth": truth, "truth_rank": ranks(truth) if truth else {}, "measures": {}}
    for measure in [m for m in METHODS[method].measures if any(m in r for r in rows)]:  # calibrated: when computed
        by_model: dict[str, list] = {}
        unscored: dict[str, int] = {}
        for r in rows:
            by_model.setdefault(r["model"], [])
            unscored.setdefault(r["model"], 0)
            if r.get(measure) is None:
                unscored[r["model"]] += 1
            else:
                by_model[r["model"]].append(r[measure])
        means = {m: float(np.mean(v)) if v else math.nan for m, v in by_model.items()}
        ranked = ranks({m: v for m, v in means.items() if not math.isnan(v)})
        models = []
        for m in sorted(by_model, key=lambda m: (ranked.get(m, math.inf), m)):
            low, high = bootstrap_ci(by_model[m], seed=seed)
            models.append({"model": m, "n": len(by_model[m]), "unscored": unscored[m], "mean": means[m],
                           "ci_low": low, "ci_high": high, "rank": ranked.get(m, math.nan)})
        out["measures"][measure] = {"models": models, **rank_correlation(means, truth)}
    dist_rows = [r for r in rows if r.get("truth_dist") is not None and r.get("posterior") is not None]
    if dist_rows:
        out["distribution"] = distribution_metrics([r["truth_dist"] for r in dist_rows],
                                                   [r["posterior"] for r in dist_rows])
    return out


def _cell(m: dict) -> str:
    if math.isnan(m["mean"]):
        return f"{'-':>22}"
    ci = "" if math.isnan(m["ci_low"]) else f"[{m['ci_low']:.2f},{m['ci_high']:.2f}]"
    return f"{m['mean']:6.3f} {ci:>11} #{m['rank']:<3g}"


def format_leaderboards(boards: list[dict], title: str = "") -> str:
    """Plain-text leaderboards: per method, models in predicted order, each measure's mean, 95% CI and rank, the
    truth and the true rank beside them, and the rank correlations with the truth."""
    lines = [f"ICQS leaderboard{': ' + title if title else ''}"]
    for b in boards:
        measures = list(b["measures"])
        first = b["measures"][measures[0]]["models"]
        cells = {meas: {m["model"]: m for m in b["measures"][meas]["models"]} for meas in measures}
        width = max(8, *(len(m["model"]) for m in first))
        lines += ["", f"== {b['method']}: {METHODS[b['method']].title}",
                  f"{'model':<{width}} {'n':>4} " + " ".join(f"{MEASURE_NAMES[x] + ' [95% CI] rank':>24}"
                                                              for x in measures)
                  + ("   truth  true rank" if b["truth"] else "")]
        for m in first:
            row = f"{m['model']:<{width}} {m['n']:>4} " + " ".join(f"{_cell(cells[x][m['model']]):>24}"
                                                                  for x in measures)
            if b["truth"]:
                t = b["truth"].get(m["model"])
                row += f"  {t:6.3f}  #{b['truth_rank'][m['model']]:g}" if t is not None else "       -"
            lines.append(row)
        for x in measures:
            unscored = sum(m["unscored"] for m in b["measures"][x]["models"])
            if unscored:
                lines.append(f"  {MEASURE_NAMES[x]}: {unscored} candidates unscored (no parsable rating)")
            if b["truth"]:
                s = b["measures"][x]
                lines.append(f"  {MEASURE_NAMES[x]} vs truth ranking: Spearman {s['spearman']:+.3f}, "
                             f"Kendall {s['kendall']:+.3f}")
        if "distribution" in b:
            d = b["distribution"]
            lines.append(f"  posterior vs truth_dist: MAE {d['mae']:.3f}, cross-entropy {d['cross_entropy']:.3f}")
        if "engine_stats" in b:
            lines.append(f"  engine: {format_stats(b['engine_stats'])}")
    return "\n".join(lines) + "\n"
