"""The files a score run directory holds are input when a later command reads them back: run.json, audit.json and
leaderboard.json validated by their JSON Schemas (icqs/schemas/run-*.json), non-finite numbers refused naming the
file and field; the audit's state recorded in run.json (icqs/audit_state.py) so that a run without its audit says
so and keeps its marks pending instead of reading as --no-audit; a method with missing rows named, and a leaderboard
refused unless --partial."""

from __future__ import annotations

import json
import shutil

import pytest
from jsonl_files import write_label_task

from icqs.cli import main
from icqs.methods import METHODS
from icqs.run_files import RUN_FILES, read_run_file
from icqs.run_files import run_file_schema as schema


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tiny_model_dir):
    """A finished score run (icqs + icl, with its audit) to copy and damage."""
    root = tmp_path_factory.mktemp("scored")
    write_label_task(root, L=1)
    out = root / "run"
    assert (
        main(
            [
                "score",
                str(root / "task.yaml"),
                str(root / "c.jsonl"),
                "--out",
                str(out),
                "--model",
                str(tiny_model_dir),
                "--dtype",
                "float32",
                "--method",
                "icqs",
                "icl",
                "--draws",
                "1",
                "--quiet",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    return out


@pytest.fixture
def run(scored, tmp_path):
    return shutil.copytree(scored, tmp_path / "run")


def _leaderboard(run, capsys, *extra) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["leaderboard", str(run), *extra])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_what_the_commands_write_passes_the_schemas(run):
    for name in ("run.json", "audit.json", "leaderboard.json"):
        assert read_run_file(run / name) is not None, name
    assert json.loads((run / "run.json").read_text())["audit"] == "done"
    assert schema("run-audit")["items"]["properties"]["method"]["enum"] == list(METHODS)
    assert schema("run-meta")["properties"]["methods"]["items"]["enum"] == list(METHODS)


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda a: [{**a[0], "auc": "x"}, *a[1:]], "audit.json: field '[0].auc': 'x' is not of type 'number', 'null'"),
        (lambda a: [{**a[0], "auc": 7.5}, *a[1:]], "audit.json: field '[0].auc': 7.5 is greater than the maximum of 1"),
        (lambda a: [{**a[0], "method": "oracle"}, *a[1:]], "audit.json: field '[0].method': 'oracle' is not one of"),
        (lambda a: [{**a[0], "ci": [0.1]}, *a[1:]], "audit.json: field '[0].ci': [0.1] is too short"),
        (lambda a: "[" * 100000 + "]" * 100000, "audit.json: not valid JSON (nested too deeply)"),
        (lambda a: json.dumps(a).replace('"auc": ', '"auc": NaN, "x": ', 1), "NaN is not standard JSON"),
        (lambda a: json.dumps(a).replace('"auc": ', '"auc": 1e999, "x": ', 1), "a number too large for a float"),
        (lambda a: {"method": "icqs"}, "audit.json: the file: {'method': 'icqs'} is not of type 'array'"),
    ],
)
def test_damaged_audit_json_is_one_line(run, capsys, damage, expected):
    entries = json.loads((run / "audit.json").read_text())
    damaged = damage(entries)
    (run / "audit.json").write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
    before = (run / "leaderboard.json").read_bytes()
    for command in ("leaderboard", "audit", "report"):
        capsys.readouterr()
        assert main([command, str(run)]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
    assert (run / "leaderboard.json").read_bytes() == before


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"draws": "x"}, "run.json: field 'draws': 'x' is not of type 'integer'"),
        ({"draws": 10**9}, "run.json: field 'draws': 1000000000 is greater than the maximum of 1024"),
        ({"audit": "maybe"}, "run.json: field 'audit': 'maybe' does not match"),
        ({"methods": ["icqs", "oracle"]}, "run.json: field 'methods[1]': 'oracle' is not one of"),
        ({"engine_stats": {"icqs": {"seconds": -1}}}, "field 'engine_stats.icqs.seconds': -1 is less than the minimum"),
    ],
)
def test_damaged_run_json_is_one_line(run, capsys, change, expected):
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, **change}))
    status, _, err = _leaderboard(run, capsys)
    assert status == 2 and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize("how", ["removed", "empty list", "killed before the audit"])
def test_a_run_without_its_audit_says_so_and_keeps_marks_pending(run, capsys, how):
    """Before: `leaderboard` and `report` exited 0 as if the run had been made with --no-audit, every at-chance
    mark gone."""
    if how == "empty list":
        (run / "audit.json").write_text("[]")
    else:
        (run / "audit.json").unlink()
    if how == "killed before the audit":
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, "audit": "pending"}))
    status, out, err = _leaderboard(run, capsys)
    assert status == 0
    assert "--no-audit" not in out + err and "evaluator audit: PENDING" in out
    assert "run the same `icqs score` command again to finish it" in out
    marks = [line for line in out.splitlines() if "not audited yet (the audit is pending)" in line]
    assert len(marks) >= 3  # every measure of icqs and icl
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "--no-audit" not in page and "PENDING" in page


def test_a_method_the_audit_lacks_is_named(run, capsys):
    entries = json.loads((run / "audit.json").read_text())
    (run / "audit.json").write_text(json.dumps([e for e in entries if e["method"] != "icl"]))
    status, out, err = _leaderboard(run, capsys)
    assert status == 0 and "evaluator audit: no audit of icl (its leaderboard marks are pending)" in out
    assert "warning: this run's evaluator audit is missing or incomplete" in err
    assert any("p_label" in line and "not audited yet" in line for line in out.splitlines())


def test_no_audit_still_reads_as_no_audit(run, capsys):
    (run / "audit.json").unlink()
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "audit": "off"}))
    status, out, _ = _leaderboard(run, capsys)
    assert status == 0 and "ran with --no-audit" in out and "not audited yet" not in out


def test_a_torn_log_names_the_method_and_refuses_the_leaderboard(run, capsys):
    """Before: a result log one row short silently dropped that method from the leaderboard and overwrote
    leaderboard.json."""
    log = run / "icl.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))
    before = (run / "leaderboard.json").read_bytes()
    status, _, err = _leaderboard(run, capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert "icl lacks 1 of 6 candidate results" in err and "--partial" in err
    assert (run / "leaderboard.json").read_bytes() == before
    status, out, _ = _leaderboard(run, capsys, "--partial")
    assert status == 0 and "PARTIAL leaderboard: icl lacks 1 of 6 candidate results" in out
    boards = json.loads((run / "leaderboard.json").read_text())
    assert [b["method"] for b in boards] == ["icqs"] and all("PARTIAL" in b["partial"] for b in boards)
    assert read_run_file(run / "leaderboard.json") == boards


@pytest.fixture
def modes_run(tmp_path):
    """An ALLURE run folder holding the failure_modes.json that the clustering writes (a stand-in embedding)."""
    from types import SimpleNamespace

    import numpy as np

    from icqs.allure.failure_modes import failure_modes
    from icqs.allure.report import MODES_FILE
    from icqs.io import strict_json

    words = ["price wrong", "date wrong", "price off", "late date", "wrong price", "date late"]
    kinds = ("false_positive", "false_negative")
    examples = [
        SimpleNamespace(id=i + 1, user_text=w, response=w, error_kind=kinds[i % 2]) for i, w in enumerate(words)
    ]
    embed = lambda texts: np.array([[1.0, 0.0] if "price" in t else [0.0, 1.0] for t in texts])  # noqa: E731
    modes = failure_modes(examples, embed, k=2, seed=0)
    (tmp_path / MODES_FILE).write_text(json.dumps(strict_json(modes)))
    return SimpleNamespace(path=tmp_path), modes


def test_failure_modes_read_back_by_their_schema(modes_run):
    from icqs.allure.report import load_modes

    run, modes = modes_run
    assert load_modes(run) == modes and "failure_modes.json" in RUN_FILES


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda m: {**m, "cluster": ["x"] + m["cluster"][1:]}, "field 'cluster[0]': 'x' is not of type 'integer'"),
        (lambda m: {**m, "cluster": [10**9] + m["cluster"][1:]}, "is greater than the maximum of 4095"),
        (lambda m: {**m, "xy": [[0.0]] + m["xy"][1:]}, "field 'xy[0]': [0.0] is too short"),
        (lambda m: {k: v for k, v in m.items() if k != "names"}, "'names' is a required property"),
        (lambda m: {**m, "ids": m["ids"][:-1]}, "its lists ids, cluster, xy and error_kind differ in length"),
        (lambda m: {**m, "names": {}}, "has no name in field 'names'"),
        (lambda m: "[" * 100000 + "]" * 100000, "not valid JSON (nested too deeply)"),
        (lambda m: json.dumps(m).replace("[", "[NaN, ", 1), "NaN is not standard JSON"),
    ],
)
def test_a_damaged_failure_modes_json_is_one_line(modes_run, damage, expected):
    from engine.errors import UserError
    from icqs.allure.report import MODES_FILE, load_modes

    run, modes = modes_run
    damaged = damage(modes)
    (run.path / MODES_FILE).write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
    with pytest.raises(UserError) as e:
        load_modes(run)
    message = str(e.value)
    assert message.startswith(f"{run.path / MODES_FILE}: ") and "\n" not in message and expected in message, message
    assert "run `icqs allure run --failure-modes` again" in message
