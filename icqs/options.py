"""Reading a judge's answer: a distribution over a few option strings, and a rating parsed from generated text.

`option_logprobs` scores every option string as a continuation of every prompt in one `Engine.score` call; the
engine's prefix tree computes each prompt once and only the option tokens on top of it. Options that are prefixes
of one another ("1" and "10") should carry a terminator ("1]]", "10]]") so that each names one complete answer.
"""

from __future__ import annotations

import json
import re

import numpy as np


def option_logprobs(
    engine, prompts: list[str], options: list[str], normalize: bool = True, progress: bool = False
) -> np.ndarray:
    """log P(option | prompt) for every prompt x option -> float64 array [n_prompts, n_options].

    normalize: renormalise each row over the options (log-softmax), giving the judge's distribution restricted to
    the options; otherwise the raw continuation log-probs (sums over the option's tokens)."""
    if not options:
        raise ValueError("option_logprobs needs at least one option")
    requests = [(p, o) for p in prompts for o in options]
    results = engine.score(requests, share_prefix=True, progress=progress) if requests else []
    lp = np.array([r.logprob for r in results], dtype=np.float64).reshape(len(prompts), len(options))
    if normalize and lp.size:
        from scipy.special import logsumexp  # here: `icqs --help` and argument errors do not wait for scipy

        lp = lp - logsumexp(lp, axis=1, keepdims=True)
    return lp


# A rating in the forms judges write: JSON {"rating": 7} / {"rating": "7"}, MT-Bench "Rating: [[7]]" or "[[7]]",
# and a loose "rating: 7" / "rating = 7/10". The first form found wins, in that order.
_BRACKETED = re.compile(r"\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]")
_KEYED = re.compile(r"""["']?rating["']?\s*[:=]\s*["']?\s*(-?\d+(?:\.\d+)?)""", re.IGNORECASE)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")


def _as_rating(value, low: int, high: int) -> int | None:
    try:
        x = float(str(value).strip())
    except ValueError:
        return None
    if not x.is_integer() or not low <= x <= high:
        return None
    return int(x)


def parse_rating(text: str, low: int = 1, high: int = 10) -> int | None:
    """The integer rating in `text`, or None when there is none in [low, high] (the caller counts it unscored)."""
    if not text:
        return None
    for obj in _JSON_OBJECT.findall(text):
        try:
            d = json.loads(obj)
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict):
            for key, value in d.items():
                if str(key).strip().lower() == "rating" and _as_rating(value, low, high) is not None:
                    return _as_rating(value, low, high)
    for pattern in (_BRACKETED, _KEYED):
        m = pattern.search(text)
        if m:
            return _as_rating(m.group(1), low, high)
    return None
