"""Data contracts (issue 22, part 1): each input format has a JSON Schema in the package, used by the readers;
text must be text; answers must be labels; options that do nothing are errors; a refused rerun says what changed."""

import json

import jsonschema
import pytest

from engine.errors import UserError
from icqs.candidates import check_labels, read_candidates
from icqs.cli import build_parser, main
from icqs.contracts import NAMES, schema
from icqs.run import RunDir
from icqs.task import load_task

BASE = """name: yn
template: "Q: {x}\\nA: {y}"
good: [{x: one, y: "yes"}, {x: two, y: "no"}]
bad: [{x: one, y: "no"}, {x: two, y: "yes"}]
labels: ["no", "yes"]
M: 2
N: 2
"""


def _task(tmp_path, text):
    p = tmp_path / "task.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "old, new, line, what",
    [
        (
            'labels: ["no", "yes"]',
            "labels: [no, yes]",
            5,
            "'labels' item 1 is the YAML boolean 'no', not text; quote it",
        ),
        ('{x: two, y: "no"}]', "{x: two, y: null}]", 3, "'good' item 2 field 'y' is the YAML null 'null', not text"),
        ('{x: one, y: "no"}', '{x: !!binary aGk=, y: "no"}', 4, "'bad' item 1 field 'x' is the YAML binary"),
        ('{x: one, y: "yes"}', '{x: 12, y: "yes"}', 3, "'good' item 1 field 'x' is the YAML number '12'"),
    ],
)
def test_yaml_values_that_are_not_text_are_errors_naming_the_line(tmp_path, old, new, line, what):
    """Why: `labels: [no, yes]` became booleans, demos said "True"/"False"; `y: null` became "None"."""
    p = _task(tmp_path, BASE.replace(old, new))
    with pytest.raises(UserError) as e:
        load_task(p)
    assert str(e.value).startswith(f"{p}:{line}: {what}"), str(e.value)


def test_missing_key_says_what_it_holds(tmp_path):
    p = _task(tmp_path, BASE.replace('good: [{x: one, y: "yes"}, {x: two, y: "no"}]\n', ""))
    with pytest.raises(UserError, match=r"missing key 'good': the good examples Z_g: inputs with a RIGHT answer"):
        load_task(p)


def test_candidate_answer_outside_the_labels_is_an_error(tmp_path):
    """Why: a candidate answering "Yes." on a yes/no task was never flagged."""
    task = load_task(_task(tmp_path, BASE))
    c = tmp_path / "c.jsonl"
    c.write_text('{"id": 1, "model": "m", "x": "q", "y": "yes"}\n{"id": 2, "model": "m", "x": "q", "y": "Yes."}\n')
    with pytest.raises(
        UserError,
        match=r"c\.jsonl:2: candidate '2': answer 'Yes\.' is none of the task's labels "
        r"\('no', 'yes'\)",
    ):
        check_labels(read_candidates(c), task, str(c))


def test_every_schema_is_valid_and_its_examples_pass():
    for name in NAMES:
        s = schema(name)
        jsonschema.Draft202012Validator.check_schema(s)
        for example in s["examples"]:
            jsonschema.validate(example, s)


def test_schema_command_and_help_name_the_formats(capsys):
    assert main(["schema", "task"]) == 0
    assert json.loads(capsys.readouterr().out)["required"] == ["template", "good", "bad"]
    parser = build_parser()
    actions = {a.dest: a for a in parser._subparsers._actions if a.dest == "command"}["command"].choices
    for command, fmt in (
        ("score", "icqs schema task"),
        ("judge", "icqs schema judge"),
        ("pairwise", "icqs schema pairwise"),
    ):
        assert fmt in " ".join(actions[command].format_help().split()), command
    allure_run = actions["allure"]._subparsers._group_actions[0].choices["run"]
    assert "icqs schema allure" in " ".join(allure_run.format_help().split())


def test_init_writes_a_working_example(tmp_path, capsys):
    assert main(["init", str(tmp_path / "ex")]) == 0
    task = load_task(tmp_path / "ex" / "task.yaml")
    cands = read_candidates(tmp_path / "ex" / "candidates.jsonl")
    check_labels(cands, task, "c")
    assert task.is_label_task and len({c.model for c in cands}) == 3
    assert main(["init", str(tmp_path / "ex")]) == 2  # never overwrites
    assert "does not overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, what",
    [
        (["--workers", "2"], "--workers does nothing without --ray"),
        (["--worker", "2"], "unrecognized arguments: --worker 2"),
        (["--naive-partition"], "--naive-partition does nothing without --ray"),
    ],
)
def test_options_that_do_nothing_are_errors(tmp_path, capsys, argv, what):
    """Why: `--workers 2` without --ray and the abbreviation `--worker 2` were silently ignored."""
    p = _task(tmp_path, BASE)
    c = tmp_path / "c.jsonl"
    c.write_text('{"id": 1, "model": "m", "x": "q", "y": "yes"}\n')
    try:
        status = main(["score", str(p), str(c), "--out", str(tmp_path / "run"), *argv])
    except SystemExit as e:  # argparse's own errors
        status = e.code
    assert status == 2 and what in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_n_larger_than_the_pool_is_an_error(tmp_path, capsys):
    """Why: `N: 40` with 16 good examples was silently served by repeating examples."""
    p = _task(tmp_path, BASE)
    c = tmp_path / "c.jsonl"
    c.write_text('{"id": 1, "model": "m", "x": "q", "y": "yes"}\n')
    assert main(["score", str(p), str(c), "--out", str(tmp_path / "run"), "--N", "3"]) == 2
    assert "N = 3 demos per set, but 'good' has only 2 examples" in capsys.readouterr().err


def test_icl_on_free_text_is_refused(tmp_path, capsys):
    """Why: plain ICL on a free-text task scored 0 for every candidate (`Spearman +nan`)."""
    text = (
        BASE.replace('labels: ["no", "yes"]\n', "")
        .replace('y: "yes"', "y: a long answer")
        .replace('y: "no"', "y: another answer")
    )
    p = _task(tmp_path, text.replace("{x: two, y: a long answer}]", "{x: two, y: a third answer}]"))
    c = tmp_path / "c.jsonl"
    c.write_text('{"id": 1, "model": "m", "x": "q", "y": "some text"}\n')
    assert main(["score", str(p), str(c), "--out", str(tmp_path / "run"), "--method", "icl"]) == 2
    assert "the icl method needs a label task" in capsys.readouterr().err


def test_a_refused_rerun_names_the_changed_settings(tmp_path):
    """Why: a refused rerun printed two truncated settings dumps instead of the setting that changed."""
    settings = {"task": {"N": 8, "M": 4, "good": [["a", "b"]] * 30}, "model": "default bfloat16"}
    RunDir(tmp_path / "run", "score", settings).start().close()
    changed = {"task": {"N": 10, "M": 4, "good": [["a", "b"]] * 30}, "model": "default float32"}
    with pytest.raises(UserError) as e:
        RunDir(tmp_path / "run", "score", changed)
    assert "task.N: 8 -> 10; model: 'default bfloat16' -> 'default float32'" in str(e.value)
