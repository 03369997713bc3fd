"""Progress (issue 37): tqdm bars on a terminal, plain lines without escape codes anywhere else (a log, a pipe, CI);
one bar through the evaluator audit; the banner of `icqs demo`; `icqs --help` without the engine's imports."""

import argparse
import io
import os
import re
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from engine.progress import PlainProgress, progress_bar
from icqs.demo import banner, write_example

ROOT = Path(__file__).resolve().parents[1]
CONTROL = re.compile(r"[\x1b\r]")  # escape sequences (cursor up, colours) and carriage returns


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdm_and_a_log_gets_plain_lines(monkeypatch):
    assert isinstance(progress_bar(range(3), file=Terminal()), tqdm)
    monkeypatch.setenv("ICQS_PROGRESS_INTERVAL", "1e-9")
    log = io.StringIO()
    bar = progress_bar(range(4), desc="scoring", unit="batch", file=log)
    assert isinstance(bar, PlainProgress) and list(bar) == [0, 1, 2, 3]
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("scoring: 1/4 batch (25%), 00:00 elapsed, 00:00 left")
    assert lines[-1].startswith("scoring: 4/4 batch (100%), 00:00 elapsed") and "left" not in lines[-1]
    assert not CONTROL.search(log.getvalue())


def test_plain_lines_are_rate_limited_and_quiet_for_short_bars(monkeypatch):
    monkeypatch.setenv("ICQS_PROGRESS_INTERVAL", "3600")
    log = io.StringIO()
    with progress_bar(total=10, desc="x", file=log) as bar:
        bar.update(10)
    assert log.getvalue() == ""  # nothing printed within the interval: a short bar says nothing
    with progress_bar(total=None, desc="fetching", unit="B", unit_scale=True, file=log) as bar:
        bar.update(2_500_000)
        assert bar.line().startswith("fetching: 2.50M B, 00:00 elapsed")
    assert progress_bar(range(2), disable=True, file=io.StringIO()).disable


def test_a_non_terminal_run_has_no_escape_codes(tmp_path, tiny_model_dir):
    """`icqs score` with stderr to a pipe: plain progress lines (the scoring's and the audit's), no escapes."""
    write_example(tmp_path / "ex")
    env = {
        **os.environ,
        "ICQS_PROGRESS_INTERVAL": "1e-9",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "icqs.cli",
            "score",
            str(tmp_path / "ex" / "task.yaml"),
            str(tmp_path / "ex" / "candidates.jsonl"),
            "--out",
            str(tmp_path / "run"),
            "--model",
            str(tiny_model_dir),
            "--dtype",
            "float32",
            "--method",
            "icqs",
            "--draws",
            "1",
            "--nondeterministic",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert not CONTROL.search(done.stderr), repr(CONTROL.search(done.stderr))
    lines = done.stderr.splitlines()
    assert any(line.startswith("ICQS coupled demo sets: ") for line in lines)
    audit = [line for line in lines if line.startswith("evaluator audit: ")]
    assert audit and audit[-1].startswith("evaluator audit: 2/2 fold (100%)")  # one bar through the audit


def test_demo_banner_says_what_on_which_model_and_how_long():
    args = argparse.Namespace(model=None, server=None)
    line = banner(args, 3, True)
    assert "\n" not in line and line.startswith("icqs demo: 4 simulated models answer 20 generated movie reviews")
    assert "SmolLM2-135M-Instruct" in line and re.search(r"about \d+ min on 2 CPU cores", line)
    assert "audited" not in banner(args, 3, False)
    assert "the model /m.gguf" in banner(argparse.Namespace(model="/m.gguf", server=None), 1, True)


def test_help_imports_neither_the_engine_nor_numpy():
    """`icqs --help` and a mistyped command answer from the command table alone (no torch, numpy, scipy)."""
    code = (
        "import sys; from icqs.cli import main\n"
        "for argv in (['--help'], ['scroe']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'jsonschema') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
    assert "unknown command 'scroe' (did you mean 'score'?)" in done.stderr


def test_every_command_and_option_has_help_without_paper_jargon():
    """`--help` of every command says what it does and what each option means, with no figure or symbol of a paper
    ("Fig. 3", "Z_g") in place of words."""
    from icqs.cli import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert sub.description, path + [name]
                    yield from walk(sub, path + [name])
            elif not isinstance(action, argparse._HelpAction):
                yield path, action

    seen = 0
    for path, action in walk(build_parser(), ["icqs"]):
        assert action.help, (path, action.option_strings or action.dest)
        assert not re.search(r"Fig\.|Table \d|Z_[gb]|Prompt [AB]\b", action.help), (path, action.help)
        seen += 1
    assert seen > 80
