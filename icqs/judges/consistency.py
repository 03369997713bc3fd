"""Consistency of single answer grading: two runs with independent demo draws, compared item by item (the
paper's Fig. 3-6), for each K. A rating that could not be read (None) makes the pair not comparable; such pairs
are counted, not scored.

Greedy readings (the argmax of the rating distribution, a greedy generation) of the zero-shot prompt cannot
disagree between runs: nothing differs. The paper's judge samples its answer; `sampled_agreement` gives the
probability that two ratings sampled from the two runs' distributions agree (exactly, within 1), which is what
two sampled judgments would show on average, at K = 0 as at any K."""

from __future__ import annotations

import numpy as np


def agreement(first: list[int | None], second: list[int | None]) -> dict:
    """Exact and within-1 agreement between two rating lists over the items both runs rated."""
    if len(first) != len(second):
        raise ValueError("the two runs rate different numbers of items")
    pairs = [(a, b) for a, b in zip(first, second) if a is not None and b is not None]
    n = len(pairs)
    diff = np.array([abs(a - b) for a, b in pairs], dtype=float)
    return {
        "n": n,
        "unscored": len(first) - n,
        "exact": float(np.mean(diff == 0)) if n else None,
        "within1": float(np.mean(diff <= 1)) if n else None,
    }


def sampled_agreement(first: list, second: list) -> dict:
    """Mean over items of P(r1 == r2) and P(|r1 - r2| <= 1) for r1 ~ first[i], r2 ~ second[i] (distributions)."""
    p, q = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    joint = p[:, :, None] * q[:, None, :]  # [items, r1, r2]
    n = p.shape[1]
    gap = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    return {
        "exact": float(joint[:, gap == 0].sum(axis=1).mean()),
        "within1": float(joint[:, gap <= 1].sum(axis=1).mean()),
    }


def expected_gap(first: list[float], second: list[float]) -> float:
    """Mean absolute difference of the expected ratings of the two runs."""
    return float(np.mean(np.abs(np.asarray(first) - np.asarray(second))))


def consistency_by_k(run1: list[dict], run2: list[dict]) -> list[dict]:
    """Rows (one per K) from two runs' grading rows (id, k, argmax, expected, optional parsed)."""
    index2 = {(r["id"], r["k"]): r for r in run2}
    table = []
    for k in sorted({r["k"] for r in run1}):
        pairs = [(r, index2[(r["id"], k)]) for r in run1 if r["k"] == k and (r["id"], k) in index2]
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        row = {"k": k, "items": len(pairs)}
        lp = agreement([r["argmax"] for r in a], [r["argmax"] for r in b])
        row.update(
            logprob_exact=lp["exact"],
            logprob_within1=lp["within1"],
            expected_gap=expected_gap([r["expected"] for r in a], [r["expected"] for r in b]) if a else None,
        )
        if a:
            sampled = sampled_agreement([r["probs"] for r in a], [r["probs"] for r in b])
            row.update(sampled_exact=sampled["exact"], sampled_within1=sampled["within1"])
        if a and all("parsed" in r for r in a + b):
            gen = agreement([r["parsed"] for r in a], [r["parsed"] for r in b])
            row.update(
                text_exact=gen["exact"],
                text_within1=gen["within1"],
                text_compared=gen["n"],
                unscored=sum(r["parsed"] is None for r in a + b),
            )
        table.append(row)
    return table
