"""Nothing lost, nothing unbounded (issue 24): output locks naming the holder, report outputs that never land on a
run's files or an input, logs validated row by row, finite numbers only, JSONL split on `\\n` only, bounded reads.
Each test fails on the code before the change it covers."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from test_icqs_runs import commands, files, one_error_line, tiny_model_dir  # noqa: F401  (fixtures)

from commands.engine_cli import main as engine_main
from icqs.cli import main as icqs_main


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
    assert icqs_main(argv[: argv.index("--method") + 1] + ["icqs", "epistemic"] + argv[argv.index("--quiet") :]) == 0
    capsys.readouterr()
    return out


def test_report_output_never_lands_on_a_run_file_or_an_input(score_run, files, tmp_path, capsys):  # noqa: F811
    before = {
        p: p.read_bytes() for p in list(score_run.iterdir()) + [files / "c.jsonl", files / "task.yaml"] if p.is_file()
    }
    for target in [
        score_run / "run.json",
        score_run / "loglik.jsonl",
        score_run / "scores.jsonl",
        score_run / "other.html",
        files / "c.jsonl",
        files / "task.yaml",
    ]:
        assert icqs_main(["report", str(score_run), "--output", str(target)]) == 2
        line = one_error_line(capsys)
        assert "run directory" in line or "not an HTML report" in line, line
    assert {p: p.read_bytes() for p in before} == before
    assert icqs_main(["report", str(score_run), "--output", str(tmp_path / "r.html")]) == 0
    assert icqs_main(["report", str(score_run), "--output", str(tmp_path / "r.html")]) == 0  # a report: replaced
    assert icqs_main(["report", str(score_run), "--output", str(score_run / "report.html")]) == 0  # the default


@pytest.mark.parametrize(
    "bad, what",
    [([1], "field 'loglik'"), ("x", "field 'loglik'"), ([0.0, -1.0, 5.0], "loglik[2]"), (None, "field 'loglik'")],
)
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
    meta["task"]["M"] = 10**6
    (score_run / "run.json").write_text(json.dumps(meta))
    assert icqs_main(["report", str(score_run)]) == 2
    assert "field 'M'" in one_error_line(capsys)
    assert not (score_run / "report.html").exists()


@pytest.mark.parametrize(
    "text, field",
    [
        ('{"context": "a", "continuation": " b", "w": 1e400}', "w"),
        ('{"context": "a", "continuation": " b", "m": {"x": [0, -1e999]}}', "m.x[1]"),
    ],
)
def test_an_overflowing_number_is_refused_naming_its_field_before_anything_is_created(text, field, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(text + "\n")
    status, err = engine_score(
        capsys, "--model", tmp_path / "never-loaded", "--input", src, "--output", tmp_path / "o.jsonl"
    )
    assert status == 2 and err.count("\n") == 1 and f"{src}:1:" in err and repr(field) in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_path_with_a_newline_is_a_one_line_error(tmp_path, capsys):
    status, err = engine_score(
        capsys, "--model", tmp_path, "--input", tmp_path / "a\nb.jsonl", "--output", tmp_path / "o.jsonl"
    )
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


# ---- unbounded work: each a one-line error, at once ---------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def bounded_run(argv: list[str], cwd: Path, seconds: float = 60, memory: int = 3 << 30):
    """A command in a subprocess with a memory cap and a time limit, so that the old behaviour (minutes of work,
    gigabytes) fails the test instead of the machine."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        p = subprocess.run(
            [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=seconds, preexec_fn=limit
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} still running after {seconds} s")
    return p.returncode, p.stderr


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize("key", ["labels", "good", "name"])
def test_a_yaml_alias_bomb_is_a_one_line_error(key, files, tmp_path):  # noqa: F811
    task = (
        BOMB
        + "".join(line for line in (files / "task.yaml").read_text().splitlines(True) if not line.startswith(f"{key}:"))
        + f"{key}: *i\n"
    )
    (tmp_path / "bomb.yaml").write_text(task)
    status, err = bounded_run(
        [
            "-m",
            "icqs.cli",
            "score",
            str(tmp_path / "bomb.yaml"),
            str(files / "c.jsonl"),
            "--out",
            str(tmp_path / "run"),
            "--model",
            str(tmp_path / "none"),
        ],
        tmp_path,
    )
    assert status == 2 and err.count("\n") == 1 and "aliases are expanded" in err, err
    assert not (tmp_path / "run").exists()


def test_a_huge_yaml_file_is_refused_by_its_size(tmp_path, monkeypatch):
    from engine.errors import UserError
    from icqs import io
    from icqs.task import load_task

    monkeypatch.setattr(io, "MAX_YAML_BYTES", 1 << 10)
    (tmp_path / "t.yaml").write_text("name: x\n" + "# pad\n" * 400)
    with pytest.raises(UserError, match="larger than the cap of"):
        load_task(tmp_path / "t.yaml")


def test_a_jsonl_line_over_the_cap_says_the_cap(tmp_path, capsys):
    from commands.jsonl import MAX_LINE_BYTES

    src = tmp_path / "in.jsonl"
    src.write_text('{"context": "a", "continuation": " b"}\n{"context": "' + "x" * (MAX_LINE_BYTES + 10) + '"}\n')
    status, err = engine_score(capsys, "--model", tmp_path / "none", "--input", src, "--output", tmp_path / "o.jsonl")
    assert status == 2 and err.startswith(f"error: {src}:2: line longer than the cap of {MAX_LINE_BYTES:,} bytes"), err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_only_regular_files_are_read(kind, files, tmp_path):  # noqa: F811
    source = tmp_path / "fifo" if kind == "fifo" else Path(kind)
    if kind == "fifo":
        os.mkfifo(source)
    for argv in (
        [
            "-m",
            "engine",
            "score",
            "--input",
            str(source),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--model",
            str(tmp_path / "none"),
        ],
        [
            "-m",
            "icqs.cli",
            "score",
            str(files / "task.yaml"),
            str(source),
            "--out",
            str(tmp_path / "r"),
            "--model",
            str(tmp_path / "none"),
        ],
        [
            "-m",
            "icqs.cli",
            "score",
            str(source),
            str(files / "c.jsonl"),
            "--out",
            str(tmp_path / "r"),
            "--model",
            str(tmp_path / "none"),
        ],
    ):
        status, err = bounded_run(argv, tmp_path, seconds=30)
        assert status == 2 and err.count("\n") == 1 and "not a regular file" in err, (argv, err)


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--M", "99999999999999999999", "at most 256"),
        ("--N", "10" * 40, "at most 4,096"),
        ("--L", "99999", "at most 1,024"),
        ("--M", "9" * 5000, "expected a positive integer, got '999"),
    ],
)
def test_icqs_score_sizes_are_bounded(option, value, says, files, tmp_path):  # noqa: F811
    status, err = bounded_run(
        [
            "-m",
            "icqs.cli",
            "score",
            str(files / "task.yaml"),
            str(files / "c.jsonl"),
            "--out",
            str(tmp_path / "r"),
            "--model",
            str(tmp_path / "none"),
            option,
            value,
        ],
        tmp_path,
        30,
    )
    assert status == 2 and err.count("\n") == 1 and says in err and len(err) < 300, err


@pytest.mark.parametrize(
    "sizes, says",
    [
        ("M: 100000000000\nN: 2\n", "'M' = 100000000000 is over the limit of 256"),
        ("M: 2\nN: 100000000000\n", "'N' = 100000000000 is over the limit of 4096"),
    ],
)
def test_task_sizes_are_bounded_before_listing_the_ratios(sizes, says, files, tmp_path):  # noqa: F811
    task = "".join(line for line in (files / "task.yaml").read_text().splitlines(True) if line[:2] not in ("M:", "N:"))
    (tmp_path / "t.yaml").write_text(task + sizes)
    status, err = bounded_run(
        [
            "-m",
            "icqs.cli",
            "score",
            str(tmp_path / "t.yaml"),
            str(files / "c.jsonl"),
            "--out",
            str(tmp_path / "r"),
            "--model",
            str(tmp_path / "none"),
        ],
        tmp_path,
        30,
    )
    assert status == 2 and err.count("\n") == 1 and says in err, err


def test_kv_tokens_beyond_memory_is_one_line(tiny_model_dir, tmp_path, capsys):
    """Within the option's bound (2^30 tokens) the cache's bytes are checked against the memory; beyond it the
    option itself is refused where it is parsed."""
    src = pairs(tmp_path / "in.jsonl", PAIRS)
    status, err = engine_score(
        capsys, "--model", tiny_model_dir, "--input", src, "--output", tmp_path / "o.jsonl", "--kv-tokens", str(2**30)
    )
    assert status == 2 and err.count("\n") == 1 and "kv_tokens=1,073,741,824 needs" in err, err
    assert "lower --kv-tokens" in err and not (tmp_path / "o.jsonl").exists()
    with pytest.raises(SystemExit) as exit_:  # argparse: usage and one error line
        engine_score(
            capsys,
            "--model",
            tiny_model_dir,
            "--input",
            src,
            "--output",
            tmp_path / "o.jsonl",
            "--kv-tokens",
            str(10**12),
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--kv-tokens: expected an integer of at most 1,073,741,824" in err, err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("user", ["{response:>999999999}", "{response:.99999999}", "{response:{answer}}"])
def test_allure_template_widths_are_bounded(user):
    from engine.errors import UserError
    from icqs.allure.template import template_from_dict

    with pytest.raises(UserError, match="width or precision"):
        template_from_dict({"system": "Grade.", "user": user + " {answer}"})
    template_from_dict({"system": "Grade.", "user": "{response:>20} {answer}"})


def test_disk_full_mid_run_is_one_line_and_keeps_the_rows(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import errno

    from commands import jsonl

    src = pairs(tmp_path / "in.jsonl", PAIRS)
    real, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(jsonl.os, "fsync", fsync)
    status, err = engine_score(capsys, "--model", tiny_model_dir, "--input", src, "--output", tmp_path / "o.jsonl")
    assert status == 1 and err.count("\n") == 1 and err.startswith("error: No space left on device; free some"), err
    assert json.loads((tmp_path / "o.jsonl").read_text().splitlines()[0])["id"] == 0  # the finished row is kept


def test_an_unwritable_output_is_refused_before_the_model_loads(tmp_path, capsys):
    src = pairs(tmp_path / "in.jsonl", PAIRS)
    status, err = engine_score(capsys, "--model", tmp_path / "none", "--input", src, "--output", "/proc/o.jsonl")
    assert status == 2 and err.startswith("error: /proc/o.jsonl: cannot be written"), err


def test_a_chat_template_the_sandbox_refuses_is_an_input_error():
    from engine.errors import UserError
    from engine.tokenizer import Tokenizer

    tok = Tokenizer(None, bos_id=None, eos_ids=[], add_bos=False, chat_template="{{ messages.append(1) }}")
    with pytest.raises(UserError, match="chat template fails to render .SecurityError"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


# ---- the ALLURE memory: checked read-only before anything is created --------------------------------------------
@pytest.mark.parametrize("damage", ["not_sqlite", "provenance", "prob", "label"])
def test_a_bad_allure_memory_is_refused_before_the_run_folder_exists(damage, files, tmp_path, capsys):  # noqa: F811
    import sqlite3

    from icqs.allure.memory import Example, Memory

    db = tmp_path / "memory.sqlite"
    if damage == "not_sqlite":
        db.write_bytes(b"not a database, my notes\n" * 40)
    else:
        with Memory(db) as mem:
            mem.add(Example("i1", "user turn", "label: 1", "so 1", "1", 1, provenance={"run": "x"}))
        sql = {
            "provenance": "UPDATE examples SET provenance = '{broken'",
            "prob": "UPDATE examples SET evaluator_prob = 7.5",
            "label": "UPDATE examples SET evaluator_label = 9",
        }[damage]
        with sqlite3.connect(db) as con:
            con.execute(sql)
    before = db.read_bytes()
    out = tmp_path / "run"
    argv = commands(files, tmp_path / "no-model", out)["allure"] + ["--memory", str(db)]
    assert icqs_main(argv) == 2
    line = one_error_line(capsys)
    assert str(db) in line and ("not an ICL memory" in line or "corrupt example 1" in line), line
    assert not out.exists() and db.read_bytes() == before
