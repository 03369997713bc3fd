"""Demo sets: N in-context examples drawn from the mixture r * Z_g + (1 - r) * Z_b for each ratio r_j = j / M.

A demo set is built from a *slot plan*: for each of the N slots a good example, a bad example and a uniform draw
u. The set of ratio r takes the good example in the slots where u < r and the bad one elsewhere, so each slot is
good with probability r independently: a proper sample of the mixture (r = 1: all good, r = 0: all bad).

- independent: a fresh slot plan for every (repeat l, ratio j), as in the paper's Algorithm 1 and 2.
- coupled: one slot plan per repeat l, shared by all ratios. A set differs from its neighbour only in the slots
  whose u falls between the two ratios, so they share a long prefix (computed once by the engine's prefix tree)
  and the likelihood comparison between ratios is not swamped by the choice of unrelated demos.

Within a plan, the good (bad) examples are a random order of the pool without repetition, the pool cycled again
(in a new order) only when N exceeds its size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import UserError

from .task import Example, Task

SAMPLERS = ("coupled", "independent")


@dataclass(frozen=True)
class SlotPlan:
    good: np.ndarray  # [N] index into Z_g
    bad: np.ndarray  # [N] index into Z_b
    u: np.ndarray  # [N] uniform in [0, 1)

    def is_good(self, ratio: float) -> np.ndarray:
        return self.u < ratio


@dataclass(frozen=True)
class DemoSet:
    l: int  # repeat index (0..L-1)
    j: int  # ratio index (0..M)
    ratio: float
    examples: tuple[Example, ...]
    is_good: tuple[bool, ...]


def _draw_indices(rng: np.random.Generator, pool: int, n: int) -> np.ndarray:
    rounds = -(-n // pool)
    return np.concatenate([rng.permutation(pool) for _ in range(rounds)])[:n]


def slot_plan(rng: np.random.Generator, n_good: int, n_bad: int, n: int) -> SlotPlan:
    return SlotPlan(_draw_indices(rng, n_good, n), _draw_indices(rng, n_bad, n), rng.random(n))


def demo_set(task: Task, plan: SlotPlan, l: int, j: int) -> DemoSet:
    ratio = task.ratios[j]
    good = plan.is_good(ratio)
    examples = tuple(task.good[g] if k else task.bad[b] for g, b, k in zip(plan.good, plan.bad, good))
    return DemoSet(l, j, ratio, examples, tuple(bool(k) for k in good))


def demo_sets(task: Task, sampler: str = "coupled", repeats: int | None = None, seed: int | None = None
              ) -> list[list[DemoSet]]:
    """sets[l][j]: the demo set of repeat l (0..L-1) and ratio j (0..M). Deterministic in (seed, sampler)."""
    if sampler not in SAMPLERS:
        raise UserError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")
    repeats = task.L if repeats is None else repeats
    seed = task.seed if seed is None else seed
    n_good, n_bad = len(task.good), len(task.bad)
    sets = []
    for l in range(repeats):
        if sampler == "coupled":
            plan = slot_plan(np.random.default_rng([seed, l]), n_good, n_bad, task.N)
            sets.append([demo_set(task, plan, l, j) for j in range(task.M + 1)])
        else:
            sets.append([demo_set(task, slot_plan(np.random.default_rng([seed, l, j + 1]), n_good, n_bad, task.N),
                                  l, j) for j in range(task.M + 1)])
    return sets
