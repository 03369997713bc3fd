"""From per-candidate scores to leaderboards: per-model mean with a bootstrap 95% CI, the ranking, Spearman and
Kendall correlations with the truth ranking, and MAE / cross-entropy against distributional truths (ChaosNLI).

Score rows are dicts with at least `model`, `method` and the measures (`score`; `expected` for the ICQS methods;
`generated_score` for the judge, None when unscored) and optionally `truth` and `truth_dist` / `posterior`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from .methods import METHODS, measure_name
from .run import format_stats


def bootstrap_ci(values, level: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (NaN for fewer than two values)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return math.nan, math.nan
    res = stats.bootstrap(
        (values,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def ranks(values: dict) -> dict:
    """Rank 1 = highest value; tied models share the best of their ranks (1, 1, 3)."""
    names = list(values)
    r = stats.rankdata([-values[n] for n in names], method="min")
    return {n: int(k) for n, k in zip(names, r)}


def two_level_bootstrap_ci(
    table: np.ndarray, level: float = 0.95, rounds: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile CI of a model's mean score over demo draws and questions: `table` [draws, questions] (NaN:
    unscored); each round resamples the draws, then the questions, and takes the mean."""
    D, Q = table.shape
    if Q < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    d = rng.integers(0, D, size=(rounds, D))
    q = rng.integers(0, Q, size=(rounds, Q))
    with np.errstate(all="ignore"):
        means = np.nanmean(table[d[:, :, None], q[:, None, :]].reshape(rounds, -1), axis=1)
    tail = (1 - level) / 2
    return float(np.nanquantile(means, tail)), float(np.nanquantile(means, 1 - tail))


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
    return {
        "mae": float(np.abs(phi - phi_hat).sum(axis=1).mean()),
        "cross_entropy": float(-(phi * np.log(np.clip(phi_hat, eps, None))).sum(axis=1).mean()),
    }


def model_truth(rows: list[dict]) -> dict:
    """Per-model mean of the candidates' `truth` (models without any truth left out)."""
    by_model: dict[str, list] = {}
    for r in rows:
        if r.get("truth") is not None:
            by_model.setdefault(r["model"], []).append(r["truth"])
    return {m: float(np.mean(v)) for m, v in by_model.items()}


def rank_shares(tables: dict) -> dict:
    """Each candidate's score replaced by its rank share within its draw: the fraction of all candidates (every
    model's) it scores above, ties half, in [0, 1]. A model's mean of it is the chance that one of its answers
    outranks a random answer: the candidate-level ranking the audit's AUC checks, read per model, and not swayed
    by a few answers' extreme log-likelihoods as a raw mean is."""
    models = list(tables)
    stacked = np.concatenate([tables[m] for m in models], axis=1)  # [draws, all candidates]
    out = np.full(stacked.shape, np.nan)
    for d, row in enumerate(stacked):
        ok = ~np.isnan(row)
        if ok.sum() > 1:
            out[d, ok] = (stats.rankdata(row[ok]) - 1) / (ok.sum() - 1)
    sizes = np.cumsum([0] + [tables[m].shape[1] for m in models])
    return {m: out[:, a:b] for m, a, b in zip(models, sizes[:-1], sizes[1:])}


def leaderboard(rows: list[dict], method: str, seed: int = 0) -> dict:
    """One method's leaderboard: for each measure, per model n, mean, 95% CI, rank, and the correlations with the
    truth ranking; `unscored` counts the candidates whose measure is None; `distribution` holds MAE / CE when there
    are distributional truths. With several demo draws (rows with `draw`), a candidate's score is its mean over
    the draws, the CI is a two-level bootstrap over draws and questions (`ci_questions`: over questions only),
    each model has its mean per draw (`draw_means`), and `draws` holds the spread between draws and the ranking
    of each draw (`flips`: it is not the same in every draw)."""
    rows = [r for r in rows if r["method"] == method]
    draws = sorted({r.get("draw", 0) for r in rows})
    first = [r for r in rows if r.get("draw", 0) == draws[0]] if rows else []
    truth = model_truth(first)
    out = {
        "method": method,
        "truth": truth,
        "truth_rank": ranks(truth) if truth else {},
        "measures": {},
        "n_draws": len(draws),
    }
    ids = {m: [r["id"] for r in first if r["model"] == m] for m in dict.fromkeys(r["model"] for r in first)}
    for measure in [m for m in METHODS[method].measures if any(m in r for r in rows)]:  # calibrated: when computed
        value = {(r.get("draw", 0), r["id"]): r.get(measure) for r in rows}
        tables = {
            m: np.array(
                [[np.nan if value.get((d, i)) is None else value[(d, i)] for i in cid] for d in draws], dtype=np.float64
            )
            for m, cid in ids.items()
        }
        if METHODS[method].by_rank:
            tables = rank_shares(tables)
        with np.errstate(all="ignore"):
            per_cand = {m: t.mean(axis=0) for m, t in tables.items()}  # NaN where some draw left it unscored
            draw_means = {
                m: [float(np.nanmean(row)) if not np.isnan(row).all() else math.nan for row in t]
                for m, t in tables.items()
            }
        means = {m: float(np.nanmean(v)) if not np.isnan(v).all() else math.nan for m, v in per_cand.items()}
        ranked = ranks({m: v for m, v in means.items() if not math.isnan(v)})
        models = []
        for m in sorted(ids, key=lambda m: (ranked.get(m, math.inf), m)):
            scored = per_cand[m][~np.isnan(per_cand[m])]
            q_low, q_high = bootstrap_ci(scored, seed=seed)
            low, high = (q_low, q_high) if len(draws) == 1 else two_level_bootstrap_ci(tables[m], seed=seed)
            models.append(
                {
                    "model": m,
                    "n": int(len(scored)),
                    "unscored": int(np.isnan(per_cand[m]).sum()),
                    "mean": means[m],
                    "ci_low": low,
                    "ci_high": high,
                    "ci_questions": [q_low, q_high],
                    "draw_means": draw_means[m],
                    "rank": ranked.get(m, math.nan),
                }
            )
        entry = {"models": models, **rank_correlation(means, truth)}
        if len(draws) > 1:
            draw_ranks = [
                ranks({m: dm[k] for m, dm in draw_means.items() if not math.isnan(dm[k])}) for k in range(len(draws))
            ]
            order = [tuple(sorted(r, key=lambda m: (r[m], m))) for r in draw_ranks]
            spread = {m: float(np.nanmax(dm) - np.nanmin(dm)) for m, dm in draw_means.items() if not np.isnan(dm).all()}
            entry["draws"] = {
                "n": len(draws),
                "spread": spread,
                "max_spread": max(spread.values(), default=0.0),
                "ranks": draw_ranks,
                "flips": len(set(order)) > 1,
            }
        out["measures"][measure] = entry
    dist_rows = [r for r in first if r.get("truth_dist") is not None and r.get("posterior") is not None]
    if dist_rows:
        out["distribution"] = distribution_metrics(
            [r["truth_dist"] for r in dist_rows], [r["posterior"] for r in dist_rows]
        )
    return out


def mark_symbol(reason: str) -> str:
    """A marked measure's symbol: `?` for a weak or label-following one, `!` for one that is no evidence (at chance,
    inverted, constant, unscored)."""
    return "?" if reason in ("weak", "label-following") else "!"


def _cell(m: dict, mark: str = "") -> str:
    if math.isnan(m["mean"]):
        return f"{'-':>22}"
    ci = "" if math.isnan(m["ci_low"]) else f"[{m['ci_low']:.2f},{m['ci_high']:.2f}]"
    return f"{m['mean']:6.3f} {ci:>11} #{m['rank']:<2}{mark}"


def format_leaderboards(boards: list[dict], title: str = "", flags: dict | None = None) -> str:
    """Plain-text leaderboards: per method, models in predicted order, each measure's mean, 95% CI and rank, the
    truth and the true rank beside them, and the rank correlations with the truth. `flags`: {(method, measure):
    reason} of the measures the audit marks (icqs.audit.flagged): their cells carry `!` (no evidence) or `?` (weak,
    or following the label)."""
    flags = flags or {}
    lines = [f"ICQS leaderboard{': ' + title if title else ''}"]
    for b in boards:
        measures = list(b["measures"])
        first = b["measures"][measures[0]]["models"]
        cells = {meas: {m["model"]: m for m in b["measures"][meas]["models"]} for meas in measures}
        width = max(8, *(len(m["model"]) for m in first))
        draws = b.get("n_draws", 1)
        name = {x: measure_name(b["method"], x) for x in measures}
        mark = {x: mark_symbol(flags[(b["method"], x)]) for x in measures if (b["method"], x) in flags}
        lines += [
            "",
            f"== {b['method']}: {METHODS[b['method']].title}",
            f"{'model':<{width}} {'n':>4} "
            + " ".join(f"{name[x] + ' [95% CI] rank':>24}" for x in measures)
            + ("   truth  true rank" if b["truth"] else ""),
        ]
        for m in first:
            row = f"{m['model']:<{width}} {m['n']:>4} " + " ".join(
                f"{_cell(cells[x][m['model']], mark.get(x, ' ')):>24}" for x in measures
            )
            if b["truth"]:
                t = b["truth"].get(m["model"])
                row += f"  {t:6.3f}  #{b['truth_rank'][m['model']]:g}" if t is not None else "       -"
            lines.append(row)
        for x in measures:
            reason = flags.get((b["method"], x))
            if reason:
                lines.append(
                    f"  {mark_symbol(reason)} {name[x]}: the audit found this measure {reason} on the task's "
                    f"own pool; its ranking is "
                    + ("weak evidence at best" if mark_symbol(reason) == "?" else "not evidence")
                    + " (`icqs audit`)"
                )
        if draws > 1:
            lines.append(f"  CIs over {draws} demo draws and the questions (two-level bootstrap)")
        for x in measures:
            unscored = sum(m["unscored"] for m in b["measures"][x]["models"])
            if unscored:
                lines.append(f"  {name[x]}: {unscored} candidates unscored (no parsable rating)")
            if b["truth"]:
                s = b["measures"][x]
                lines.append(
                    f"  {name[x]} vs truth ranking: Spearman {_signed(s['spearman'])}, Kendall {_signed(s['kendall'])}"
                )
            d = b["measures"][x].get("draws")
            if d:
                worst = max(d["spread"], key=d["spread"].get) if d["spread"] else "-"
                lines.append(
                    f"  {name[x]} between draws: a model's mean moves by up to "
                    f"{d['max_spread']:.3f} ({worst}); "
                    + (
                        "the ranking FLIPS between draws: "
                        + " | ".join(" > ".join(sorted(r, key=lambda m: (r[m], m))) for r in d["ranks"])
                        if d["flips"]
                        else "the same ranking in every draw"
                    )
                )
        if "distribution" in b:
            d = b["distribution"]
            lines.append(f"  posterior vs truth_dist: MAE {d['mae']:.3f}, cross-entropy {d['cross_entropy']:.3f}")
        if "engine_stats" in b:
            lines.append(f"  engine: {format_stats(b['engine_stats'])}")
    return "\n".join(lines) + "\n"


def _signed(v: float) -> str:
    """A correlation with its sign, or `-` when there is none (one model, or all tied): nan is shown one way."""
    return "-" if v is None or math.isnan(v) else f"{v:+.3f}"
