"""`icqs allure run|review|report` end to end on a tiny random model, and its one-line errors."""

import json

import pytest

from icqs.cli import main

TEMPLATE_YAML = 'system: Grade.\nuser: "R: {response}\\nA: {answer}"\nmatch: number\n'


@pytest.fixture
def files(tmp_path):
    items = tmp_path / "items.jsonl"
    rows = [dict(id=f"q{i}", response=f"so {i + (i % 2)}", answer=str(i)) for i in range(8)]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    template = tmp_path / "short.yaml"
    template.write_text(TEMPLATE_YAML)
    return items, template


def run_args(files, tiny_model_dir, out, *extra):
    items, template = files
    return [
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
        *extra,
    ]


def test_run_resume_report(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(run_args(files, tiny_model_dir, out, "--rounds", "2", "--sweep", "0,1")) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0] == "ALLURE: the evaluator per round" and lines[1].split()[:4] == ["round", "ICL", "examples", "new"]
    assert lines[2].split()[:2] == ["1", "0"] and "{" not in table  # a table, no JSON
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"][0]["round"] == 1 and summary["sweep"][0]["n"] == 0
    html = (out / "report.html").read_text()
    assert "<h2>Rounds</h2>" in html and html.count("data:image/png;base64,") >= 2
    n_evals = len((out / "evals.jsonl").read_text().splitlines())
    assert main(run_args(files, tiny_model_dir, out, "--rounds", "2", "--sweep", "0,1")) == 0  # resume: no work
    assert len((out / "evals.jsonl").read_text().splitlines()) == n_evals
    (out / "report.html").unlink()
    assert main(["allure", "report", str(out)]) == 0
    assert (out / "report.html").read_text().count("data:image/png;base64,") >= 2


def test_review_accept_reject_tag(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(run_args(files, tiny_model_dir, out, "--rounds", "3", "--review")) == 0
    err = capsys.readouterr().err
    mem = str(out / "memory.sqlite")
    from icqs.allure.memory import Memory

    with Memory(mem) as m:
        pending = [e.id for e in m.examples(status="pending")]
    assert pending and "await review" in err
    assert (
        main(
            [
                "allure",
                "review",
                "--memory",
                mem,
                "--accept",
                str(pending[0]),
                "--reject",
                ",".join(map(str, pending[1:])),
                "--tag",
                f"{pending[0]}=deceived by keywords",
            ]
        )
        == 0
    )
    with Memory(mem) as m:
        assert [e.id for e in m.accepted()] == [pending[0]]
        assert m.get(pending[0]).failure_mode == "deceived by keywords"
    assert main(["allure", "review", "--memory", mem, "--accept", "999"]) == 2
    assert "no example with id 999" in capsys.readouterr().err
    assert main(run_args(files, tiny_model_dir, out, "--rounds", "2", "--review")) == 0
    stages = [json.loads(x) for x in (out / "stages.jsonl").read_text().splitlines()]
    assert [s["icl_ids"] for s in stages if s["kind"] == "round"] == [[], [pending[0]]]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "x", "response": "so 4"}', "missing field 'answer' (the task's correct answer) or 'label'"),
        ('{"id": "x", "response": "so 4", "answer": true}', "'answer' is the boolean true, not text"),
        ('{"id": "x", "response": "so 4", "answer": "4", "match": "digits"}', "unknown match kind"),
        ('{"id": "q1", "response": "so 4", "answer": "4"}', "duplicate id 'q1'"),
        ('{"id": "x", "response": "so 4", "answer": "4"', "not valid JSON"),
    ],
)
def test_bad_items_one_line_error_no_output(files, tiny_model_dir, tmp_path, capsys, bad_line, message):
    items, _ = files
    items.write_text(items.read_text() + "\n" + bad_line + "\n")  # line 10 (line 9 is blank)
    out = tmp_path / "run"
    assert main(run_args(files, tiny_model_dir, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {items}:10: ") and message in err and "\n" not in err
    assert not out.exists()


def test_bad_template_and_flags(files, tiny_model_dir, tmp_path, capsys):
    items, template = files
    template.write_text('system: Grade.\nuser: "R: {response"\n')
    assert main(run_args(files, tiny_model_dir, tmp_path / "a")) == 2
    assert "bad 'user' format string" in capsys.readouterr().err
    template.write_text(TEMPLATE_YAML)
    assert main(run_args(files, tiny_model_dir, tmp_path / "b", "--sweep", "0,x")) == 2
    assert "--sweep must be comma-separated integers" in capsys.readouterr().err
    assert main(["allure", "report", str(tmp_path)]) == 2
    assert "not an ALLURE run directory" in capsys.readouterr().err
