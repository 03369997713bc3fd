"""Inputs that silently changed results or took many reruns (issue 37): the header joined to the first demo by the
separator, every type error of a YAML file in one message, "did you mean" for unknown keys and fields, and a hint
when TASK and CANDIDATES are given the other way round."""

import json

import pytest

from engine.errors import UserError
from icqs.allure.tasks import load_items
from icqs.allure.template import load_template, template_from_dict
from icqs.cli import main
from icqs.task import Example, Task, load_task

FIVE_ERRORS = """name: yesno
template: "Q: {x}\\nA: {y}"
lables: ["no", "yes"]
M: two
good:
  - {x: "Is it raining?", y: no}
  - {x: "Is the sky blue?", y: "yes"}
bad:
  - {x: "Is fire cold?", y: yes}
  - {x: 3, y: "no"}
"""


def test_every_type_error_of_a_yaml_file_in_one_message(tmp_path):
    p = tmp_path / "task.yaml"
    p.write_text(FIVE_ERRORS)
    with pytest.raises(UserError) as e:
        load_task(p)
    text = str(e.value)
    assert "\n" not in text and text.endswith("(5 problems)")
    assert text.startswith(f"{p}:3: unknown key 'lables' (did you mean 'labels'?)")
    for part in (
        "; line 4: 'M': 'two' is not of type 'integer'",
        "; line 6: 'good' item 1 field 'y' is the YAML boolean 'no', not text; quote it: \"no\"",
        "; line 9: 'bad' item 1 field 'y' is the YAML boolean 'yes', not text",
        "; line 10: 'bad' item 2 field 'x' is the YAML number '3', not text",
    ):
        assert part in text
    assert text.index("line 4:") < text.index("line 6:") < text.index("line 9:") < text.index("line 10:")


def test_one_error_reads_as_before(tmp_path):
    p = tmp_path / "task.yaml"
    p.write_text(
        FIVE_ERRORS.replace("lables", "labels")
        .replace("two", "2")
        .replace("y: no}", 'y: "no"}')
        .replace("y: yes}", 'y: "yes"}')
    )
    with pytest.raises(UserError) as e:
        load_task(p)
    assert str(e.value) == f"{p}:10: 'bad' item 2 field 'x' is the YAML number '3', not text; quote it: \"3\""


def test_unknown_template_key_and_field_suggest_the_close_name(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text("system: Grade.\nuser: 'R: {response}'\nlabel_prefx: 'verdict:'\n")
    with pytest.raises(UserError, match=r"t\.yaml:3: unknown key 'label_prefx' \(did you mean 'label_prefix'\?\)"):
        load_template(str(t))
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps(dict(id="a", question="2+2?", response="4", answer="4")) + "\n")
    template = template_from_dict(dict(name="t", system="Grade.", user="Q: {questoin} R: {response}"))
    with pytest.raises(
        UserError,
        match=r"items\.jsonl:1: missing field\(s\) 'questoin' used by template 't' "
        r"\(did you mean 'question'\?\)",
    ):
        load_items(items, template)


def test_header_is_joined_to_the_first_demo_by_the_separator():
    task = Task(
        "t",
        "Q: {x}\nA: {y}",
        [Example("1+1?", "2")],
        [Example("1+1?", "3")],
        header="Answer briefly.",
        separator="\n###\n",
    )
    assert task.demo_text(task.good) == "Answer briefly.\n###\nQ: 1+1?\nA: 2\n###\n"
    task.header = ""
    assert task.demo_text(task.good) == "Q: 1+1?\nA: 2\n###\n"


def test_preview_shows_the_header_and_separator(tmp_path, tiny_model_dir, capsys):
    assert main(["init", str(tmp_path / "ex")]) == 0
    task = tmp_path / "ex" / "task.yaml"
    task.write_text(task.read_text() + 'header: "Answer each question briefly."\n')
    capsys.readouterr()
    assert (
        main(["preview", str(task), "--model", str(tiny_model_dir), "--method", "icqs", "--draws", "1", "--no-audit"])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "prompt layout: the header 'Answer each question briefly.', then the demos, each followed by the "
        "separator '\\n\\n', then the candidate" in out
    )
    assert "  Answer each question briefly.\n  \n  Review: " in out  # the separator, not glued to the demo


@pytest.mark.parametrize("command", ["score", "preview"])
def test_swapped_task_and_candidates_say_so(tmp_path, capsys, command):
    assert main(["init", str(tmp_path / "ex")]) == 0
    capsys.readouterr()
    cands, task = tmp_path / "ex" / "candidates.jsonl", tmp_path / "ex" / "task.yaml"
    extra = ["--out", str(tmp_path / "run")] if command == "score" else []
    assert main([command, str(cands), str(task), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(
            f"error: {cands}: this looks like a JSONL file of candidates, not a task YAML: the order "
            f"is `icqs {command} TASK.yaml CANDIDATES.jsonl` (swapped?)"
        )
        and "\n" not in err
    )
    assert not (tmp_path / "run").exists()
