"""From a candidate's log-likelihood curve over the ratios to its ICQS scores.

The paper's score is the argmax: the ratio r_k whose demo sets make the answer most likely (Eq. 3, Algorithm 1
with its `argmin` typo read as argmax). Beyond the paper, the curve is also read as a posterior over the ratios,
p(r_j | z) = softmax_j(l_j) under a uniform prior, giving a continuous expected quality E[r] and an equal-tailed
90% credible interval on the ratio grid.
"""

from __future__ import annotations

import numpy as np


def epistemic_curve(loglik: np.ndarray) -> np.ndarray:
    """Mean log-likelihood over the L demo sets of each ratio (Algorithm 2 line 10): [..., L, M+1] -> [..., M+1]."""
    return np.asarray(loglik, dtype=np.float64).mean(axis=-2)


def argmax_ratio(curve: np.ndarray, ratios) -> np.ndarray:
    """The ratio with the highest log-likelihood. [..., M+1] -> [...]. Exact ties, which arise when two ratios
    draw the same demo set (coupled sets at neighbouring ratios often do), give the mean of the tied ratios rather
    than favouring either end."""
    curve = np.asarray(curve, dtype=np.float64)
    best = curve == curve.max(axis=-1, keepdims=True)
    return (best * np.asarray(ratios, dtype=np.float64)).sum(axis=-1) / best.sum(axis=-1)


def posterior(curve: np.ndarray) -> np.ndarray:
    """p(r_j | z) with a uniform prior: the softmax of the log-likelihoods over the ratios."""
    from scipy.special import softmax  # here: `icqs --help` and the GPU check's job builders do not need scipy

    return softmax(np.asarray(curve, dtype=np.float64), axis=-1)


def expected_ratio(post: np.ndarray, ratios) -> np.ndarray:
    """E[r] under the posterior."""
    return post @ np.asarray(ratios, dtype=np.float64)


def credible_interval(post: np.ndarray, ratios, mass: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Equal-tailed interval on the ratio grid: the smallest r_j whose posterior CDF reaches (1 - mass) / 2, and the
    smallest whose CDF reaches (1 + mass) / 2."""
    ratios = np.asarray(ratios, dtype=np.float64)
    cdf = np.cumsum(np.asarray(post, dtype=np.float64), axis=-1)
    tail = (1.0 - mass) / 2
    eps = 1e-12  # a CDF that reaches a level only up to rounding still counts as reaching it
    low = np.argmax(cdf >= tail - eps, axis=-1)
    high = np.argmax(cdf >= 1.0 - tail - eps, axis=-1)
    return ratios[low], ratios[high]


def summarize(curve: np.ndarray, ratios, mass: float = 0.9) -> dict:
    """All of one candidate's ICQS numbers from its curve [M+1]."""
    post = posterior(curve)
    low, high = credible_interval(post, ratios, mass)
    return {
        "score": float(argmax_ratio(curve, ratios)),
        "expected": float(expected_ratio(post, ratios)),
        "ci_low": float(low),
        "ci_high": float(high),
        "posterior": [float(p) for p in post],
        "curve": [float(v) for v in curve],
    }
