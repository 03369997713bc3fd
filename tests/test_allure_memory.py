"""ALLURE memory: SQLite round trip, de-duplication, review decisions, failure-mode tags, bad files."""

import sqlite3

import pytest

from engine.errors import UserError
from icqs.allure.memory import Example, Memory


def _example(i: int, **kw) -> Example:
    d = dict(
        item_id=f"q{i}",
        user_text=f"Response: {i}\nExpected answer: 9",
        assistant_text="label: 0",
        response=str(i),
        answer="9",
        correct_label=0,
        evaluator_label=1,
        evaluator_prob=0.8,
        error_kind="false_positive",
        run_id="r1",
        round=1,
        provenance={"tasks": "t.jsonl", "model": "tiny"},
    )
    d.update(kw)
    return Example(**d)


def test_round_trip(tmp_path):
    path = tmp_path / "mem.sqlite"
    with Memory(path) as mem:
        a = mem.add(_example(1))
        b = mem.add(_example(2, status="pending", round=2, answer=None, evaluator_prob=None))
        assert a is not None and b is not None and a != b
    with Memory(path) as mem:  # persisted
        got = mem.examples()
        assert [e.id for e in got] == [a, b]
        first = mem.get(a)
        assert first == _example(1, id=a, created_at=first.created_at)
        assert first.provenance == {"tasks": "t.jsonl", "model": "tiny"}
        assert first.turns == ("Response: 1\nExpected answer: 9", "label: 0")
        assert mem.get(b).answer is None and mem.get(b).evaluator_prob is None
        assert [e.id for e in mem.accepted()] == [a]
        assert [e.id for e in mem.examples(run_id="r1", round=2)] == [b]
        assert [e.id for e in mem.examples(ids=[b])] == [b]
        assert mem.counts() == dict(pending=1, accepted=1, rejected=0)


def test_same_turns_are_stored_once(tmp_path):
    with Memory(tmp_path / "m.sqlite") as mem:
        assert mem.add(_example(1)) is not None
        assert mem.add(_example(1, round=3, item_id="other")) is None
        assert len(mem.examples()) == 1
        assert mem.add(_example(1, assistant_text="label: 1", correct_label=1)) is not None


def test_review_and_tag(tmp_path):
    with Memory(tmp_path / "m.sqlite") as mem:
        i = mem.add(_example(1, status="pending"))
        j = mem.add(_example(2, status="pending"))
        mem.review(i, "accepted")
        mem.review(j, "rejected")
        assert [e.id for e in mem.accepted()] == [i]
        assert mem.get(j).status == "rejected" and mem.get(j).reviewed_at
        mem.tag(i, "deceived by keywords")
        assert mem.get(i).failure_mode == "deceived by keywords"
        with pytest.raises(UserError):
            mem.review(i, "maybe")
        with pytest.raises(UserError):
            mem.get(999)


def test_bad_values_rejected(tmp_path):
    with Memory(tmp_path / "m.sqlite") as mem:
        with pytest.raises(ValueError):
            mem.add(_example(1, status="unsure"))
        with pytest.raises(ValueError):
            mem.add(_example(2, correct_label=2))
        assert mem.examples() == []
        mem.add(_example(3))
        with pytest.raises(sqlite3.IntegrityError):  # the table's own CHECK, for writers other than add()
            mem.db.execute("UPDATE examples SET correct_label = 5")


def test_not_a_database(tmp_path):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("these are notes, not a database\n" * 20)
    with pytest.raises(UserError, match="not an ICL memory"):
        Memory(bad)
