"""icqs.options: rating parsing, and option log-probs read through the engine on a tiny model."""
import pytest

from icqs.options import parse_rating


@pytest.mark.parametrize("text,expected", [
    ('{"rating": "7", "reason": "clear and correct"}', 7),
    ('{"rating": 10, "reason": "perfect"}', 10),
    ('Sure! {"reason": "ok", "rating": "3"} done', 3),
    ("The answer is fine. Rating: [[8]]", 8),
    ("[[ 2 ]]", 2),
    ("[[6.0]]", 6),
    ('"rating": "9", "reason": "unterminated json', 9),
    ("rating = 4/10", 4),
    ('{"rating": "", "reason": ""}', None),   # the template itself, unfilled
    ('{"rating": "11"}', None),               # out of range
    ("Rating: [[0]]", None),
    ("Rating: [[7.5]]", None),                # not an integer rating
    ("I think it is good.", None),
    ("", None),
])
def test_parse_rating(text, expected):
    assert parse_rating(text) == expected


def test_parse_rating_custom_range():
    assert parse_rating("[[0]]", low=0, high=5) == 0
    assert parse_rating("[[6]]", low=0, high=5) is None
