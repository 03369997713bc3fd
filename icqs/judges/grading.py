"""Single answer grading, 1-10, read two ways: from the log-probs of the rating tokens and from generated text.

Log-prob reading: the judge's answer is forced to begin with RATING_PREFIX ('{"rating": "') and each rating r is
scored as the continuation 'r"' (the closing quote keeps "1" from counting the mass of "10"). Renormalised over
1..10 this gives a distribution, its expected rating and its argmax. Text reading: the judge generates freely from
the prompt and the rating is parsed (icqs.options.parse_rating); an unparsable answer is 'unscored'.

All prompts of one call (every item x every K) go to the engine together, so the demos shared by the nested K-shot
prompts are computed once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..options import option_logprobs, parse_rating
from .prompts import PROMPTS, RATING_PREFIX, Demo, chat_wrap

LOW, HIGH = 1, 10
RATINGS = np.arange(LOW, HIGH + 1)


def rating_options() -> list[str]:
    return [f'{r}"' for r in RATINGS]


def summarize(probs) -> dict:
    """Distribution over 1..10 -> {"probs", "expected", "argmax"}."""
    probs = np.asarray(probs, dtype=np.float64)
    return {
        "probs": probs.round(6).tolist(),
        "expected": round(float(probs @ RATINGS), 4),
        "argmax": int(RATINGS[int(np.argmax(probs))]),
    }


def build_prompts(
    items: list[dict], demos_for: Callable[[dict], list[Demo]], ks: list[int], method: str = "reinforced"
) -> list[tuple[dict, int, str]]:
    """(item, k, user prompt) for every item and k; demos_for(item) gives the item's demo draw (nested in k)."""
    assemble = PROMPTS[method]
    return [(it, k, assemble(it["question"], it["response"], demos_for(it), k)) for it in items for k in ks]


def prompt_tokens(tokenizer, user_prompt: str) -> int:
    """Tokens of the chat-wrapped prompt with the rating prefix (what the scoring call computes)."""
    return len(tokenizer.encode(chat_wrap(tokenizer, user_prompt, RATING_PREFIX)))


def grade(
    engine, jobs: list[tuple[dict, int, str]], generate: bool = False, max_tokens: int = 64, progress: bool = False
) -> list[dict]:
    """Rate every (item, k, prompt) job -> one row per job: id, k, probs, expected, argmax, and with `generate`
    the generated text and its parsed rating (None = unscored)."""
    tok = engine.tokenizer
    scored = [chat_wrap(tok, p, RATING_PREFIX) for _, _, p in jobs]
    probs = np.exp(option_logprobs(engine, scored, rating_options(), normalize=True, progress=progress))
    rows = [{"id": it["id"], "k": k, **summarize(p)} for (it, k, _), p in zip(jobs, probs)]
    if generate:
        gens = engine.generate(
            [chat_wrap(tok, p) for _, _, p in jobs], max_tokens=max_tokens, temperature=0.0, progress=progress
        )
        for row, g in zip(rows, gens):
            row["generated"] = g.text
            row["parsed"] = parse_rating(g.text, LOW, HIGH)
    return rows


def fitting_shots(
    tokenizer, items: list[dict], drawers: list[Callable[[dict], list[Demo]]], method: str, limit: int, n_demos: int
) -> list[int]:
    """K = 0, 1, 2, 4, ... while every item's K-shot prompt (under every draw) fits in `limit` tokens."""
    ks, k = [0], 1
    while k <= n_demos - 1:  # a shared draw loses one demo for the item that is itself a demo
        if method == "unsupervised" and n_demos - 1 < 4:
            break
        longest = max(
            prompt_tokens(tokenizer, p) for drawer in drawers for _, _, p in build_prompts(items, drawer, [k], method)
        )
        if longest > limit:
            break
        ks.append(k)
        k *= 2
    return ks
