"""icqs.options: rating parsing, and option log-probs read through the engine on a tiny model."""

import pytest

from icqs.options import parse_rating


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"rating": "7", "reason": "clear and correct"}', 7),
        ('{"rating": 10, "reason": "perfect"}', 10),
        ('Sure! {"reason": "ok", "rating": "3"} done', 3),
        ("The answer is fine. Rating: [[8]]", 8),
        ("[[ 2 ]]", 2),
        ("[[6.0]]", 6),
        ('"rating": "9", "reason": "unterminated json', 9),
        ("rating = 4/10", 4),
        ('{"rating": "", "reason": ""}', None),  # the template itself, unfilled
        ('{"rating": "11"}', None),  # out of range
        ("Rating: [[0]]", None),
        ("Rating: [[7.5]]", None),  # not an integer rating
        ("I think it is good.", None),
        ("", None),
    ],
)
def test_parse_rating(text, expected):
    assert parse_rating(text) == expected


def test_parse_rating_custom_range():
    assert parse_rating("[[0]]", low=0, high=5) == 0
    assert parse_rating("[[6]]", low=0, high=5) is None


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from engine import Engine

    return Engine.load(str(tiny_model_dir), dtype="float32")


def test_option_logprobs_match_separate_scoring(tiny_engine):
    import numpy as np

    from icqs.options import option_logprobs

    prompts = ["The judge reads both responses and writes a verdict:", "Ratings from 1 to 10:"]
    options = [" [[A]]", " [[B]]", " [[C]]", " 10"]
    raw = option_logprobs(tiny_engine, prompts, options, normalize=False)
    assert raw.shape == (2, 4) and tiny_engine.last_stats.requests == 8  # one call for every pair
    for i, p in enumerate(prompts):
        for j, o in enumerate(options):
            alone = tiny_engine.score([(p, o)])[0].logprob
            assert raw[i, j] == pytest.approx(alone, abs=1e-4)
    norm = option_logprobs(tiny_engine, prompts, options)
    assert np.exp(norm).sum(axis=1) == pytest.approx([1.0, 1.0])
    assert norm - raw == pytest.approx(np.broadcast_to((norm - raw)[:, :1], raw.shape), abs=1e-9)  # a row shift
    # each prompt is computed once, not once per option
    assert tiny_engine.last_stats.tokens_computed < tiny_engine.last_stats.tokens_requested / 2


def test_option_logprobs_needs_options(tiny_engine):
    from icqs.options import option_logprobs

    with pytest.raises(ValueError):
        option_logprobs(tiny_engine, ["x"], [])
