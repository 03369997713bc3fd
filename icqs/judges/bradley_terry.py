"""Leaderboard from pairwise verdicts: a Bradley-Terry fit, bootstrap 95% intervals, and the interval rank rule.

P(a beats b) = 1 / (1 + 10 ** ((s_b - s_a) / 400)), with strengths on the Elo scale (mean 1000). The fit is a
logistic regression without intercept on +1/-1 indicator rows (as in the Chatbot Arena leaderboard); a tie counts
as half a win for each side. Rank = 1 + the number of models whose lower bound is above this model's upper bound.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.linear_model import LogisticRegression

from engine.errors import UserError

SCALE, BASE, INIT = 400.0, 10.0, 1000.0
WINNERS = ("model_a", "model_b", "tie")


def _design(battles: list[tuple[str, str, str]], models: list[str]):
    index = {m: i for i, m in enumerate(models)}
    rows, labels, weights = [], [], []
    for a, b, winner in battles:
        x = np.zeros(len(models))
        x[index[a]], x[index[b]] = 1.0, -1.0
        if winner == "tie":
            rows += [x, x]
            labels += [1, 0]
            weights += [0.5, 0.5]
        else:
            rows.append(x)
            labels.append(1 if winner == "model_a" else 0)
            weights.append(1.0)
    return np.array(rows) * math.log(BASE), np.array(labels), np.array(weights)


def fit_bt(battles: list[tuple[str, str, str]], models: list[str] | None = None) -> dict[str, float]:
    """Bradley-Terry strengths (Elo scale) from battles (model_a, model_b, winner in WINNERS)."""
    for a, b, winner in battles:
        if winner not in WINNERS:
            raise UserError(f"battle winner must be one of {', '.join(WINNERS)}, got {winner!r}")
        if a == b:
            raise UserError(f"a battle needs two different models, got {a!r} twice")
    models = models or sorted({m for a, b, _ in battles for m in (a, b)})
    if len(models) < 2:
        raise UserError("a leaderboard needs battles between at least two models")
    X, y, w = _design(battles, models)
    # Each battle also as seen from the other side (-x, 1 - y): the same likelihood, and both classes present.
    X, y, w = np.vstack([X, -X]), np.concatenate([y, 1 - y]), np.concatenate([w, w])
    # A weak L2 penalty keeps the fit finite when a model wins (or loses) all its battles.
    lr = LogisticRegression(fit_intercept=False, C=1e4, tol=1e-8, max_iter=1000)
    lr.fit(X, y, sample_weight=w)
    coef = lr.coef_[0] * SCALE
    coef = coef - coef.mean() + INIT
    return dict(zip(models, coef.tolist()))


def bootstrap_bt(battles: list[tuple[str, str, str]], rounds: int = 200, seed: int = 0) -> dict[str, dict]:
    """The fit on all battles plus 95% intervals from `rounds` refits on battles resampled with replacement."""
    models = sorted({m for a, b, _ in battles for m in (a, b)})
    point = fit_bt(battles, models)
    rng = np.random.default_rng(seed)
    samples = np.empty((rounds, len(models)))
    for r in range(rounds):
        pick = rng.integers(0, len(battles), len(battles))
        fit = fit_bt([battles[i] for i in pick], models)
        samples[r] = [fit[m] for m in models]
    lo, hi = np.percentile(samples, [2.5, 97.5], axis=0)
    return {m: {"score": point[m], "lower": float(lo[i]), "upper": float(hi[i])} for i, m in enumerate(models)}


def interval_ranks(board: dict[str, dict]) -> dict[str, int]:
    """1 + the number of models whose lower bound is above this model's upper bound."""
    return {m: 1 + sum(o["lower"] > v["upper"] for o in board.values()) for m, v in board.items()}


def leaderboard(battles: list[tuple[str, str, str]], rounds: int = 200, seed: int = 0) -> list[dict]:
    """Rows sorted by score: model, rank, score, lower, upper, battles."""
    board = bootstrap_bt(battles, rounds, seed)
    ranks = interval_ranks(board)
    counts = {m: sum(m in (a, b) for a, b, _ in battles) for m in board}
    rows = [
        {"model": m, "rank": ranks[m], **{k: round(v, 2) for k, v in s.items()}, "battles": counts[m]}
        for m, s in board.items()
    ]
    return sorted(rows, key=lambda r: -r["score"])
