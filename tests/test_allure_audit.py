"""ALLURE audit: regex matching of responses against the correct answer, and the evaluator's disagreements."""

import pytest

from engine.errors import UserError
from icqs.allure.audit import (
    MatchSpec,
    MatchSpecError,
    disagreements,
    extract_node_list,
    extract_number,
    extract_option,
    is_correct,
    truth,
)

NUMBER = MatchSpec.parse("number")


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("Seven plus two is 9. So there are 9 apples.", "9 apples", 1),
        ("There are 7 red and 2 green, 7 + 2 = 10 apples.", "9 apples", 0),
        ("The answer is 15, since 9 + 6 = 15.", "15 balls", 1),  # the answer mark wins over the last number
        ("The answer is 12. Check: 9 + 6 = 15.", "15 balls", 0),
        ("She has $1,250.50 left.", "1250.5 dollars", 1),
        ("Each gets 3/4 of a pie", "0.75", 1),
        ("Answer: -4", "-4 degrees", 1),
        ("I don't know.", "4", 0),
        ("There were 16 oranges", "16 oranges", 1),
    ],
)
def test_number_match(response, answer, expected):
    assert is_correct(response, answer, NUMBER)[0] == expected


def test_number_which_first():
    spec = MatchSpec.parse({"kind": "number", "which": "first"})
    assert is_correct("9 apples, not 10", "9", spec)[0] == 1
    assert is_correct("9 apples, not 10", "9", NUMBER)[0] == 0
    assert extract_number("no digits here") is None


@pytest.mark.parametrize(
    "response, letter",
    [
        ("The answer is (C).", "C"),
        ("Answer: b", "B"),
        ("I pick D) because ...", "D"),
        ("A. It rains", "A"),
        ("(B) seems right", "B"),
        ("Nothing matches", None),
    ],
)
def test_option_letters(response, letter):
    assert extract_option(response) == letter


def test_option_match():
    spec = MatchSpec.parse("option")
    assert is_correct("The answer is (C).", "C", spec)[0] == 1
    assert is_correct("The answer is (C).", "(A)", spec)[0] == 0


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("1, Left, 2", "1, 2", 1),  # the paper's Fig. 4: the edge name is not a node
        ("Room 1, Room 3", "1, 3", 1),  # deceived-by-keywords example: the regex audit says correct
        ("1, left, 2, left, 6", "1, 3, 6", 0),  # partial correctness
        ("Step 1: Zone 1 -> Zone 3 ($50)\nAnswer: 1, 2, 5", "1, 8, 4", 0),  # lengthy argument: the final list counts
        ("Step 2: look at zones\nAnswer: 1, 8, 4", "1, 8, 4", 1),
        ("3, 6", "3, 6, 7", 0),
    ],
)
def test_node_lists(response, answer, expected):
    assert is_correct(response, answer, MatchSpec.parse("node_list"))[0] == expected


def test_node_list_extraction():
    assert extract_node_list("Answer: 1, 3, 6") == [1, 3, 6]
    assert extract_node_list("go 2 then 4.5 then 7") == [2, 7]


def test_regex_match():
    spec = MatchSpec.parse({"kind": "regex", "pattern": r"(yes|no)\b"})
    assert is_correct("Hmm, no. Actually yes", "Yes", spec)[0] == 1  # last match in the response
    assert is_correct("No", "yes", spec)[0] == 0
    spec = MatchSpec.parse({"kind": "regex", "pattern": r"[A-Z][a-z]+ [A-Z][a-z]+"})
    assert is_correct("It was  mrs hilt? No: Mrs Hilt", "Mrs Hilt", spec)[0] == 1


@pytest.mark.parametrize(
    "bad",
    [
        "digits",
        {"which": "last"},
        {"kind": "number", "which": "middle"},
        {"kind": "regex"},
        {"kind": "regex", "pattern": "("},
        {"kind": "number", "colour": 1},
        3,
    ],
)
def test_bad_specs(bad):
    with pytest.raises(MatchSpecError):
        MatchSpec.parse(bad)


def test_text_answers_match_after_normalizing():
    """A text answer under the default number spec (the issue's "no number in the correct answer") and the text
    kind: case, whitespace and end punctuation do not count, anything else does."""
    assert is_correct("mrs.  hilt", "Mrs. Hilt", NUMBER)[0] == 1
    assert is_correct("Paris.", "paris", MatchSpec.parse("text"))[0] == 1
    assert is_correct("Paris, France", "Paris", MatchSpec.parse("text"))[0] == 0
    assert is_correct("9", "Mrs. Hilt", NUMBER)[0] == 0


def test_label_only_rows_are_their_own_truth(tmp_path):
    from icqs.allure.tasks import load_items
    from icqs.allure.template import load_template

    p = tmp_path / "items.jsonl"
    p.write_text('{"id": "a", "response": "x", "label": 1}\n{"id": "b", "response": "y", "label": 0}\n')
    t = tmp_path / "t.yaml"
    t.write_text("system: Is the response right?\nuser: 'Response: {response}'\nmatch: number\n")
    assert [r["truth"] for r in load_items(p, load_template(str(t)))] == [1, 0]
    with pytest.raises(UserError, match="items.jsonl:1: a row with a label and no answer needs a template"):
        load_items(p, load_template("answer"))


def test_truth_uses_item_spec_or_label():
    assert truth({"response": "B", "answer": "B", "match": "option"}, NUMBER) == 1
    assert truth({"response": "anything", "label": 0, "match": "label"}, NUMBER) == 0
    assert truth({"response": "so 4", "answer": "4"}, NUMBER) == 1


def test_disagreements_name_error_kinds():
    assert disagreements([1, 0, 1, 0], [1, 1, 0, 0]) == [(1, "false_positive"), (2, "false_negative")]
    assert disagreements([], []) == []


def test_rounds_plot_names_the_audit_line_instead_of_hiding_it_under_all():
    """Why: the ALLURE report hid the audit line under 'all' (without a holdout they are the same)."""
    from icqs.allure.plots import round_series

    rounds = [{"round": r, "audit": {"f1": f}, "all": {"f1": f}} for r, f in ((0, 0.4), (1, 0.6))]
    assert round_series(rounds, "f1") == {"audit (= all: no holdout)": [0.4, 0.6]}
    rounds = [{"round": 0, "audit": {"f1": 0.4}, "holdout": {"f1": 0.5}, "all": {"f1": 0.45}}]
    assert list(round_series(rounds, "f1")) == ["audit", "holdout", "all"]
    assert round_series([{"round": 0, "audit": {"f1": 0.4}}], "auc") == {}  # no data: no (empty) legend entry
