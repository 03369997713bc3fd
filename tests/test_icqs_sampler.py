"""Demo set sampling: every ratio's set holds exactly round(r_j N) good demos (coupled and independent), coupled sets
are nested across ratios and share prefixes, balanced sets of a repeat show the same labels at every ratio, all
deterministic in the seed; (M, N) pairs whose counts repeat are refused."""

from fractions import Fraction

import numpy as np
import pytest

from engine.errors import UserError
from icqs.sampler import demo_sets
from icqs.task import Example, Task, load_task


def _task(M=4, N=6, L=1, seed=0, pool=10):
    good = [Example(f"g{i}", "good") for i in range(pool)]
    bad = [Example(f"b{i}", "bad") for i in range(pool)]
    return Task("t", "{x} -> {y}", good, bad, M=M, N=N, L=L, seed=seed)


def _label_task(M=4, N=8, L=6, seed=0, yes_share=0.7, pool=20, balance="marginal"):
    """A yes/no task with unbalanced gold labels: Z_g answers correctly (yes_share of them 'yes'), Z_b flips
    the answer (so it shows 'yes' on the 1 - yes_share whose gold answer is 'no')."""
    gold = ["yes" if i < round(yes_share * pool) else "no" for i in range(pool)]
    good = [Example(f"g{i}", y) for i, y in enumerate(gold)]
    bad = [Example(f"b{i}", "no" if y == "yes" else "yes") for i, y in enumerate(gold)]
    return Task("yn", "Q: {x}\nA: {y}", good, bad, labels=["no", "yes"], M=M, N=N, L=L, seed=seed, balance=balance)


def _round_half_up(j, N, M):
    return int(Fraction(j * N, M) + Fraction(1, 2))


@pytest.mark.parametrize("sampler", ["coupled", "independent"])
@pytest.mark.parametrize("M,N", [(4, 8), (4, 6), (3, 8), (5, 7), (2, 3), (4, 4), (1, 1), (6, 10)])
def test_every_set_holds_exactly_round_r_n_good_demos(sampler, M, N):
    task = _task(M=M, N=N, L=20)
    counts = [_round_half_up(j, N, M) for j in range(M + 1)]
    assert task.good_counts == counts and task.ratios == [k / N for k in counts]
    for row in demo_sets(task, sampler):
        assert [sum(s.is_good) for s in row] == counts
        assert [s.ratio for s in row] == task.ratios  # the realised ratio is the grid the scores use
        for s in row:  # the flags mark the good examples
            assert all((e.y == "good") == g for e, g in zip(s.examples, s.is_good))


@pytest.mark.parametrize("balance", ["marginal", "none"])
def test_coupled_sets_are_nested_and_share_prefixes(balance):
    task = _label_task(M=4, N=8, L=60, balance=balance)
    shared_coupled, shared_indep = [], []
    for row_c, row_i in zip(demo_sets(task, "coupled"), demo_sets(task, "independent")):
        for a, b in zip(row_c, row_c[1:]):
            assert all(gb or not ga for ga, gb in zip(a.is_good, b.is_good))  # good slots only grow with r
            # a slot that stays bad (or good) keeps its example
            assert all(ea == eb for ea, eb, ga, gb in zip(a.examples, b.examples, a.is_good, b.is_good) if ga == gb)
        for sets, acc in ((row_c, shared_coupled), (row_i, shared_indep)):
            for a, b in zip(sets, sets[1:]):
                acc.append(next((n for n in range(task.N) if a.examples[n] != b.examples[n]), task.N))
    # coupled neighbours differ in exactly 2 of 8 random slots: expected shared prefix (N - 2) / 3 = 2
    assert 1.6 < np.mean(shared_coupled) < 2.4 and np.mean(shared_indep) < 0.5


@pytest.mark.parametrize("sampler", ["coupled", "independent"])
def test_balanced_sets_show_the_same_labels_at_every_ratio(sampler):
    task = _label_task(yes_share=0.7, N=8, L=10)
    assert task.is_label_task and task.balance_counts() == {"no": 2, "yes": 6}  # 0.7 * 8 = 5.6 -> 6
    for row in demo_sets(task, sampler):
        shown = [sorted(e.y for e in s.examples) for s in row]
        assert all(x == ["no"] * 2 + ["yes"] * 6 for x in shown)
        if sampler == "coupled":  # the same label in the same slot, whatever the ratio
            assert len({tuple(e.y for e in s.examples) for s in row}) == 1
    uniform = _label_task(yes_share=0.7, N=8, L=10, balance="uniform")
    assert uniform.balance_counts() == {"no": 4, "yes": 4}
    for row in demo_sets(uniform, sampler):
        assert all(sorted(e.y for e in s.examples) == ["no"] * 4 + ["yes"] * 4 for s in row)


def test_without_balance_the_label_share_follows_the_ratio():
    """The failure mode balance removes: Z_g shows 70% 'yes', Z_b 30%, so unbalanced sets show more 'yes' as r
    grows; a model can tell the ratios apart by label frequency alone."""
    task = _label_task(yes_share=0.7, N=8, L=40, balance="none")
    yes = np.array([[sum(e.y == "yes" for e in s.examples) for s in row] for row in demo_sets(task, "coupled")])
    assert yes[:, 0].mean() < 3.5 and yes[:, -1].mean() > 4.5


def test_free_text_tasks_ignore_balance():
    good = [Example(f"q{i}", f"a fine answer {i}") for i in range(10)]
    bad = [Example(f"q{i}", f"a poor answer {i}") for i in range(10)]
    task = Task("ft", "Q: {x}\nA: {y}", good, bad, labels=sorted({e.y for e in good + bad}), M=2, N=4, L=3)
    assert not task.is_label_task and task.balance_counts() is None
    assert [[sum(s.is_good) for s in row] for row in demo_sets(task)] == [[0, 2, 4]] * 3


def test_balance_needs_every_label_in_both_pools():
    task = _label_task(yes_share=1.0)  # Z_b then shows only 'no'
    with pytest.raises(UserError, match="Z_b .*'yes'"):
        demo_sets(task)


@pytest.mark.parametrize("sampler", ["coupled", "independent", "bernoulli"])
@pytest.mark.parametrize("balance", ["marginal", "none"])
def test_deterministic_in_seed_and_icqs_sets_are_a_prefix_of_epistemic_sets(sampler, balance):
    a = demo_sets(_label_task(L=3, balance=balance), sampler)
    assert a == demo_sets(_label_task(L=3, balance=balance), sampler)
    assert demo_sets(_label_task(L=1, balance=balance), sampler)[0] == a[0]
    assert demo_sets(_label_task(L=3, seed=1, balance=balance), sampler) != a
    with pytest.raises(UserError, match="unknown sampler"):
        demo_sets(_task(), "stratified")


def test_bernoulli_sampler_kept_for_comparison_has_random_counts():
    task = _task(M=4, N=8, L=50)
    counts = np.array([[sum(s.is_good) for s in row] for row in demo_sets(task, "bernoulli")])
    assert (counts[:, 0] == 0).all() and (counts[:, -1] == 8).all()
    assert (counts[:, 2] != 4).mean() > 0.3  # Binomial(8, 0.5) is 4 only 27% of the time
    assert abs(counts[:, 2].mean() - 4) < 1.0


def test_no_repeats_within_a_set_until_the_pool_is_exhausted():
    task = _task(M=2, N=5, pool=5, L=20)
    for row in demo_sets(task, "independent"):
        assert len({e.x for e in row[-1].examples}) == 5  # all good, pool of 5: each once
    big = _task(M=1, N=12, pool=5, L=1)
    xs = [e.x for e in demo_sets(big, "coupled")[0][-1].examples]
    assert len(xs) == 12 and set(xs) == {f"g{i}" for i in range(5)}


def test_m_n_pairs_whose_counts_repeat_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"N = 3 the good counts round\(j N / M\) repeat \(\[0, 1, 2, 2, 3\]\)"):
        demo_sets(_task(M=4, N=3))
    path = tmp_path / "t.yaml"
    path.write_text("template: '{x} -> {y}'\ngood: [{x: a, y: p}]\nbad: [{x: b, y: n}]\nM: 4\nN: 3\n")
    with pytest.raises(UserError) as e:
        load_task(path)
    assert str(e.value).startswith(f"{path}:5: M = 4 ratios need N >= M") and "\n" not in str(e.value)


def test_task_options_balance_and_calibrate_are_read_and_checked(tmp_path):
    path = tmp_path / "t.yaml"
    base = "template: '{x} -> {y}'\ngood: [{x: a, y: p}, {x: b, y: p}]\nbad: [{x: a, y: n}, {x: b, y: n}]\nM: 2\nN: 2\n"
    path.write_text(base)
    t = load_task(path)
    assert (t.balance, t.calibrate, t.content_free) == ("marginal", False, "N/A")
    path.write_text(base + "balance: uniform\ncalibrate: true\ncontent_free: '[MASK]'\n")
    t = load_task(path)
    assert (t.balance, t.calibrate, t.content_free) == ("uniform", True, "[MASK]")
    for bad, line in (("balance: even\n", 6), ("calibrate: 1\n", 6)):
        path.write_text(base + bad)
        with pytest.raises(UserError, match=f"^{path}:{line}: "):
            load_task(path)


def test_cli_refuses_repeating_counts_before_writing_anything(tmp_path, capsys):
    from icqs.cli import main

    (tmp_path / "t.yaml").write_text("template: '{x} -> {y}'\ngood: [{x: a, y: p}]\nbad: [{x: b, y: n}]\n")
    (tmp_path / "c.jsonl").write_text('{"id": "1", "model": "m", "x": "c", "y": "p"}\n')
    out = tmp_path / "run"
    assert (
        main(
            [
                "score",
                str(tmp_path / "t.yaml"),
                str(tmp_path / "c.jsonl"),
                "--out",
                str(out),
                "--M",
                "4",
                "--N",
                "2",
                "--balance",
                "uniform",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: M = 4 ratios need N >= M") and err.count("\n") == 1 and not out.exists()
