"""A task's pools against its labels and its audit (issue 40): a pool answer that is not among the task's `labels`
is one line naming the file and line (a typo used to turn a label task into a free-text one, whose candidates were
then accepted whatever their answer); `icqs preview` and `icqs score` make one check of whether the audit can run
(a pool of 1 good + 1 bad was refused by preview and run by score)."""

from __future__ import annotations

import json

import pytest

from icqs.cli import main

TASK = """\
template: "Review: {{x}}\\nSentiment: {{y}}"
labels: [negative, positive]
good:
  - {{x: "a fine film", y: positive}}
  - {{x: "a great film", y: {typo}}}
  - {{x: "a moving film", y: positive}}
bad: {bad}
M: 1
N: 1
L: 1
"""
BAD = '[{x: "a dull film", y: negative}, {x: "a poor film", y: negative}, {x: "a long film", y: negative}]'


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture
def candidates(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "a", "model": "m", "x": "great", "y": "positive"}) + "\n")
    return path


@pytest.mark.parametrize("command", ["preview", "score"])
def test_an_inline_pool_label_outside_the_labels_names_its_line(command, tmp_path, candidates, capsys, tiny_model_dir):
    task = tmp_path / "task.yaml"
    task.write_text(TASK.format(typo="postive", bad=BAD))
    extra = ["--out", tmp_path / "run"] if command == "score" else []
    status, _, err = _run([command, task, candidates, "--model", tiny_model_dir, *extra], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"error: {task}:5: 'good' example answer 'postive' is not among the task's labels "
        "('negative', 'positive') (did you mean 'positive'?)"
    ), err
    assert not (tmp_path / "run").exists()


def test_a_pool_file_label_outside_the_labels_names_the_pool_file(tmp_path, candidates, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(
            json.dumps({"x": f"film {i}", "y": y}) + "\n" for i, y in enumerate(["negative", "negative", "Negative"])
        )
    )
    task = tmp_path / "task.yaml"
    task.write_text(TASK.format(typo="positive", bad="bad.jsonl"))
    status, _, err = _run(["preview", task, candidates], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {bad}:3: 'bad' example answer 'Negative' is not among the task's labels"), err


def test_preview_and_score_agree_on_a_pool_too_small_to_audit(tmp_path, candidates, capsys, tiny_model_dir):
    task = tmp_path / "task.yaml"
    task.write_text(
        TASK.format(typo="positive", bad=BAD).replace(
            '  - {x: "a great film", y: positive}\n  - {x: "a moving film", y: positive}\n', ""
        )
    )
    status, out, err = _run(["preview", task, candidates, "--model", tiny_model_dir, "--method", "loglik"], capsys)
    reason = "the pool is too small to cross-validate: cross-validation needs at least 2 good and 2 bad examples"
    assert status == 0, err
    assert f"audit skipped ({reason})" in out and "+ 0 for the audit" in out
    status, _, err = _run(
        [
            "score",
            task,
            candidates,
            "--model",
            tiny_model_dir,
            "--method",
            "loglik",
            "--out",
            tmp_path / "run",
            "--quiet",
        ],
        capsys,
    )
    assert status == 0, err
    assert json.loads((tmp_path / "run" / "run.json").read_text())["audit"] == f"skipped: {reason}"


def test_a_task_seed_is_bounded_as_the_option_is(tmp_path, candidates, capsys):
    task = tmp_path / "task.yaml"
    task.write_text(TASK.format(typo="positive", bad=BAD) + f"seed: {2**64}\n")
    status, _, err = _run(["preview", task, candidates], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {task}:11: 'seed': {2**64} is greater than the maximum of {2**63 - 1}"), err
