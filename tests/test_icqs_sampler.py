"""Demo set sampling: each ratio's good fraction is r (coupled and independent), coupled sets are nested across
ratios and share prefixes, no example repeats within a set while the pool lasts."""
import numpy as np
import pytest

from engine.errors import UserError
from icqs.sampler import demo_sets
from icqs.task import Example, Task


def _task(M=4, N=6, L=1, seed=0, pool=10):
    good = [Example(f"g{i}", "good") for i in range(pool)]
    bad = [Example(f"b{i}", "bad") for i in range(pool)]
    return Task("t", "{x} -> {y}", good, bad, M=M, N=N, L=L, seed=seed)


@pytest.mark.parametrize("sampler", ["coupled", "independent"])
def test_each_ratio_has_good_fraction_r(sampler):
    task = _task(M=4, N=6, L=400)
    sets = demo_sets(task, sampler)
    frac = np.array([[np.mean(s.is_good) for s in row] for row in sets])  # [L, M+1]
    assert np.all(frac[:, 0] == 0.0) and np.all(frac[:, -1] == 1.0)
    for j, r in enumerate(task.ratios):
        # each slot is Bernoulli(r): the mean of 400 * 6 slots lies within 4 standard errors of r
        se = np.sqrt(r * (1 - r) / frac[:, j].size / task.N)
        assert abs(frac[:, j].mean() - r) <= 4 * se + 1e-12, (j, frac[:, j].mean())
    # the good flags mark good examples
    s = sets[0][2]
    assert all((e.y == "good") == g for e, g in zip(s.examples, s.is_good))


def test_coupled_sets_are_nested_and_share_prefixes():
    task = _task(M=4, N=8, L=50)
    shared_coupled, shared_indep = [], []
    for row_c, row_i in zip(demo_sets(task, "coupled"), demo_sets(task, "independent")):
        for a, b in zip(row_c, row_c[1:]):
            assert all(gb or not ga for ga, gb in zip(a.is_good, b.is_good))  # good slots only grow with r
            # a slot that stays bad (or good) keeps its example
            assert all(ea == eb for ea, eb, ga, gb in zip(a.examples, b.examples, a.is_good, b.is_good) if ga == gb)
        for sets, acc in ((row_c, shared_coupled), (row_i, shared_indep)):
            for a, b in zip(sets, sets[1:]):
                n = 0
                while n < task.N and a.examples[n] == b.examples[n]:
                    n += 1
                acc.append(n)
    # coupled neighbours differ in a slot with probability 1/M: expected shared prefix sum_k<=N (1 - 1/M)^k ~ 2.7
    assert np.mean(shared_coupled) > 2.0 and np.mean(shared_indep) < 0.5


def test_no_repeats_within_a_set_until_the_pool_is_exhausted():
    task = _task(M=2, N=5, pool=5, L=20)
    for row in demo_sets(task, "independent"):
        assert len({e.x for e in row[-1].examples}) == 5  # all good, pool of 5: each once
    big = _task(M=1, N=12, pool=5, L=1)
    xs = [e.x for e in demo_sets(big, "coupled")[0][-1].examples]
    assert len(xs) == 12 and set(xs) == {f"g{i}" for i in range(5)}


def test_deterministic_in_seed_and_icqs_sets_are_a_prefix_of_epistemic_sets():
    a = demo_sets(_task(L=3), "coupled")
    b = demo_sets(_task(L=3), "coupled")
    assert a == b and demo_sets(_task(L=1), "coupled")[0] == a[0]
    assert demo_sets(_task(L=1, seed=1), "coupled")[0] != a[0]
    with pytest.raises(UserError, match="unknown sampler"):
        demo_sets(_task(), "stratified")
