"""schemathesis against the live server (127.0.0.1, tiny float32 model), bounded: EXAMPLES per operation in its
coverage and fuzzing phases, one worker, a fixed seed, well under two minutes. No response may be a 5xx, and none
may disagree with the OpenAPI schema the server publishes (status codes, content types, response bodies and
headers, and a request the schema says is invalid must be refused). Not checked: that every schema-valid request
is accepted, since a prompt's length in tokens, which the schema cannot know, decides that. The figures (test
cases, requests the server answered by status) are printed: run with -s to see them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import live_server

from engine import Engine
from frontends.server.app import create_app

pytest.importorskip("schemathesis")

EXAMPLES = 20
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
    "response_headers_conformance,negative_data_rejection"
)


def _requests_by_status(url: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for _endpoint, status, value in re.findall(
        r'http_requests_total\{endpoint="([^"]*)",status="(\d+)"\} (\S+)', httpx.get(url + "/metrics").text
    ):
        counts[status] = counts.get(status, 0) + float(value)
    return counts


def test_schemathesis_finds_no_5xx_and_no_schema_mismatch(tmp_path):
    from tiny_models import make_tiny_model

    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if st is None:
        pytest.skip("the schemathesis command is not installed")
    model = make_tiny_model(tmp_path / "model", max_position_embeddings=256)
    engine = Engine.load(str(model), dtype="float32", keep_cache=True, kv_tokens=4096)
    with live_server(create_app(engine, model_name="tiny", max_queue=64)) as url:
        assert url.startswith("http://127.0.0.1:")
        t0 = time.perf_counter()
        run = subprocess.run(
            [
                st,
                "run",
                f"{url}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                str(EXAMPLES),
                "--workers",
                "1",
                "--phases",
                "examples,coverage,fuzzing",
                "--seed",
                "1",
                "--warnings=off",
                "--request-timeout",
                "60",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        seconds = time.perf_counter() - t0
        by_status = _requests_by_status(url)
    out = run.stdout + run.stderr
    cases = re.search(r"(\d+) generated", out)
    requests = int(sum(v for k, v in by_status.items()))
    server_errors = int(sum(v for k, v in by_status.items() if k.startswith("5")))
    print(
        f"\nschemathesis: {cases.group(1) if cases else '?'} test cases, {requests} requests answered "
        f"({', '.join(f'{k}: {int(v)}' for k, v in sorted(by_status.items()))}), {server_errors} 5xx, "
        f"{seconds:.0f} s"
    )
    assert run.returncode == 0 and "No issues found" in out, out[-6000:]
    assert server_errors == 0 and requests > 0
