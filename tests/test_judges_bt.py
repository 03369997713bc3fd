"""Bradley-Terry leaderboard: a hand-made battle set with a known order, bootstrap intervals, the rank rule."""

import numpy as np
import pytest

from engine.errors import UserError
from icqs.judges.bradley_terry import fit_bt, interval_ranks, leaderboard


def _battles(strengths, per_pair=60, seed=0):
    rng = np.random.default_rng(seed)
    names = list(strengths)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            p = 1 / (1 + 10 ** ((strengths[b] - strengths[a]) / 400))
            for n in range(per_pair):
                first, second = (a, b) if n % 2 else (b, a)
                a_wins = rng.random() < p
                winner = "tie" if n % 10 == 0 else ("model_a" if (first == a) == a_wins else "model_b")
                out.append((first, second, winner))
    return out


def test_known_order_is_recovered():
    truth = {"strong": 1300, "good": 1100, "fair": 950, "weak": 650}
    scores = fit_bt(_battles(truth))
    assert sorted(scores, key=scores.get, reverse=True) == list(truth)
    assert np.mean(list(scores.values())) == pytest.approx(1000)
    gap = scores["strong"] - scores["weak"]
    assert 450 < gap < 900  # true gap 650 on the Elo scale


def test_leaderboard_intervals_and_ranks():
    truth = {"strong": 1400, "mid": 1000, "weak": 600}
    rows = leaderboard(_battles(truth, per_pair=80), rounds=60, seed=1)
    assert [r["model"] for r in rows] == ["strong", "mid", "weak"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["lower"] <= r["score"] <= r["upper"] and r["battles"] == 160


def test_rank_rule_with_overlapping_intervals():
    board = {
        "a": {"lower": 10, "upper": 20},
        "b": {"lower": 8, "upper": 15},
        "c": {"lower": 0, "upper": 9},
        "d": {"lower": -5, "upper": 5},
    }
    # c: only a's lower (10) is above its upper (9); d: a, b above; b overlaps a -> shares rank 1
    assert interval_ranks(board) == {"a": 1, "b": 1, "c": 2, "d": 3}


def test_one_sided_battles_stay_finite():
    scores = fit_bt([("x", "y", "model_a")] * 5)
    assert np.isfinite(list(scores.values())).all() and scores["x"] > scores["y"]


def test_bad_battles():
    with pytest.raises(UserError):
        fit_bt([("x", "y", "draw")])
    with pytest.raises(UserError):
        fit_bt([("x", "x", "tie")])
