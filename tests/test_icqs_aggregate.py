"""Aggregation: bootstrap CIs (hand-checked small cases), ranks, rank correlations, MAE / cross-entropy."""

import math

import numpy as np
import pytest

from icqs.aggregate import bootstrap_ci, distribution_metrics, format_leaderboards, leaderboard, rank_correlation, ranks


def test_bootstrap_ci_hand_checked():
    # two values 0 and 1: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4 -> 2.5% and 97.5%
    # percentiles are 0 and 1
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)
    assert all(math.isnan(v) for v in bootstrap_ci([0.3]))


def test_bootstrap_ci_matches_normal_theory_on_a_large_sample():
    x = np.random.default_rng(1).normal(0.5, 0.2, size=400)
    low, high = bootstrap_ci(x, n_resamples=4000)
    se = x.std(ddof=1) / np.sqrt(len(x))
    assert low == pytest.approx(x.mean() - 1.96 * se, abs=0.25 * se)
    assert high == pytest.approx(x.mean() + 1.96 * se, abs=0.25 * se)


def test_ranks_and_correlations():
    assert ranks({"a": 0.9, "b": 0.1, "c": 0.5}) == {"a": 1.0, "b": 3.0, "c": 2.0}
    assert ranks({"a": 0.5, "b": 0.5, "c": 0.1}) == {"a": 1, "b": 1, "c": 3}  # integers: ties share the best
    truth = {"a": 1.0, "b": 0.8, "c": 0.6, "d": 0.4}
    assert rank_correlation({"a": 4, "b": 3, "c": 2, "d": 1}, truth) == {"spearman": 1.0, "kendall": 1.0}
    rc = rank_correlation({"a": 1, "b": 2, "c": 4, "d": 3}, truth)
    # predicted ranks 4, 3, 1, 2 vs true 1, 2, 3, 4: sum d^2 = 9 + 1 + 4 + 4 = 18, Spearman 1 - 6 * 18 / (4 * 15)
    # = -0.8; only the pair (c, d) is concordant: Kendall (1 - 5) / 6
    assert rc["spearman"] == pytest.approx(-0.8) and rc["kendall"] == pytest.approx(-2 / 3)


def test_distribution_metrics_hand_checked():
    phi = [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]
    hat = [[0.2, 0.4, 0.4], [0.5, 0.25, 0.25]]
    m = distribution_metrics(phi, hat)
    assert m["mae"] == pytest.approx((0.2 + 1.0) / 2)
    ce1 = -(0.2 * np.log(0.2) + 0.3 * np.log(0.4) + 0.5 * np.log(0.4))
    assert m["cross_entropy"] == pytest.approx((ce1 - np.log(0.5)) / 2)


def test_leaderboard_orders_models_and_counts_unscored():
    rows = []
    for model, scores, truth in (("a", [1.0, 0.5, None], 1.0), ("b", [0.0, 0.5, 0.25], 0.0)):
        for i, s in enumerate(scores):
            rows.append(
                {
                    "method": "judge",
                    "model": model,
                    "id": f"{model}{i}",
                    "truth": truth,
                    "score": 0.9 if model == "a" else 0.1,
                    "generated_score": s,
                }
            )
    b = leaderboard(rows, "judge")
    gen = b["measures"]["generated_score"]
    assert [m["model"] for m in gen["models"]] == ["a", "b"]
    assert gen["models"][0]["mean"] == 0.75 and gen["models"][0]["unscored"] == 1 and gen["models"][0]["n"] == 2
    assert gen["models"][1]["mean"] == pytest.approx(0.25)
    assert b["truth_rank"] == {"a": 1.0, "b": 2.0}
    text = format_leaderboards([b])
    assert "1 candidates unscored" in text and "a " in text


def test_leaderboard_compares_the_posterior_with_distributional_truths():
    rows = [
        {
            "method": "icqs",
            "model": "m",
            "id": "1",
            "score": 1.0,
            "expected": 0.7,
            "posterior": [0.2, 0.4, 0.4],
            "truth_dist": [0.2, 0.3, 0.5],
        },
        {
            "method": "icqs",
            "model": "m",
            "id": "2",
            "score": 0.0,
            "expected": 0.4,
            "posterior": [0.5, 0.25, 0.25],
            "truth_dist": [1.0, 0.0, 0.0],
        },
    ]
    b = leaderboard(rows, "icqs")
    assert b["distribution"]["mae"] == pytest.approx(0.6)
    assert "posterior vs truth_dist: MAE 0.600" in format_leaderboards([b])
