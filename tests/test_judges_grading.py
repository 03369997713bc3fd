"""Single grading pieces without a model: rating summaries, demo draws, consistency between two runs."""

import numpy as np
import pytest

from icqs.judges.consistency import agreement, consistency_by_k, sampled_agreement
from icqs.judges.grading import rating_options, summarize
from icqs.judges.prompts import Demo
from icqs.judges.reinforced import demo_drawer, draw


def test_rating_options_are_not_prefixes_of_each_other():
    opts = rating_options()
    assert len(opts) == 10 and opts[0] == '1"' and opts[-1] == '10"'
    assert not any(a != b and b.startswith(a) for a in opts for b in opts)


def test_summarize_distribution():
    p = np.zeros(10)
    p[[6, 7]] = [0.25, 0.75]  # ratings 7 and 8
    s = summarize(p)
    assert s["argmax"] == 8 and s["expected"] == pytest.approx(7.75)


DEMOS = {f"d{i}": Demo(f"q{i}", f"r{i}", f"s{i}") for i in range(12)}


def test_draws_are_seeded_permutations():
    one, again, other = draw(DEMOS, 1), draw(DEMOS, 1), draw(DEMOS, 2)
    assert one == again and one != other and sorted(d.question for d in one) == sorted(d.question for d in other)
    assert DEMOS["d3"] not in draw(DEMOS, 1, exclude="d3")


def test_shared_draw_skips_the_graded_item_and_stays_nested():
    drawer = demo_drawer(DEMOS, seed=0, per_item=False, limit=5)
    outside = drawer({"id": "new"})
    assert len(outside) == 5
    inside_id = next(i for i, d in DEMOS.items() if d is outside[2])
    mine = drawer({"id": inside_id})
    assert DEMOS[inside_id] not in mine and len(mine) == 5 and mine[:2] == outside[:2]
    per_item = demo_drawer(DEMOS, seed=0, per_item=True, limit=5)
    assert per_item({"id": "a"}) != per_item({"id": "b"}) and per_item({"id": "a"}) == per_item({"id": "a"})


def test_agreement():
    r = agreement([1, 5, 7, None, 9], [1, 6, 9, 4, None])
    assert r == {"n": 3, "unscored": 2, "exact": pytest.approx(1 / 3), "within1": pytest.approx(2 / 3)}


def test_consistency_by_k():
    p5, p7 = np.eye(10)[4].tolist(), np.eye(10)[6].tolist()
    run1 = [{"id": i, "k": k, "argmax": 5, "expected": 5.0, "probs": p5, "parsed": 5} for i in "ab" for k in (0, 2)]
    run2 = [
        {
            "id": i,
            "k": k,
            "argmax": 5 if k else 7,
            "expected": 5.5,
            "probs": p5 if k else p7,
            "parsed": None if i == "a" else 5,
        }
        for i in "ab"
        for k in (0, 2)
    ]
    table = consistency_by_k(run1, run2)
    assert [row["k"] for row in table] == [0, 2]
    assert table[0]["logprob_exact"] == 0.0 and table[1]["logprob_exact"] == 1.0
    assert table[1]["expected_gap"] == pytest.approx(0.5)
    assert table[0]["sampled_exact"] == 0.0 and table[1]["sampled_exact"] == 1.0
    assert table[0]["text_compared"] == 1 and table[0]["unscored"] == 1 and table[0]["text_exact"] == 1.0


def test_sampled_agreement():
    sure, split = np.eye(10)[6], np.zeros(10)
    split[[6, 7]] = 0.5  # ratings 7 and 8
    r = sampled_agreement([sure, split], [sure, split])
    assert r["exact"] == pytest.approx((1 + 0.5) / 2) and r["within1"] == pytest.approx(1.0)
    far = sampled_agreement([np.eye(10)[0]], [np.eye(10)[9]])
    assert far == {"exact": 0.0, "within1": 0.0}
