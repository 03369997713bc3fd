"""`python -m engine serve` as a process (starts, serves, finishes in-flight work on SIGTERM and exits; a busy
port is a one-line error) and `--server URL` on the commands: the same results as the in-process engine."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from live_server import live_server
from test_icqs_cli import TASK  # the tiny ICQS task of the icqs CLI tests

from commands.engine_cli import main as engine_main
from engine import Engine
from frontends.server.app import create_app
from icqs.cli import main as icqs_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(args, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", *args], stderr=subprocess.PIPE, text=True, env=env
    )
    deadline, lines = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving \S+ on (http://127\.0\.0\.1:\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


def test_the_served_port_takes_connections_before_the_server_runs():
    """The port the server announces listens at once: a client connecting before uvicorn has started waits in the
    backlog instead of being refused (a loaded machine takes seconds between the log line and uvicorn's start)."""
    from commands.serve import _listen

    sock = _listen("127.0.0.1", 0)
    try:
        socket.create_connection(sock.getsockname()[:2], timeout=5).close()
    finally:
        sock.close()


def test_serve_process_finishes_in_flight_work_on_sigterm(tiny_model_dir):
    proc, url = _start(
        ["--model", str(tiny_model_dir), "--dtype", "float32", "--port", "0", "--served-model-name", "tiny"]
    )
    try:
        assert httpx.get(url + "/health").json()["model"] == "tiny"
        pairs = [[f"Item {i}: the quick brown fox jumps over the lazy dog " * 4, f" number {i}"] for i in range(300)]
        result = {}
        t = threading.Thread(
            target=lambda: result.update(r=httpx.post(url + "/v1/score", json={"pairs": pairs}, timeout=120))
        )
        t.start()
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health").json()["in_flight"] == 0 and "r" not in result:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        t.join(120)
        assert result["r"].status_code == 200 and len(result["r"].json()["data"]) == 300
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_on_a_busy_port_is_a_one_line_error(tiny_model_dir, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert engine_main(["serve", "--model", str(tiny_model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):
    engine = Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)
    with live_server(create_app(engine, model_name="tiny")) as url:
        yield url


def test_engine_score_with_server_equals_in_process(server_url, tiny_model_dir, tmp_path):
    rows = [{"context": "The cat sat on", "continuation": c, "id": i} for i, c in enumerate([" the mat", " a hat"])]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(tmp_path / "in.jsonl"),
                "--output",
                str(local),
                "--model",
                str(tiny_model_dir),
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    assert (
        engine_main(["score", "--input", str(tmp_path / "in.jsonl"), "--output", str(remote), "--server", server_url])
        == 0
    )
    for a, b in zip(map(json.loads, open(local)), map(json.loads, open(remote))):
        assert a.keys() == b.keys() and a["id"] == b["id"] and a["is_greedy"] == b["is_greedy"]
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"], abs=1e-5)


def test_icqs_score_with_server_equals_in_process(server_url, tiny_model_dir, tmp_path):
    (tmp_path / "task.yaml").write_text(TASK)
    rows = [
        {"id": f"{m}{i}", "model": m, "x": x, "y": y}
        for m, answers in (("good", ["yes", "no"]), ("bad", ["no", "yes"]))
        for i, (x, y) in enumerate(zip(["four", "five"], answers))
    ]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [
        "score",
        str(tmp_path / "task.yaml"),
        str(tmp_path / "c.jsonl"),
        "--method",
        "icqs",
        "epistemic",
        "icl",
        "judge",
        "--quiet",
    ]
    assert (
        icqs_main(common + ["--out", str(tmp_path / "local"), "--model", str(tiny_model_dir), "--dtype", "float32"])
        == 0
    )
    assert icqs_main(common + ["--out", str(tmp_path / "remote"), "--server", server_url]) == 0
    for name in ("loglik.jsonl", "scores.jsonl"):
        local = [json.loads(x) for x in open(tmp_path / "local" / name)]
        remote = [json.loads(x) for x in open(tmp_path / "remote" / name)]
        assert len(local) == len(remote) > 0
        for a, b in zip(local, remote):
            assert a.keys() == b.keys()
            for k in a:
                if isinstance(a[k], float) or (isinstance(a[k], list) and a[k] and isinstance(a[k][0], float)):
                    assert b[k] == pytest.approx(a[k], abs=1e-4), (name, k)
                else:
                    assert b[k] == a[k], (name, k)


def test_icqs_judge_with_server_equals_in_process(tmp_path_factory, tmp_path):
    """The judge scores and generates through the client, and counts prompt tokens with its tokenizer."""
    from tiny_models import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("judge") / "llama", max_position_embeddings=4096)
    items = [{"id": f"q{n}", "question": f"What is {n} + {n}?", "response": f"It is {2 * n}."} for n in range(3)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    runs = {}
    engine = Engine.load(str(model), dtype="float32", keep_cache=True)
    with live_server(create_app(engine, model_name="judge")) as url:
        for name, where in (("local", ["--model", str(model), "--dtype", "float32"]), ("remote", ["--server", url])):
            run = tmp_path / name
            run.mkdir()
            (run / "demos.jsonl").write_text(
                "".join(
                    json.dumps({"id": it["id"], "rating": n + 5, "reason": "ok"}) + "\n" for n, it in enumerate(items)
                )
            )
            assert (
                icqs_main(
                    [
                        "judge",
                        str(tmp_path / "in.jsonl"),
                        "--out",
                        str(run),
                        *where,
                        "--shots",
                        "0,1",
                        "--runs",
                        "2",
                        "--generate",
                        "--max-tokens",
                        "3",
                        "--batch",
                        "2",
                        "--quiet",
                    ]
                )
                == 0
            )
            runs[name] = sorted(
                (json.loads(x) for x in open(run / "grades.jsonl")), key=lambda r: (r["id"], r["k"], r["run"])
            )
    assert len(runs["local"]) == len(runs["remote"]) == 12
    for a, b in zip(runs["local"], runs["remote"]):
        assert (a["id"], a["k"], a["run"]) == (b["id"], b["k"], b["run"]) and a.get("parsed") == b.get("parsed")
        assert b["probs"] == pytest.approx(a["probs"], abs=1e-5)
