"""Contextual calibration of the ICQS likelihoods: the content-free curve is the same demo set followed by the
content-free input, the calibrated curve is raw minus content-free, its scores are reported beside the raw ones,
and it removes a bias a demo set puts on an answer whatever the input (the label-frequency failure)."""

import numpy as np
import pytest

from engine import Engine
from icqs.candidates import Candidate
from icqs.io import ResultWriter
from icqs.posterior import argmax_ratio
from icqs.sampler import demo_sets
from icqs.scoring import compute_loglik, method_scores, mixture_requests
from icqs.task import Example, Task


def _task(calibrate=True, M=2, N=4, L=2):
    gold = [("one", "yes"), ("two", "no"), ("three", "yes"), ("four", "yes"), ("five", "no"), ("six", "yes")]
    good = [Example(x, y) for x, y in gold]
    bad = [Example(x, "no" if y == "yes" else "yes") for x, y in gold]
    return Task("tiny", "Q: {x}\nA: {y}", good, bad, labels=["no", "yes"], M=M, N=N, L=L, seed=1, calibrate=calibrate)


def _cands():
    return [
        Candidate(f"c{i}", "m", x, y)
        for i, (x, y) in enumerate([("seven", "yes"), ("seven", "no"), ("eight", "yes"), ("nine", "no"), ("ten", "no")])
    ]


def test_content_free_curve_on_a_tiny_model_equals_one_request_at_a_time_and_changes_the_score(
    tiny_model_dir, tmp_path
):
    eng = Engine.load(str(tiny_model_dir), dtype="float32")
    task, cands = _task(), _cands()
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        compute_loglik(eng, task, cands, w, "coupled", repeats=task.L, progress=False)
        rows = w.rows
    sets = demo_sets(task, "coupled", task.L)
    for row in rows:
        c = next(c for c in cands if c.id == row["id"])
        cf = [eng.score([r])[0].logprob for r in mixture_requests(task, sets[row["l"]], [c], x="N/A")]
        assert np.allclose(row["loglik_cf"], cf, atol=1e-4)
        assert mixture_requests(task, sets[row["l"]], [c], x="N/A")[0][0].endswith("Q: N/A\nA: ")
    for epistemic in (False, True):
        scores = method_scores(rows, cands, task, "coupled", epistemic)
        for s, c in zip(scores, cands):
            raw = np.array(s["curve"])
            cf = np.mean([r["loglik_cf"] for r in rows if r["id"] == c.id and (epistemic or r["l"] == 0)], axis=0)
            assert np.allclose(s["curve_cal"], raw - cf)
            assert s["score_cal"] == argmax_ratio(raw - cf, task.ratios)
        # on this model and seed the content-free term moves some argmax: calibration is not a no-op
        assert any(s["score_cal"] != s["score"] for s in scores)
    # without calibrate: no content-free requests, no calibrated fields
    with ResultWriter(tmp_path / "raw.jsonl", ("sampler", "l", "id")) as w:
        compute_loglik(eng, _task(calibrate=False), cands, w, "coupled", repeats=1, progress=False)
        assert all("loglik_cf" not in r for r in w.rows)
        assert "score_cal" not in method_scores(w.rows, cands, _task(calibrate=False), "coupled", False)[0]


class FrequencyEngine:
    """A model that has learnt label frequency more than quality: log P(y | context) = (demos showing y) +
    0.25 * (good demos) * (+1 if y is the right answer for x, -1 if wrong). The content-free input has no right
    answer: only the frequency term applies."""

    RIGHT = {"seven": "yes", "eight": "no"}

    def score(self, requests, share_prefix=True, progress=False):
        out = []
        for ctx, cont in requests:
            demos, x = ctx.rsplit("Q: ", 1)
            x = x.split("\n")[0]
            shown = demos.count(f"A: {cont}\n")
            quality = 0.0
            if x in self.RIGHT:
                good = sum(f"Q: {q}\nA: {a}\n" in demos for q, a in GOLD)
                quality = 0.25 * good * (1.0 if self.RIGHT[x] == cont else -1.0)
            out.append(type("R", (), {"logprob": shown + quality, "num_tokens": 1})())
        return out


GOLD = [("one", "yes"), ("two", "no"), ("three", "yes"), ("four", "yes"), ("five", "no"), ("six", "yes")]


@pytest.mark.parametrize("balance", ["none", "marginal"])
def test_calibration_removes_a_label_frequency_bias(tmp_path, balance):
    """Unbalanced sets at high r show 'yes' more often (Z_g is 2/3 'yes', Z_b 1/3), so the frequency term pushes a
    'yes' answer up with r whatever its correctness; the content-free curve carries exactly that term, and the
    calibrated score follows correctness only."""
    task = _task(M=2, N=6, L=1)
    task.balance = balance
    cands = [
        Candidate("right-yes", "m", "seven", "yes"),
        Candidate("wrong-no", "m", "seven", "no"),
        Candidate("right-no", "m", "eight", "no"),
        Candidate("wrong-yes", "m", "eight", "yes"),
    ]
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        compute_loglik(FrequencyEngine(), task, cands, w, "coupled", repeats=1, progress=False)
        scores = {c.id: s for c, s in zip(cands, method_scores(w.rows, cands, task, "coupled", False))}
    assert [scores[k]["score_cal"] for k in ("right-yes", "wrong-no", "right-no", "wrong-yes")] == [1.0, 0.0, 1.0, 0.0]
    if balance == "none":  # the raw score is fooled on the wrong 'yes' answer, the calibrated one is not
        assert scores["wrong-yes"]["score"] > 0.0
