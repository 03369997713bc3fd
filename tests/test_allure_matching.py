"""ALLURE ground truth: the match kinds (exact, contains, regex, number, option), the rule each states, the counts
and examples printed before any work, and the warning for a constant evaluator (issue 37)."""

import json

import numpy as np
import pytest

from icqs.allure.audit import KINDS, RULES, MatchSpec, MatchSpecError, is_correct
from icqs.allure.evaluator import Labels
from icqs.allure.loop import evaluator_warnings, iterate
from icqs.allure.memory import Memory
from icqs.allure.run_dir import AuditRun
from icqs.allure.tasks import ground_truth_text, load_items
from icqs.allure.template import template_from_dict
from icqs.cli import main


@pytest.mark.parametrize(
    "kind, response, answer, right",
    [
        ("exact", "I think the answer is Paris.", "Paris", 1),  # the response: the final answer after the mark
        ("exact", "The answer is: **Paris**", "Paris", 1),
        ("exact", "Answer:\nParis\nIt is the capital.", "paris", 1),
        ("exact", "Paris.", "paris", 1),
        ("exact", "Paris, France", "Paris", 0),
        ("exact", "I think the answer is Lyon.", "Paris", 0),
        ("exact", "The answer is not Paris.", "Paris", 0),
        ("text", "I think the answer is Paris.", "Paris", 1),  # the earlier name, matched by the exact rule
        ("contains", "It is Paris, I think.", "Paris", 1),
        ("contains", "Parisian cafes", "Paris", 0),  # whole words only
        ("contains", "I think it is Lyon", "Paris", 0),
        ("contains", "It costs $3.50 today", "$3.50", 1),
        ("number", "I think the answer is Paris.", "Paris", 1),  # a text answer under number: the exact rule
        ("number", "so there are 9 in all", "9 apples", 1),
        ("option", "I would pick (C) here", "C", 1),
    ],
)
def test_match_kinds(kind, response, answer, right):
    assert is_correct(response, answer, MatchSpec.parse(kind)).right == right


def test_a_text_spec_reports_the_exact_rule_and_what_it_read():
    m = is_correct("I think the answer is Paris.", "Paris", MatchSpec.parse("text"))
    assert (m.kind, m.read, m.expected) == ("exact", "paris", "paris")


def test_every_kind_has_its_rule_in_the_schema(capsys):
    assert set(KINDS) == set(RULES) | {"text"}
    assert main(["schema", "allure"]) == 0
    printed = json.loads(capsys.readouterr().out)["properties"]["match"]["description"]
    for kind, rule in RULES.items():
        assert f"{kind}: {rule}" in printed
    assert "text: the earlier name of exact" in printed


def test_unknown_kind_suggests_the_close_one():
    with pytest.raises(MatchSpecError, match=r"unknown match kind 'exakt' \(did you mean 'exact'\?\)"):
        MatchSpec.parse("exakt")
    with pytest.raises(MatchSpecError, match=r"unknown option 'patern' in the match spec \(did you mean 'pattern'"):
        MatchSpec.parse({"kind": "regex", "patern": "x"})


CITIES = [
    ("France", "Paris", "I think the answer is Paris."),
    ("Italy", "Rome", "The answer is Rome"),
    ("Spain", "Madrid", "Madrid."),
    ("Japan", "Tokyo", "I think the answer is Kyoto."),
    ("Peru", "Lima", "It must be Cusco, I believe."),
    ("Chile", "Santiago", "Answer: Santiago"),
]
TRUTH = [1, 1, 1, 0, 0, 1]


def _city_items(tmp_path, match="text"):
    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(json.dumps(dict(id=c, question=f"Capital of {c}?", response=r, answer=a)) + "\n" for c, a, r in CITIES)
    )
    template = tmp_path / "t.yaml"
    template.write_text(f'system: Grade.\nuser: "Q: {{question}}\\nR: {{response}}\\nA: {{answer}}"\nmatch: {match}\n')
    return items, template


def test_free_text_run_gets_the_right_ground_truth(tmp_path, tiny_model_dir, capsys):
    """The issue's run: free-text answers embedded in sentences, `match: text` (a task file of today)."""
    items, template = _city_items(tmp_path)
    out = tmp_path / "run"
    assert (
        main(
            [
                "allure",
                "run",
                str(items),
                "--out",
                str(out),
                "--model",
                str(tiny_model_dir),
                "--dtype",
                "float32",
                "--template",
                str(template),
                "--rounds",
                "1",
            ]
        )
        == 0
    )
    evals = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    assert [e["truth"] for e in evals] == TRUTH
    err = capsys.readouterr().err
    head = err[: err.index("round-1") if "round-1" in err else len(err)]  # printed before the evaluator runs
    assert "ground truth: 4 of 6 responses right" in head
    assert f"  exact (for match 'text'): 4 right, 2 wrong of 6; {RULES['exact']}" in head
    assert "    right  France: 'I think the answer is Paris.' -> read 'paris' = expected 'paris'" in head
    assert "    wrong  Japan: 'I think the answer is Kyoto.' -> read 'kyoto' != expected 'tokyo'" in head
    assert sum(line.startswith("    right") for line in head.splitlines()) == 3  # three examples of each
    assert sum(line.startswith("    wrong") for line in head.splitlines()) == 2
    truth = json.loads((out / "summary.json").read_text())["ground_truth"]  # and the report keeps it
    assert [(g["kind"], g["named"], g["right"], g["wrong"]) for g in truth] == [("exact", "text", 4, 2)]
    assert truth[0]["examples"]["wrong"][0] == dict(
        id="Japan", response="I think the answer is Kyoto.", read="kyoto", expected="tokyo"
    )
    assert "<h2>Ground truth</h2>" in (out / "report.html").read_text()


def test_ground_truth_groups_by_kind_and_warns_when_constant(tmp_path):
    items, template = _city_items(tmp_path, match="contains")
    rows = items.read_text().splitlines()
    rows.append(json.dumps(dict(id="x", question="?", response="B", answer="B", match="option")))
    items.write_text("\n".join(rows) + "\n")
    t = template_from_dict(dict(name="t", system="Grade.", user="{response} {answer}", match="contains"))
    text = ground_truth_text(load_items(items, t), t)
    assert "  contains: 4 right, 2 wrong of 6" in text and "  option: 1 right, 0 wrong of 1" in text
    assert "warning" not in text
    t = template_from_dict(dict(name="t", system="Grade.", user="{response} {answer}", match="number"))
    items.write_text(json.dumps(dict(id="y", response="no idea", answer="4")) + "\n")
    assert "warning: every response counts as wrong" in ground_truth_text(load_items(items, t), t)


class ConstantEvaluator:
    """Labels every item 1, whatever it says."""

    def __init__(self, template):
        self.template = template

    def label(self, items, examples):
        return Labels(np.full(len(items), 0.9), np.ones(len(items), dtype=int))


def test_a_constant_evaluator_warns_every_round(tmp_path, capsys):
    items, _ = _city_items(tmp_path)
    t = template_from_dict(dict(name="t", system="Grade.", user="{response} {answer}", match="exact"))
    rows = load_items(items, t)
    settings = dict(tasks_sha256="x", template=t.to_dict(), model="const", holdout=0.0, seed=0)
    run = AuditRun(tmp_path / "run", rows, settings)
    with run.start(), Memory(tmp_path / "mem.sqlite") as mem:
        iterate(run, ConstantEvaluator(t), mem, rounds=2)
    err = capsys.readouterr().err
    for r in (1, 2):
        assert f"warning: round {r}: the evaluator labelled all 6 items 1 (right), whatever the response" in err


def test_evaluator_warnings():
    rows = lambda truth, label: [dict(truth=t, label=lab) for t, lab in zip(truth, label)]  # noqa: E731
    assert evaluator_warnings(rows([1, 0, 1], [1, 0, 0])) == []
    assert "all 3 items 0 (wrong)" in evaluator_warnings(rows([1, 0, 1], [0, 0, 0]))[0]
    assert "F1 is 0.00" in evaluator_warnings(rows([1, 0, 1], [0, 1, 0]))[0]
    assert evaluator_warnings([]) == []


def test_rows_without_ids_are_found_again_however_the_path_is_spelled(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """Why: the default id was the path as given ("items.jsonl:1"), and `icqs audit | report DIR` re-read the items
    by their absolute path ("/tmp/.../items.jsonl:1"): no row matched, "no completed round yet"."""
    items, template = _city_items(tmp_path)
    items.write_text(
        "".join(
            json.dumps({k: v for k, v in json.loads(line).items() if k != "id"}) + "\n"
            for line in items.read_text().splitlines()
        )
    )
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "allure",
                "run",
                "items.jsonl",
                "--out",
                "run",
                "--model",
                str(tiny_model_dir),
                "--dtype",
                "float32",
                "--template",
                "t.yaml",
                "--rounds",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    monkeypatch.chdir(tmp_path.parent)
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "run"), "--json"]) == 0
    rounds = json.loads(capsys.readouterr().out)["rounds"]
    assert [r["round"] for r in rounds] == [1] and rounds[0]["all"]["n"] == len(CITIES)
