"""Nothing lost, nothing unbounded (issue 24): output locks naming the holder, report outputs that never land on a
run's files or an input, logs validated row by row, finite numbers only, JSONL split on `\\n` only, bounded reads.
Each test fails on the code before the change it covers."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from commands.engine_cli import main as engine_main
from icqs.cli import main as icqs_main
from test_icqs_runs import commands, files, one_error_line, tiny_model_dir  # noqa: F401  (fixtures)


def engine_score(capsys, *args) -> tuple[int, str]:
    status = engine_main(["score", *map(str, args), "--quiet", "--dtype", "float32"])
    return status, capsys.readouterr().err


def pairs(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PAIRS = [{"id": i, "context": f"Line {i} says", "continuation": " hello"} for i in range(3)]


# ---- data lost or silently changed ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["o.jsonl", "o.parquet"])
def test_a_second_writer_of_an_engine_output_is_refused_naming_the_holder(name, tiny_model_dir, tmp_path, capsys):
    src = pairs(tmp_path / "in.jsonl", PAIRS)
    out = tmp_path / name
    if name.endswith(".parquet"):
        out.mkdir()
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    else:
        fd = os.open(out, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file description: as another process holds it
        status, err = engine_score(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    finally:
        os.close(fd)
    assert status == 2 and err.count("\n") == 1, err
    assert f"another command is writing this output (pid {os.getpid()}" in err, err
    assert (out.read_text() == "") if out.is_file() else os.listdir(out) == []  # nothing interleaved
    status, err = engine_score(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert status == 0, err


@pytest.fixture()
def score_run(files, tiny_model_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)["score"]
    assert icqs_main(argv[:argv.index("--method") + 1] + ["icqs", "epistemic"] + argv[argv.index("--quiet"):]) == 0
    capsys.readouterr()
    return out


def test_report_output_never_lands_on_a_run_file_or_an_input(score_run, files, tmp_path, capsys):  # noqa: F811
    before = {p: p.read_bytes() for p in list(score_run.iterdir()) + [files / "c.jsonl", files / "task.yaml"]
              if p.is_file()}
    for target in [score_run / "run.json", score_run / "loglik.jsonl", score_run / "scores.jsonl",
                   score_run / "other.html", files / "c.jsonl", files / "task.yaml"]:
        assert icqs_main(["report", str(score_run), "--output", str(target)]) == 2
        line = one_error_line(capsys)
        assert "run directory" in line or "not an HTML report" in line, line
    assert {p: p.read_bytes() for p in before} == before
    assert icqs_main(["report", str(score_run), "--output", str(tmp_path / "r.html")]) == 0
    assert icqs_main(["report", str(score_run), "--output", str(tmp_path / "r.html")]) == 0  # a report: replaced
    assert icqs_main(["report", str(score_run), "--output", str(score_run / "report.html")]) == 0  # the default


@pytest.mark.parametrize("bad, what", [([1], "field 'loglik'"), ("x", "field 'loglik'"), ([0.0, -1.0, 5.0], "loglik[2]"),
                                       (None, "field 'loglik'")])
def test_a_corrupt_log_row_is_a_file_line_error_not_another_ranking(bad, what, score_run, capsys):
    log = score_run / "loglik.jsonl"
    lines = log.read_text().splitlines()
    row = json.loads(lines[1])
    row["loglik"] = bad
    lines[1] = json.dumps(row)
    log.write_text("\n".join(lines) + "\n")
    board = (score_run / "leaderboard.json").read_bytes()
    for argv in (["leaderboard", str(score_run)], ["report", str(score_run)]):
        assert icqs_main(argv) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"error: {log}:2: corrupt result row") and what in line, line
    assert (score_run / "leaderboard.json").read_bytes() == board  # not rewritten


def test_run_json_with_an_absurd_M_is_refused_by_report(score_run, capsys):
    meta = json.loads((score_run / "run.json").read_text())
    meta["task"]["M"] = 10 ** 6
    (score_run / "run.json").write_text(json.dumps(meta))
    assert icqs_main(["report", str(score_run)]) == 2
    assert "field 'M'" in one_error_line(capsys)
    assert not (score_run / "report.html").exists()


@pytest.mark.parametrize("text, field", [('{"context": "a", "continuation": " b", "w": 1e400}', "w"),
                                         ('{"context": "a", "continuation": " b", "m": {"x": [0, -1e999]}}', "m.x[1]")])
def test_an_overflowing_number_is_refused_naming_its_field_before_anything_is_created(text, field, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(text + "\n")
    status, err = engine_score(capsys, "--model", tmp_path / "never-loaded", "--input", src, "--output",
                               tmp_path / "o.jsonl")
    assert status == 2 and err.count("\n") == 1 and f"{src}:1:" in err and repr(field) in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_path_with_a_newline_is_a_one_line_error(tmp_path, capsys):
    status, err = engine_score(capsys, "--model", tmp_path, "--input", tmp_path / "a\nb.jsonl", "--output",
                               tmp_path / "o.jsonl")
    assert status == 2 and err.count("\n") == 1 and "a\\nb.jsonl" in err, err


# ---- JSONL split on \n only -------------------------------------------------------------------------------------
def test_jsonl_lines_split_on_newline_only(tmp_path):
    from commands.jsonl import read_jsonl

    src = tmp_path / "in.jsonl"
    src.write_text('{"a": "x\u2028y\u0085z"}\n{"a": "p\u2029q"}\n{"a": 3\n', encoding="utf-8")
    with pytest.raises(Exception) as e:
        read_jsonl(src)
    assert f"{src}:3:" in str(e.value)  # the raw separators neither break rows nor shift line numbers
    src.write_text('{"a": "x\u2028y\u0085z"}\r\n{"a": "p\u2029q"}\n', encoding="utf-8")
    assert read_jsonl(src) == [{"a": "x\u2028y\u0085z"}, {"a": "p\u2029q"}]
