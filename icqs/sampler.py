"""Demo sets: N in-context examples for each ratio r_j = j / M, mixing good examples (Z_g) and bad ones (Z_b).

Exact counts: the demo set of ratio j holds exactly k_j = round(r_j * N) good demos (halves rounded up,
Task.good_counts), so its realised ratio k_j / N is known; it is the grid the scores are read on (Task.ratios). An
(M, N) pair whose counts repeat (N < M) is refused when the task is loaded: two "ratios" would be one hypothesis.

A *slot plan* gives each of the N slots a good example, a bad example and a rank (a random order of the slots);
the set of ratio j takes the good example in the k_j slots of lowest rank and the bad example elsewhere.
- coupled: one plan per repeat l, shared by all ratios. The sets are nested (the good slots of ratio j are among
  those of ratio j + 1) and neighbours differ only in the slots ranked k_j..k_{j+1} - 1, so they share long
  prefixes (computed once by the engine's prefix tree) and the comparison between ratios is not swamped by the
  choice of unrelated demos.
- independent: a fresh plan for every (repeat l, ratio j), as in the paper's Algorithms 1 and 2.
- bernoulli: the project's earlier sampler, kept for comparison: one plan per repeat, a slot is good when its
  uniform draw u < r_j, so a set's good count is Binomial(N, r_j) and two ratios can draw the same set. It ignores
  the balance option.

Balance (label tasks, Task.is_label_task): every slot of a plan also carries a label, the same at every ratio,
and its good and bad examples are drawn among the pool examples *showing* that label (a bad example shows a wrong
one). Every demo set of a repeat then shows the same labels in the same slots, and only their correctness changes
with r: a model cannot tell the ratios apart by how often each label appears. The label counts per set are the
task's label marginal (the label shares of Z_g, whose answers are correct) or uniform, by largest remainder
(Task.label_counts); "none" draws from the whole pool. Free-text tasks ignore the option.

Within a plan, the examples for a label (or the whole pool) are a random order of the pool without repetition, the
pool cycled again (in a new order) only when more slots need it than it holds. Everything is deterministic in
(seed, sampler, l, j).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import UserError

from .task import Example, Task

SAMPLERS = ("coupled", "independent", "bernoulli")


@dataclass(frozen=True)
class SlotPlan:
    good: np.ndarray  # [N] index into Z_g
    bad: np.ndarray  # [N] index into Z_b
    rank: np.ndarray  # [N] a random order of the slots (exact samplers), or uniform draws in [0, 1) (bernoulli)
    labels: tuple[str, ...] | None = None  # [N] the label each slot shows (balanced plans)


@dataclass(frozen=True)
class DemoSet:
    l: int  # repeat index (0..L-1)
    j: int  # ratio index (0..M)
    ratio: float  # the realised share of good demos
    examples: tuple[Example, ...]
    is_good: tuple[bool, ...]


def _draw_indices(rng: np.random.Generator, pool: np.ndarray, n: int) -> np.ndarray:
    """n entries of `pool` in a random order, cycling the pool (in a new order) only when n exceeds its size."""
    rounds = -(-n // len(pool))
    return np.concatenate([pool[rng.permutation(len(pool))] for _ in range(rounds)])[:n]


def _by_label(examples: list[Example], label: str, which: str) -> np.ndarray:
    index = np.array([i for i, e in enumerate(examples) if e.y == label], dtype=np.int64)
    if not len(index):
        raise UserError(
            f"balanced demo sets need {which} examples showing every label, and {which} has none "
            f"showing {label!r} (add some, or set balance: none)"
        )
    return index


def slot_plan(rng: np.random.Generator, task: Task, sampler: str) -> SlotPlan:
    n = task.N
    if sampler == "bernoulli" or task.balance_counts() is None:
        good = _draw_indices(rng, np.arange(len(task.good)), n)
        bad = _draw_indices(rng, np.arange(len(task.bad)), n)
        rank = rng.random(n) if sampler == "bernoulli" else rng.permutation(n)
        return SlotPlan(good, bad, rank)
    counts = task.balance_counts()
    labels = np.array([lab for lab, c in counts.items() for _ in range(c)], dtype=object)[rng.permutation(n)]
    good, bad = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for label in counts:
        slots = np.flatnonzero(labels == label)
        if len(slots):
            good[slots] = _draw_indices(rng, _by_label(task.good, label, "Z_g (good)"), len(slots))
            bad[slots] = _draw_indices(rng, _by_label(task.bad, label, "Z_b (bad)"), len(slots))
    return SlotPlan(good, bad, rng.permutation(n), tuple(str(v) for v in labels))


def is_good(plan: SlotPlan, task: Task, j: int, sampler: str) -> np.ndarray:
    """The good slots of ratio j: the k_j lowest-ranked slots (exact), or u < r_j (bernoulli)."""
    if sampler == "bernoulli":
        return plan.rank < j / task.M
    return plan.rank < task.good_counts[j]


def demo_set(task: Task, plan: SlotPlan, l: int, j: int, sampler: str = "coupled") -> DemoSet:
    good = is_good(plan, task, j, sampler)
    examples = tuple(task.good[g] if k else task.bad[b] for g, b, k in zip(plan.good, plan.bad, good))
    return DemoSet(l, j, float(good.mean()), examples, tuple(bool(k) for k in good))


def demo_sets(
    task: Task, sampler: str = "coupled", repeats: int | None = None, seed: int | None = None
) -> list[list[DemoSet]]:
    """sets[l][j]: the demo set of repeat l (0..L-1) and ratio j (0..M). Deterministic in (seed, sampler)."""
    if sampler not in SAMPLERS:
        raise UserError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")
    task.check_ratio_grid()
    repeats = task.L if repeats is None else repeats
    seed = task.seed if seed is None else seed
    sets = []
    for l in range(repeats):
        if sampler == "independent":
            sets.append(
                [
                    demo_set(task, slot_plan(np.random.default_rng([seed, l, j + 1]), task, sampler), l, j, sampler)
                    for j in range(task.M + 1)
                ]
            )
        else:
            plan = slot_plan(np.random.default_rng([seed, l]), task, sampler)
            sets.append([demo_set(task, plan, l, j, sampler) for j in range(task.M + 1)])
    return sets
