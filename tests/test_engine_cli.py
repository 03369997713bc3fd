"""`python -m engine score`: output rows, and bad input -> one line `error: ...`, exit 2, no output file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from engine.validation import RequestError

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "engine", "score", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_scores_and_passes_fields_through(tiny_model_dir, tmp_path):
    pairs = write(
        tmp_path / "pairs.jsonl",
        [
            json.dumps({"context": "Reading is a", "continuation": " quiet way", "id": 7}),
            "",
            json.dumps({"context": "Time", "continuation": " flies!"}),
        ],
    )
    out = tmp_path / "out.jsonl"
    r = run("--model", tiny_model_dir, "--input", pairs, "--output", out, "--dtype", "float32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [row.get("id") for row in rows] == [7, None]
    assert all(row["logprob"] < 0 and row["num_tokens"] == len(row["token_logprobs"]) for row in rows)
    assert "tokens computed" in r.stderr


@pytest.mark.parametrize(
    "case, expected",
    [
        ("malformed", "pairs.jsonl:2: not valid JSON"),
        ("empty_continuation", "pairs.jsonl:1: empty continuation"),
        ("missing_field", "pairs.jsonl:1: missing or non-text field 'continuation'"),
        ("too_long", "pairs.jsonl:1: "),
        ("missing_model", "no-such-model"),
        ("corrupt_gguf", "broken.gguf"),
        ("unsupported_arch", "unsupported architecture"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_output(case, expected, tiny_model_dir, tmp_path):
    good = json.dumps({"context": "a", "continuation": " b"})
    lines = {
        "malformed": [good, "{not json"],
        "empty_continuation": [json.dumps({"context": "a", "continuation": ""})],
        "missing_field": [json.dumps({"context": "a"})],
        "too_long": [json.dumps({"context": "word " * 2000, "continuation": " end"})],
    }.get(case, [good])
    pairs = write(tmp_path / "pairs.jsonl", lines)
    model = tiny_model_dir
    if case == "missing_model":
        model = tmp_path / "no-such-model"
    elif case == "corrupt_gguf":
        model = tmp_path / "broken.gguf"
        model.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 40)
    elif case == "unsupported_arch":
        model = make_tiny_model(tmp_path / "gpt2ish", arch="llama")
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    out = tmp_path / "out.jsonl"
    r = run("--model", model, "--input", pairs, "--output", out, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and expected in lines[-1], r.stderr
    assert not out.exists() and not list(tmp_path.glob("*.part"))


# --- in-process: validation before any work, resume, strict JSON, file modes -------------------------------------


def score_main(capsys, *args) -> tuple[int, str]:
    from commands.engine_cli import main

    try:
        status = main(["score", *map(str, args)])
    except SystemExit as e:  # argparse errors
        status = e.code
    return status, capsys.readouterr().err


def pairs_file(path: Path, n: int) -> Path:
    return write(
        path,
        [
            json.dumps(
                {
                    "context": f"Reading is a quiet way {i % 3}",
                    "continuation": f" of thinking {i}",
                    **({"id": f"r{i}"} if i % 2 else {}),
                }
            )
            for i in range(n)
        ],
    )


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing_folder", "does not exist"),
        ("output_is_folder", "is a directory; expected a file"),
        ("output_is_device", "/dev/null: not a regular file"),
        ("input_is_folder", "is a directory, expected a JSONL file"),
        ("binary_input", "pairs.jsonl:2: a binary file"),
        ("latin1_input", "pairs.jsonl:2: not UTF-8 text (byte 0xe9)"),
        ("lone_surrogate", "pairs.jsonl:2: a lone UTF-16 surrogate"),
        ("nan_field", "pairs.jsonl:2: not valid JSON (NaN is not standard JSON)"),
        ("empty_input", "no rows to score"),
        ("token_budget_0", "argument --token-budget: expected a positive integer, got 0"),
        ("kv_tokens_x", "argument --kv-tokens: expected a positive integer, got 'x'"),
        ("device_tpu", "--device 'tpu': expected cpu, cuda or cuda:N"),
        ("graphs_and_deterministic", "--decode-graphs cannot be combined with --deterministic"),
        ("input_is_output", "is also an input file"),
        ("other_jobs_output", "out.jsonl: row 1 is not the request at"),
    ],
)
def test_bad_paths_and_options_fail_before_any_work(case, expected, tmp_path, capsys, monkeypatch):
    """Checked before the model loads (a model path that does not exist is never reached) and before any file is
    written; one line, exit 2. Before: a bad --output was found only after all scoring, with a traceback."""
    import commands.factory

    monkeypatch.setattr(commands.factory, "engine_from_args", lambda *a, **k: pytest.fail("the model was loaded"))
    pairs = pairs_file(tmp_path / "pairs.jsonl", 2)
    out, options = tmp_path / "out.jsonl", []
    if case == "missing_folder":
        out = tmp_path / "nowhere" / "out.jsonl"
    elif case == "output_is_folder":
        out = tmp_path
    elif case == "output_is_device":
        out = Path("/dev/null")
    elif case == "input_is_folder":
        pairs = tmp_path
    elif case in ("binary_input", "latin1_input", "lone_surrogate", "nan_field"):
        bad = {
            "binary_input": b'{"context": "a\x00"}',
            "latin1_input": '{"context": "caf\xe9"}'.encode("latin-1"),
            "lone_surrogate": b'{"context": "a\\ud800", "continuation": " b"}',
            "nan_field": b'{"context": "a", "continuation": " b", "w": NaN}',
        }[case]
        pairs.write_bytes(pairs.read_bytes().splitlines(keepends=True)[0] + bad + b"\n")
    elif case == "empty_input":
        pairs.write_text("\n")
    elif case == "input_is_output":
        out = pairs
    elif case == "other_jobs_output":
        out.write_text(json.dumps({"context": "something else", "continuation": " x", "logprob": -1.0}) + "\n")
    else:
        options = {
            "token_budget_0": ["--token-budget", "0"],
            "kv_tokens_x": ["--kv-tokens", "x"],
            "device_tpu": ["--device", "tpu"],
            "graphs_and_deterministic": ["--decode-graphs", "--deterministic"],
        }[case]
    if case == "device_tpu":  # the device is checked with the engine options, still before the model loads
        monkeypatch.undo()
        monkeypatch.setattr("engine.engine.Engine.load", lambda *a, **k: pytest.fail("the model was loaded"))
    before = sorted(p.name for p in tmp_path.iterdir())
    status, err = score_main(capsys, "--model", tmp_path / "no-such-model", "--input", pairs, "--output", out, *options)
    assert status == 2 and err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_too_long_names_the_input_line(tiny_model_dir, tmp_path, capsys):
    pairs = write(
        tmp_path / "pairs.jsonl",
        [
            json.dumps({"context": "a", "continuation": " b"}),
            "",
            json.dumps({"context": "word " * 600, "continuation": " end"}),
        ],
    )
    status, err = score_main(capsys, "--model", tiny_model_dir, "--input", pairs, "--output", tmp_path / "o.jsonl")
    assert status == 2 and f"{pairs}:3: " in err and "exceed the model's maximum context length of 512" in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_killed_run_keeps_its_rows_and_resumes(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """A run interrupted after its first chunk keeps that chunk's rows (and leaves no other file); the same command
    again scores only the rest, and the output equals an uninterrupted run's. A torn last line is cut."""
    import commands.engine_cli
    from engine.engine import Engine

    monkeypatch.setattr(commands.engine_cli, "CHUNK_ROWS", 3)
    pairs = pairs_file(tmp_path / "pairs.jsonl", 8)
    args = ["--model", tiny_model_dir, "--dtype", "float32", "--quiet", "--deterministic", "--input", pairs]
    assert score_main(capsys, *args, "--output", tmp_path / "full.jsonl")[0] == 0
    full = (tmp_path / "full.jsonl").read_text().splitlines()

    real_score, calls = Engine.score, []

    def killed_on_second_chunk(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_score(self, *a, **k)

    monkeypatch.setattr(Engine, "score", killed_on_second_chunk)
    out = tmp_path / "out.jsonl"
    status, err = score_main(capsys, *args, "--output", out)
    assert status == 130 and "run the same command again to resume" in err
    assert out.read_text().splitlines() == full[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.jsonl", "out.jsonl", "pairs.jsonl"]
    with open(out, "a") as f:
        f.write(full[3][:20])  # a kill in the middle of a write
    monkeypatch.setattr(Engine, "score", real_score)
    status, err = score_main(capsys, *args, "--output", out)
    assert status == 0 and "resuming: 3 rows already in" in err and "scored 5 requests" in err, err
    assert out.read_text().splitlines() == full
    status, err = score_main(capsys, *args, "--output", out)
    assert status == 0 and "nothing to do" in err


def test_output_is_strict_json_and_follows_the_umask(tiny_model_dir, tmp_path, capsys):
    """Before: the output went through mkstemp (mode 0600) and a NaN log-prob was written as `NaN`."""
    pairs = pairs_file(tmp_path / "pairs.jsonl", 2)
    old = os.umask(0o027)
    try:
        status, _ = score_main(
            capsys, "--model", tiny_model_dir, "--dtype", "float32", "--input", pairs, "--output", tmp_path / "o.jsonl"
        )
    finally:
        os.umask(old)
    assert status == 0 and stat.S_IMODE((tmp_path / "o.jsonl").stat().st_mode) == 0o640
    for line in (tmp_path / "o.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))


def test_nan_logprob_is_an_error_not_written(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from engine.engine import Engine, ScoreResult

    monkeypatch.setattr(
        Engine, "score", lambda self, reqs, **k: [ScoreResult(float("nan"), [float("nan")], 1, False) for _ in reqs]
    )
    pairs = pairs_file(tmp_path / "pairs.jsonl", 2)
    status, err = score_main(capsys, "--model", tiny_model_dir, "--input", pairs, "--output", tmp_path / "o.jsonl")
    assert status == 2 and f"{pairs}:1: log-prob nan is not finite" in err, err
    assert not (tmp_path / "o.jsonl").exists()  # an output left empty by the failure is removed


def test_kill_9_mid_run_leaves_only_finished_rows_and_resumes(tiny_model_dir, tmp_path):
    """A real SIGKILL while rows are being written: the folder holds only the input and the rows finished so far
    (no temporary file), and the same command again completes the output as an uninterrupted run does."""
    import signal
    import time

    pairs = pairs_file(tmp_path / "pairs.jsonl", 200)
    args = ["--model", tiny_model_dir, "--dtype", "float32", "--quiet", "--deterministic", "--input", pairs]
    code = "import sys, commands.engine_cli as c; c.CHUNK_ROWS = 2; sys.exit(c.main(['score', *sys.argv[1:]]))"
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args), "--output", str(out)],
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "pairs.jsonl"]
    kept = out.read_text()
    assert 0 < kept.count("\n") < 200
    r = run(*args, "--output", out, cwd=tmp_path)
    assert r.returncode == 0 and "resuming:" in r.stderr, r.stderr
    assert run(*args, "--output", tmp_path / "full.jsonl", cwd=tmp_path).returncode == 0
    resumed = [json.loads(x) for x in out.read_text().splitlines()]
    full = [json.loads(x) for x in (tmp_path / "full.jsonl").read_text().splitlines()]
    assert [(r.get("id"), r["context"], r["continuation"]) for r in resumed] == [
        (r.get("id"), r["context"], r["continuation"]) for r in full
    ]
    # float32; the killed run packed its forward steps from chunks of 2 rows, the uninterrupted one from 256
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(resumed, full)) < 1e-4


def test_an_engine_error_for_one_request_names_its_input_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The engine's error for a failed request carries its index in the call (RequestError.index), which in chunk 2
    of a job is not the row's place in the file: the CLI names the input line; the chunks before it are kept."""
    import commands.engine_cli
    from engine.engine import Engine

    monkeypatch.setattr(commands.engine_cli, "CHUNK_ROWS", 2)
    real, calls = Engine.score, []

    def fails_in_second_chunk(self, reqs, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RequestError("the log-prob is NaN (corrupt weights?)", index=1)
        return real(self, reqs, **kw)

    monkeypatch.setattr(Engine, "score", fails_in_second_chunk)
    pairs = pairs_file(tmp_path / "pairs.jsonl", 5)
    pairs.write_text("\n" + pairs.read_text())  # rows on lines 2..6: the failed request (row 4) is on line 5
    status, err = score_main(
        capsys, "--model", tiny_model_dir, "--dtype", "float32", "--input", pairs, "--output", tmp_path / "o.jsonl"
    )
    assert status == 2 and err.strip().endswith(f"error: {pairs}:5: the log-prob is NaN (corrupt weights?)"), err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
