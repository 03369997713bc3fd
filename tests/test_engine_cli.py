"""`python -m engine score`: output rows, and bad input -> one line `error: ...`, exit 2, no output file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import make_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "engine", "score", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_scores_and_passes_fields_through(tiny_model_dir, tmp_path):
    pairs = write(tmp_path / "pairs.jsonl", [json.dumps({"context": "Reading is a", "continuation": " quiet way",
                                                         "id": 7}), "", json.dumps({"context": "Time",
                                                                                     "continuation": " flies!"})])
    out = tmp_path / "out.jsonl"
    r = run("--model", tiny_model_dir, "--input", pairs, "--output", out, "--dtype", "float32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [row.get("id") for row in rows] == [7, None]
    assert all(row["logprob"] < 0 and row["num_tokens"] == len(row["token_logprobs"]) for row in rows)
    assert "tokens computed" in r.stderr


@pytest.mark.parametrize("case, expected", [
    ("malformed", "pairs.jsonl:2: not valid JSON"),
    ("empty_continuation", "pairs.jsonl:1: empty continuation"),
    ("missing_field", "pairs.jsonl:1: missing or non-text field 'continuation'"),
    ("too_long", "exceed the model's maximum"),
    ("missing_model", "no-such-model"),
    ("corrupt_gguf", "broken.gguf"),
    ("unsupported_arch", "unsupported architecture"),
])
def test_bad_input_is_one_line_exit_2_no_output(case, expected, tiny_model_dir, tmp_path):
    good = json.dumps({"context": "a", "continuation": " b"})
    lines = {"malformed": [good, "{not json"],
             "empty_continuation": [json.dumps({"context": "a", "continuation": ""})],
             "missing_field": [json.dumps({"context": "a"})],
             "too_long": [json.dumps({"context": "word " * 2000, "continuation": " end"})]}.get(case, [good])
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
