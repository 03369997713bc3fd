"""The run layer shared by `icqs score`, `judge`, `pairwise`, `allure run` and `demo` (icqs/run.py): one run.json
convention with the engine's stats, one OS lock per run directory, outputs with the user's umask, temporary files
cleaned up, and every bad input (options, paths, too-long prompts, corrupt run.json, lone surrogates) a one-line
error before anything is written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jsonl_files import PAIRS, write_jsonl
from test_icqs_cli import TASK

from icqs.cli import main

ITEMS = [{"id": f"q{n}", "question": f"What is {n} + {n}?", "response": f"It is {2 * n}."} for n in range(3)]
ALLURE_TEMPLATE = 'system: Grade.\nuser: "R: {response}\\nA: {answer}"\nmatch: number\n'
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random model whose context holds the judges' prompts (2048 positions)."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("runs") / "llama", max_position_embeddings=2048)


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "task.yaml").write_text(TASK)
    rows = [
        {"id": f"{m}{i}", "model": m, "x": x, "y": y, "truth": 1.0 if m == "good" else 0.0}
        for m, answers in (("good", ["yes", "no"]), ("bad", ["no", "yes"]))
        for i, (x, y) in enumerate(zip(["four", "five"], answers))
    ]
    write_jsonl(tmp_path / "c.jsonl", rows)
    write_jsonl(tmp_path / "items.jsonl", ITEMS)
    write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    write_jsonl(
        tmp_path / "allure.jsonl", [dict(id=f"a{i}", response=f"so {i + (i % 2)}", answer=str(i)) for i in range(6)]
    )
    (tmp_path / "short.yaml").write_text(ALLURE_TEMPLATE)
    return tmp_path


def commands(files, model, out) -> dict:
    """argv of every run command, on the tiny model, into `out`."""
    eng = ["--model", str(model), "--dtype", "float32"]
    return {
        "score": [
            "score",
            str(files / "task.yaml"),
            str(files / "c.jsonl"),
            "--out",
            str(out),
            "--method",
            "icqs",
            "epistemic",
            "icl",
            "judge",
            "--quiet",
            *eng,
        ],
        "judge": ["judge", str(files / "items.jsonl"), "--out", str(out), "--shots", "0", "--quiet", *eng],
        "pairwise": ["pairwise", str(files / "pairs.jsonl"), "--out", str(out), "--bootstrap", "5", "--quiet", *eng],
        "allure": [
            "allure",
            "run",
            str(files / "allure.jsonl"),
            "--out",
            str(out),
            "--template",
            str(files / "short.yaml"),
            "--rounds",
            "1",
            *eng,
        ],
    }


def one_error_line(capsys) -> str:
    """stderr is exactly one line, `error: ...`."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.rstrip("\n")


def run_main(argv) -> int:
    """main(argv); argparse's own errors exit through SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ---- one run directory convention and the engine's stats ---------------------------------------------------------
@pytest.mark.parametrize("command", ["score", "judge", "pairwise", "allure"])
def test_every_run_command_records_and_prints_engine_stats(command, files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([a for a in commands(files, tiny_model_dir, out)[command] if a != "--quiet"]) == 0
    printed = capsys.readouterr()
    meta = json.loads((out / "run.json").read_text())
    assert meta["command"] == command
    parts = meta["engine_stats"]
    # (a part may compute nothing new: plain ICL's prompts are all in the cache the ICQS demo sets left)
    assert parts and all(
        p["tokens_requested"] > 0 and p["tokens_computed"] >= 0 and p["seconds"] > 0 and p["cache_hit_tokens"] >= 0
        for p in parts.values()
    )
    assert sum(p["tokens_computed"] for p in parts.values()) > 0
    assert "engine: " in printed.out + printed.err and "tokens requested" in printed.out + printed.err
    if command == "score":
        assert set(parts) == {"icqs", "epistemic", "icl", "judge"}
        board = json.loads((out / "leaderboard.json").read_text())
        assert [b["engine_stats"] for b in board] == [parts[m] for m in ("icqs", "epistemic", "icl", "judge")]
        assert (out / "leaderboard.txt").read_text().count("  engine: ") == 4
    if command in ("judge", "pairwise"):
        assert json.loads((out / "summary.json").read_text())["engine_stats"] == parts[command]
    for path in list(out.glob("*.json")) + list(out.glob("*.jsonl")):  # strict JSON: no NaN / Infinity
        for text in [path.read_text()] if path.suffix == ".json" else path.read_text().splitlines():
            json.loads(text, parse_constant=lambda name: pytest.fail(f"{path.name}: {name}"))
    # a resumed run with nothing left to do adds no work
    assert main(commands(files, tiny_model_dir, out)[command]) == 0
    again = json.loads((out / "run.json").read_text())["engine_stats"]
    for name, p in parts.items():
        assert again[name]["tokens_computed"] == p["tokens_computed"]


def test_a_killed_run_keeps_the_engine_work_of_its_finished_calls(files, tiny_model_dir, tmp_path, monkeypatch):
    """run.json counts the engine's work call by call: a run killed in its second engine call has the first call's
    tokens in engine_stats (not nothing, as when the totals were written once a method was done)."""
    from engine.engine import Engine

    real, calls = Engine.score, []

    def score(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "score", score)
    out = tmp_path / "run"
    assert run_main(commands(files, tiny_model_dir, out)["score"]) == 130
    stats = json.loads((out / "run.json").read_text())["engine_stats"]
    assert stats["icqs"]["tokens_computed"] > 0 and stats["icqs"]["seconds"] > 0


def test_score_run_passes_its_rows_on(files, tiny_model_dir, tmp_path, monkeypatch):
    """score_run scores what it computed from memory: the result logs are not read back from disk."""
    import icqs.io
    import icqs.score_run

    def no_reading(path):
        raise AssertionError(f"read back {path}")

    monkeypatch.setattr(icqs.score_run, "read_results", no_reading)
    monkeypatch.setattr(icqs.io, "read_results", no_reading)
    assert main(commands(files, tiny_model_dir, tmp_path / "run")["score"]) == 0


def test_no_import_circle_between_cli_demo_report():
    for name in ("demo.py", "report.py", "score_run.py", "methods.py", "aggregate.py", "run.py"):
        src = (ROOT / "icqs" / name).read_text()
        assert "from .cli" not in src and "import cli" not in src, name
    for name in ("judges/cli.py", "allure/cli.py", "allure/run_dir.py"):  # one run-directory convention
        src = (ROOT / "icqs" / name).read_text()
        assert "def open_run" not in src and '/ "run.json"' not in src and ("RunDir" in src or "AuditRun" in src), name


# ---- a lock per run directory ------------------------------------------------------------------------------------
def test_second_process_on_the_same_run_directory_is_refused(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)["score"]
    holder = subprocess.Popen(  # a process holding the lock of the same run (same task, candidates, model)
        [
            sys.executable,
            "-c",
            "import sys; from icqs.cli import build_parser; from icqs.score_run import "
            "score_run_dir; from icqs.task import load_task; from icqs.candidates import read_candidates; "
            "from commands.factory import model_label; a = build_parser().parse_args(sys.argv[1:]); "
            "score_run_dir(a.out, load_task(a.task), read_candidates(a.candidates), model_label(a), a.sampler, "
            "a.method, a.draws).start(); print('locked', flush=True); sys.stdin.read()",
            *argv,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(argv) == 2
        err = one_error_line(capsys)
        assert f"pid {holder.pid} on " in err and "another command is working in this run directory" in err
        assert not (out / "loglik.jsonl").exists() and not (out / "candidates.jsonl").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert main(commands(files, tiny_model_dir, out)["judge"]) == 2  # the lock is free; the run.json is the holder's
    assert "holds a `score` run, not a `judge` one" in capsys.readouterr().err


# ---- outputs: the user's umask, temporary files removed ----------------------------------------------------------
@pytest.mark.parametrize("command", ["score", "judge", "pairwise", "allure"])
def test_outputs_have_the_users_umask(command, files, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    old = os.umask(0o022)
    try:
        assert main(commands(files, tiny_model_dir, out)[command]) == 0
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert set(modes.values()) == {"0o644"}, modes


def test_temporary_files_of_a_killed_run_are_removed(files, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)["judge"]
    assert main(argv) == 0
    stale = out / ".summary.json.abc123.tmp"  # what a kill -9 in the middle of an atomic write leaves
    stale.write_text("half")
    assert main(argv) == 0
    assert not stale.exists() and not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_sigterm_leaves_no_temporary_file(tmp_path):
    """SIGTERM becomes SystemExit (icqs.cli.main): the atomic write in progress removes its temporary file."""
    script = (
        "import os, signal, sys, icqs.io, icqs.cli\n"
        "def slow(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
        "icqs.io.os.fsync = slow\n"
        "sys.argv = ['icqs', 'report', sys.argv[1]]\n"
        "icqs.cli.cmd_report = lambda args: icqs.io.atomic_write(os.path.join(args.dir, 'x.html'), 'x')\n"
        "sys.exit(icqs.cli.main(['report', sys.argv[1]]))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    assert res.returncode == 128 + 15, res.stderr
    assert os.listdir(tmp_path) == []


# ---- nothing is written before the inputs are checked and the model is loaded -------------------------------------
@pytest.mark.parametrize("command", ["score", "judge", "pairwise", "allure", "demo"])
def test_bad_model_writes_nothing(command, files, tmp_path, capsys):
    out = tmp_path / "run"
    argv = commands(files, tmp_path / "no-such-model", out).get(command) or [
        "demo",
        "--out",
        str(out),
        "--model",
        str(tmp_path / "no-such-model"),
    ]
    assert main(argv) == 2
    one_error_line(capsys)
    assert not out.exists()


def test_zero_shot_judge_runs_without_demos(files, tiny_model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "one.jsonl", ITEMS[:1])  # one item: no demo could be drawn, none is needed
    out = tmp_path / "run"
    assert (
        main(
            [
                "judge",
                inp,
                "--out",
                str(out),
                "--shots",
                "0",
                "--model",
                str(tiny_model_dir),
                "--dtype",
                "float32",
                "--quiet",
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in (out / "grades.jsonl").read_text().splitlines()]
    assert [(r["id"], r["k"]) for r in rows] == [("q0", 0)] and not (out / "demos.jsonl").exists()


@pytest.mark.parametrize("command", ["score", "judge", "pairwise"])
def test_too_long_names_the_input_line_before_anything_is_written(command, files, tiny_model_dir, tmp_path, capsys):
    long = " ".join(["word"] * 2100)
    write_jsonl(
        files / "c.jsonl",
        [{"id": "ok", "model": "m", "x": "four", "y": "yes"}, {"id": "long", "model": "m", "x": long, "y": "no"}],
    )
    write_jsonl(files / "items.jsonl", [ITEMS[0], {**ITEMS[1], "response": long}])
    write_jsonl(
        files / "pairs.jsonl",
        [{**PAIRS[0], "question": "?", "answer_a": "a", "answer_b": "b"}, {**PAIRS[1], "answer_b": long}],
    )
    path = {"score": "c.jsonl", "judge": "items.jsonl", "pairwise": "pairs.jsonl"}[command]
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)[command]
    if command == "score":
        argv[argv.index("--method") + 1 : argv.index("--quiet")] = ["icqs"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {files / path}:2: ")
        and err.count("\n") == 1
        and ("tokens exceed the model's maximum" in err or "tokens, over the" in err)
    )  # score: the engine's check
    assert not out.exists()


BAD_OPTIONS = [
    ("score", ["--seed", "-1"]),
    ("score", ["--M", "0"]),
    ("score", ["--N", "-2"]),
    ("judge", ["--seed", "-1"]),
    ("judge", ["--demo-tokens", "-1"]),
    ("judge", ["--runs", "0"]),
    ("judge", ["--batch", "0"]),
    ("judge", ["--max-tokens", "0"]),
    ("judge", ["--shots", "1,x"]),
    ("judge", ["--shots", "-1"]),
    ("pairwise", ["--batch", "0"]),
    ("pairwise", ["--bootstrap", "-1"]),
    ("pairwise", ["--seed", "-3"]),
    ("allure", ["--seed", "-1"]),
    ("allure", ["--rounds", "0"]),
    ("allure", ["--max-icl", "0"]),
    ("allure", ["--clusters", "-1"]),
    ("allure", ["--sweep", "0,-4"]),
    ("allure", ["--holdout", "1.5"]),
]


@pytest.mark.parametrize("command, extra", BAD_OPTIONS)
def test_bad_options_are_one_error_before_anything_is_written(command, extra, files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(commands(files, tiny_model_dir, out)[command] + extra) == 2
    one_error_line(capsys)
    assert not out.exists()


def test_task_path_that_is_a_directory_or_binary(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)["score"]
    (files / "bin.yaml").write_bytes(bytes(range(256)) * 4)
    for task in (files, files / "bin.yaml"):
        argv[1] = str(task)
        assert main(argv) == 2
        assert one_error_line(capsys).startswith(f"error: {task}: ")
        assert not out.exists()
    argv = commands(files, tiny_model_dir, out)["judge"]
    argv[1] = str(files)
    assert main(argv) == 2 and one_error_line(capsys).startswith(f"error: {files}: ")


def test_leaderboard_and_report_on_a_corrupt_run_json(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(commands(files, tiny_model_dir, out)["score"]) == 0
    capsys.readouterr()
    for text in ("{not json", "[1, 2]", '{"command": "score"}', "\xff\xfe"):
        (out / "run.json").write_text(text, encoding="latin-1")
        for argv in (["leaderboard", str(out)], ["report", str(out)]):
            assert main(argv) == 2
            assert one_error_line(capsys).startswith(f"error: {out}")
    assert main(["report", str(files / "c.jsonl")]) == 2 and "not a run directory" in one_error_line(capsys)
    assert main(["report", str(out), "--output", str(files)]) == 2 and "is a directory" in one_error_line(capsys)
    allure = tmp_path / "allure"
    assert main(commands(files, tiny_model_dir, allure)["allure"]) == 0
    capsys.readouterr()
    (allure / "run.json").write_text("{not json")
    assert main(["allure", "report", str(allure)]) == 2 and "corrupt run.json" in one_error_line(capsys)


@pytest.mark.parametrize("where", ["candidates", "task", "judge", "pairwise", "allure"])
def test_lone_surrogate_is_an_input_error(where, files, tiny_model_dir, tmp_path, capsys):
    bad = "bad \\ud800 text"  # JSON and YAML escapes that decode to a lone UTF-16 surrogate
    if where == "candidates":
        (files / "c.jsonl").write_text(
            '{"id": "a", "model": "m", "x": "four", "y": "yes"}\n'
            '{"id": "b", "model": "m", "x": "%s", "y": "no"}\n' % bad
        )
        command, path, line = "score", files / "c.jsonl", 2
    elif where == "task":
        (files / "task.yaml").write_text(TASK.replace('{x: two, y: "no"}', '{x: "%s", y: "no"}' % bad))
        command, path, line = "score", files / "task.yaml", 3
    else:
        command = where
        path = files / {"judge": "items.jsonl", "pairwise": "pairs.jsonl", "allure": "allure.jsonl"}[where]
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        text = (
            "\n".join(json.dumps(r) for r in rows)
            .replace('"q1"', '"q1 %s"' % bad)
            .replace('"No idea."', '"%s"' % bad)
            .replace('"so 2"', '"%s"' % bad)
        )
        path.write_text(text + "\n")
        line = 1 if where == "pairwise" else 2
    out = tmp_path / "run"
    assert main(commands(files, tiny_model_dir, out)[command]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"error: {path}:{line}: ") and "surrogate" in err and not out.exists()


def test_length_check_agrees_with_the_engine_at_the_limit(files, tiny_model_dir):
    """check_lengths refuses a candidate exactly when one of its requests, tokenized as the engine does, is over
    the limit (the shortcut through separately tokenized parts never lets one through)."""
    from engine import Engine
    from engine.encoding import encode_pairs
    from engine.errors import UserError
    from icqs.candidates import Candidate
    from icqs.methods import METHODS
    from icqs.score_run import check_lengths
    from icqs.task import load_task

    task = load_task(files / "task.yaml")
    eng = Engine.load(str(tiny_model_dir), dtype="float32")
    limit = eng.config.max_position
    per_word = len(eng.tokenizer.encode(" ".join(["word"] * 200))) / 200
    verdicts = set()
    for words in range(int((limit - 260) / per_word), int((limit - 60) / per_word), max(1, int(6 / per_word))):
        c = Candidate("c", "m", " ".join(["word"] * words) + " x", "yes", line=1)
        for name in METHODS:
            jobs = METHODS[name].requests(task, [c], "coupled")
            longest = max(
                len(a) + len(b) + j.generated
                for j, (a, b) in zip(jobs, encode_pairs(eng.tokenizer, [(j.context, j.continuation) for j in jobs]))
            )
            try:
                check_lengths(eng, task, [c], [name], "coupled", "c.jsonl")
                fits = True
            except UserError as e:
                fits = False
                assert str(e).startswith("c.jsonl:1: candidate 'c': ")
            assert fits == (longest <= limit), (name, words, longest)
            verdicts.add(fits)
    assert verdicts == {True, False}  # the range crosses the limit


@pytest.mark.parametrize("command, flag", [("allure", "--memory"), ("score", "--out"), ("judge", "--out")])
def test_output_paths_of_the_wrong_kind(command, flag, files, tiny_model_dir, tmp_path, capsys):
    """--out that is a file, --memory that is a directory: one line, before the model loads, nothing written."""
    out = tmp_path / "run"
    argv = commands(files, tiny_model_dir, out)[command]
    wrong = files / "c.jsonl" if flag == "--out" else files
    argv = (
        argv[: argv.index("--out")] + ["--out", str(wrong)] + argv[argv.index("--out") + 2 :]
        if flag == "--out"
        else argv + [flag, str(wrong)]
    )
    before = sorted(p.name for p in files.iterdir())
    assert main(argv) == 2
    expected = "--out is a file, not a directory" if flag == "--out" else "is a directory; expected a file"
    assert expected in one_error_line(capsys)
    assert sorted(p.name for p in files.iterdir()) == before and not out.exists()
