"""Task YAML and candidates JSONL: correct files load; bad ones give one-line errors naming file:line."""

import pytest

from engine.errors import UserError
from icqs.candidates import candidate_row, check_truth_dists, read_candidates
from icqs.task import load_task, task_from_dict, task_to_dict

TASK = """name: senti
template: "Sentence: {x}\\nAnswer: {y}"
good:
  - {x: "a fine film", y: positive}
  - {x: "a dull film", y: negative}
  - {x: "a great film", y: positive}
bad: bad.jsonl
M: 2
N: 3
"""


BAD = '{"x": "a fine film", "y": "negative"}\n{"x": "a dull film", "y": "positive"}\n{"x": "a bad film", "y": "positive"}\n'


def _write(tmp_path, text, bad=BAD):
    (tmp_path / "bad.jsonl").write_text(bad)
    p = tmp_path / "task.yaml"
    p.write_text(text)
    return p


def test_task_loads_with_defaults_and_parts(tmp_path):
    t = load_task(_write(tmp_path, TASK))
    assert (t.name, t.M, t.N, t.L, t.seed, t.separator) == ("senti", 2, 3, 3, 0, "\n\n")
    assert t.ratios == [0.0, 2 / 3, 1.0] and t.labels == ["negative", "positive"]
    assert t.good_counts == [0, 2, 3]  # the realised ratios: round(1.5) = 2 of the 3 demos good
    assert t.bad[0].y == "negative" and len(t.good) == 3
    assert t.x_part("wow") == "Sentence: wow\nAnswer: " and t.y_part("positive") == "positive"
    assert task_from_dict(task_to_dict(t)) == t


@pytest.mark.parametrize(
    "text, line, what",
    [
        (TASK.replace("M: 2", "M: 0"), 8, "'M': 0 is less than the minimum of 1"),
        (TASK.replace("N: 3", "N: [3"), 10, "invalid YAML"),
        (TASK + "Lx: 3\n", 10, "unknown key 'Lx'"),
        (
            TASK.replace('{x: "a dull film", y: negative}', '{x: "a dull film"}'),
            5,
            "missing field 'y' in 'good' item 2: the answer",
        ),
        (TASK.replace("N: 3", "N: 4"), 9, "N = 4 demos per set, but 'good' has only 3 examples"),
        (TASK.replace("Answer: {y}", "Answer:"), 2, "must contain {x} once and then {y} once"),
    ],
)
def test_task_errors_name_the_line(tmp_path, text, line, what):
    p = _write(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_task(p)
    assert str(e.value).startswith(f"{p}:{line}: ") and what in str(e.value), str(e.value)


def test_task_pool_file_errors_name_the_pool_file(tmp_path):
    p = _write(tmp_path, TASK, bad='{"x": "ok", "y": "negative"}\n{"x": "no y"}\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: missing field 'y'"):
        load_task(p)


def _cands(tmp_path, text):
    p = tmp_path / "c.jsonl"
    p.write_text(text)
    return p


def test_candidates_load_and_round_trip(tmp_path):
    p = _cands(
        tmp_path,
        '{"id": 1, "model": "m", "x": "q", "y": "a", "truth": 1, "note": "kept"}\n\n'
        '{"id": "2", "model": "m", "x": "q", "y": "b", "truth_dist": [0.5, 0.25, 0.25]}\n',
    )
    c = read_candidates(p)
    assert [x.id for x in c] == ["1", "2"] and c[0].truth == 1.0 and c[0].extra == {"note": "kept"}
    assert c[1].line == 3 and candidate_row(c[0]) == {
        "id": "1",
        "model": "m",
        "x": "q",
        "y": "a",
        "note": "kept",
        "truth": 1.0,
    }
    check_truth_dists(c, 3, str(p))
    with pytest.raises(UserError, match=r"c\.jsonl:3: candidate '2': 'truth_dist' has 3 entries"):
        check_truth_dists(c, 5, str(p))


@pytest.mark.parametrize(
    "text, line, what",
    [
        (
            '{"id": 1, "model": "m", "x": "q", "y": "a"}\n{"id": 1, "model": "m", "x": "q", "y": "b"}\n',
            2,
            "duplicate id '1' (first on line 1)",
        ),
        ('{"id": 1, "model": "m", "x": "q"}\n', 1, "missing field 'y'"),
        ('{"id": 1, "model": "m", "x": "q", "y": 3}\n', 1, "'y' is the number 3, not text; quote it"),
        ('{"id": 1, "model": "m", "x": "q", "y": "a", "truth": 2}\n', 1, "'truth': 2 is greater than the maximum of 1"),
        ('{"id": 1, "model": "m", "x": "q", "y": "a", "truth_dist": [0.5, 0.2]}\n', 1, "summing to 1"),
    ],
)
def test_candidate_errors_name_the_line(tmp_path, text, line, what):
    p = _cands(tmp_path, text)
    with pytest.raises(UserError) as e:
        read_candidates(p)
    assert str(e.value).startswith(f"{p}:{line}: ") and what in str(e.value), str(e.value)
