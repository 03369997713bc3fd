"""The demo set of Reinforced ICL: zero-shot judgments made by the engine itself, cached, then drawn.

Each pool item (question, response) is judged zero-shot with Prompt B, in two steps that follow the JSON answer
format: the rating is the argmax of the judge's rating-token distribution (read exactly as the graded items'
ratings are read, see grading.py), then the judge generates its reason after '{"rating": "<r>", "reason": "',
up to the closing quote. (Left to generate freely, a small judge often writes ratings such as "5.5" that are no
rating on the 1-10 scale, and keeps writing after the JSON.) The judgments are appended to a JSONL cache keyed by
item id, so a second run (or a killed one) does not make them again.

A draw is one permutation of the demo set; the K-shot prompt takes its first K demos, so every smaller prompt's
demos are in it (nested). `shared` draws use one permutation for every graded item (their prompts then share the
whole demo block); per-item draws use a permutation seeded by the item id, as in the paper. The graded item itself
is never among its demos.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..io import ResultWriter
from ..options import option_logprobs
from .grading import RATINGS, rating_options
from .prompts import RATING_PREFIX, Demo, chat_wrap, grading_problem, solution_text


def generate_demos(
    engine, pool: list[dict], cache_path, max_tokens: int = 48, batch: int = 16, progress: bool = False
) -> dict[str, Demo]:
    """id -> solved Demo (the judge's zero-shot rating and generated reason) for every pool item."""
    tok = engine.tokenizer
    with ResultWriter(cache_path, key="id") as cache:
        todo = [it for it in pool if not cache.done(it["id"])]
        for start in range(0, len(todo), batch):
            part = todo[start : start + batch]
            heads = [chat_wrap(tok, grading_problem(it["question"], it["response"]), RATING_PREFIX) for it in part]
            probs = np.exp(option_logprobs(engine, heads, rating_options(), progress=progress))
            ratings = [int(RATINGS[i]) for i in probs.argmax(axis=1)]
            gens = engine.generate(
                [h + f'{r}", "reason": "' for h, r in zip(heads, ratings)],
                max_tokens=max_tokens,
                temperature=0.0,
                stop=['"'],
                progress=progress,
            )
            for it, r, g in zip(part, ratings, gens):
                cache.write({"id": it["id"], "rating": r, "reason": g.text.strip(), "finish": g.finish_reason})
        judged = {row["id"]: row for row in cache.rows}
    return {
        it["id"]: Demo(
            it["question"], it["response"], solution_text(judged[it["id"]]["rating"], judged[it["id"]]["reason"])
        )
        for it in pool
    }


def draw(demos: dict[str, Demo], seed: int, exclude: str | None = None, limit: int | None = None) -> list[Demo]:
    """One permutation of the demo set (without the item `exclude`), truncated to `limit` demos."""
    ids = sorted(i for i in demos if i != exclude)
    order = np.random.default_rng(seed).permutation(len(ids))
    return [demos[ids[j]] for j in order[:limit]]


def item_seed(seed: int, item_id: str) -> int:
    """A per-item seed that does not depend on Python's hash randomisation."""
    return seed * 1_000_003 + zlib.crc32(str(item_id).encode())


def demo_drawer(demos: dict[str, Demo], seed: int, per_item: bool, limit: int | None = None):
    """item -> its demo draw: one shared permutation (the item itself skipped) or one per item."""
    if per_item:
        return lambda it: draw(demos, item_seed(seed, it["id"]), exclude=it["id"], limit=limit)
    shared = draw(demos, seed, limit=None if limit is None else limit + 1)

    def for_item(it):
        own = demos.get(it["id"])
        return [d for d in shared if d is not own][:limit]

    return for_item
