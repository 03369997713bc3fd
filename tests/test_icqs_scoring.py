"""ICQS scoring with hand-checked likelihoods: the argmax over ratios, the epistemic mean, the posterior, E[r] and
its credible interval, and the resumable likelihood computation against a table-driven engine."""

import numpy as np
import pytest

from icqs import posterior as post
from icqs.candidates import Candidate
from icqs.io import ResultWriter
from icqs.sampler import demo_sets
from icqs.scoring import compute_loglik, icqs_scores, mixture_requests
from icqs.task import Example, Task

RATIOS = [0.0, 0.5, 1.0]


def test_argmax_picks_the_most_likely_ratio_not_the_least():
    # Algorithm 1 line 7 says argmin; the method (Eq. 3, Sec. 3.4) is the argmax.
    assert post.argmax_ratio(np.array([-3.0, -1.0, -2.0]), RATIOS) == 0.5
    assert post.argmax_ratio(np.array([-0.5, -1.0, -2.0]), RATIOS) == 0.0
    assert post.argmax_ratio(np.array([-9.0, -1.0, -0.1]), RATIOS) == 1.0
    # an exact tie (the same demo set at two ratios) gives the mean of the tied ratios
    assert post.argmax_ratio(np.array([-1.0, -1.0, -3.0]), RATIOS) == 0.25
    assert list(post.argmax_ratio(np.array([[-2.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]), RATIOS)) == [0.75, 0.5]


def test_icqs_reads_repeat_zero_and_epistemic_the_mean_over_repeats():
    table = np.array(
        [
            [
                [-1.0, -2.0, -3.0],  # l = 0: ICQS says r = 0
                [-5.0, -1.0, -2.0],
                [-6.0, -1.5, -1.0],
            ]
        ]
    )  # mean over l: [-4, -1.5, -2] -> r = 0.5
    icqs = icqs_scores(table, RATIOS, epistemic=False)[0]
    epi = icqs_scores(table, RATIOS, epistemic=True)[0]
    assert icqs["score"] == 0.0 and icqs["curve"] == [-1.0, -2.0, -3.0]
    assert epi["score"] == 0.5 and epi["curve"] == pytest.approx([-4.0, -1.5, -2.0])


def test_posterior_expected_ratio_and_interval_hand_checked():
    curve = np.log([0.2, 0.3, 0.5]) - 7.0  # an additive constant does not change the posterior
    s = post.summarize(curve, RATIOS)
    assert s["posterior"] == pytest.approx([0.2, 0.3, 0.5])
    assert s["expected"] == pytest.approx(0.0 * 0.2 + 0.5 * 0.3 + 1.0 * 0.5)
    assert (s["ci_low"], s["ci_high"]) == (0.0, 1.0)  # CDF 0.2, 0.5, 1.0
    s = post.summarize(np.log([0.01, 0.04, 0.95]), RATIOS)
    assert (s["ci_low"], s["ci_high"]) == (0.5, 1.0)  # CDF 0.01, 0.05, 1.0: 0.05 reached at r = 0.5
    assert s["expected"] == pytest.approx(0.02 + 0.95)
    s = post.summarize(np.log([0.96, 0.03, 0.01]), RATIOS)
    assert (s["ci_low"], s["ci_high"], s["score"]) == (0.0, 0.0, 0.0)


def test_posterior_is_softmax_of_loglik():
    curve = np.array([-2.0, -1.0, -4.0])
    p = post.posterior(curve)
    e = np.exp(curve)
    assert p == pytest.approx(e / e.sum())


class TableEngine:
    """Scores a request by a fixed rule on its text: log P = -(bad demos in the context) * w(y) + c(y), where the
    candidate answer y decides the weight. Counts its calls and requests."""

    def __init__(self):
        self.calls, self.requests = 0, 0

    def score(self, requests, share_prefix=True, progress=False):
        self.calls += 1
        self.requests += len(requests)
        out = []
        for ctx, cont in requests:
            bad = ctx.count("[bad]")
            lp = -1.0 * bad if cont.startswith("right") else -2.0 + 0.5 * bad
            out.append(type("R", (), {"logprob": lp, "num_tokens": len(cont.split())})())
        return out


def _task(M=2, N=4, L=3):
    good = [Example(f"g{i}", "right [good]") for i in range(6)]
    bad = [Example(f"b{i}", "wrong [bad]") for i in range(6)]
    return Task("t", "Q: {x}\nA: {y}", good, bad, labels=["right", "wrong"], M=M, N=N, L=L, seed=3)


def _cands():
    return [
        Candidate("c0", "m", "q0", "right"),
        Candidate("c1", "m", "q1", "wrong"),
        Candidate("c2", "m", "q2", "right"),
    ]


def test_mixture_requests_are_demo_text_plus_x_part_then_y_part():
    task = _task()
    sets = demo_sets(task, "coupled", 1)[0]
    reqs = mixture_requests(task, sets, _cands())
    assert len(reqs) == (task.M + 1) * 3
    ctx, cont = reqs[1]
    assert ctx == task.demo_text(list(sets[0].examples)) + "Q: q1\nA: " and cont == "wrong"
    assert task.demo_text([Example("a", "b")]) == "Q: a\nA: b\n\n"


def test_compute_loglik_matches_the_rule_and_resumes(tmp_path):
    task, cands = _task(), _cands()
    eng = TableEngine()
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        table = compute_loglik(eng, task, cands, w, "coupled", repeats=task.L, chunk=2, progress=False)
    sets = demo_sets(task, "coupled", task.L)
    for l in range(task.L):
        for j in range(task.M + 1):
            bad = sum(not g for g in sets[l][j].is_good)
            assert table[0, l, j] == -bad and table[1, l, j] == -2.0 + 0.5 * bad
    assert eng.calls == task.L * 2  # per repeat: one call per chunk of 2 candidates
    # the rule makes right answers best at r = 1 and wrong answers best at r = 0
    assert [s["score"] for s in icqs_scores(table, task.ratios, epistemic=True)] == [1.0, 0.0, 1.0]
    # resume: nothing left to compute
    eng2 = TableEngine()
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        again = compute_loglik(eng2, task, cands, w, "coupled", repeats=task.L, chunk=2, progress=False)
    assert eng2.calls == 0 and np.array_equal(again, table)
    # a run killed after some rows: only the missing candidates are scored
    lines = (tmp_path / "ll.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "ll.jsonl").write_text("".join(lines[:5]) + lines[5][:10])
    eng3 = TableEngine()
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        resumed = compute_loglik(eng3, task, cands, w, "coupled", repeats=task.L, chunk=2, progress=False)
    assert eng3.requests == (len(lines) - 5) * (task.M + 1) and np.array_equal(resumed, table)


def test_icqs_reuses_epistemic_repeat_zero(tmp_path):
    task, cands = _task(), _cands()
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        compute_loglik(TableEngine(), task, cands, w, "coupled", repeats=1, progress=False)
        eng = TableEngine()
        compute_loglik(eng, task, cands, w, "coupled", repeats=task.L, progress=False)
    assert eng.requests == (task.L - 1) * len(cands) * (task.M + 1)
