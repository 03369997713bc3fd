"""The worker of tests/test_header_fuzz.py: run under the memory limit the test sets (RLIMIT_AS), it reads one JSON
request a line ({"model", "input", "output"}) and scores the model as `python -m engine score` does (its main, in
this process, so that the cases share one start-up), answering one JSON line: the exit status ("crash" with the
traceback when an exception escaped the command), what the command printed on stderr, the scores, and this
process's peak resident memory so far."""

from __future__ import annotations

import contextlib
import io
import json
import math
import resource
import sys
import traceback


def score(model: str, inp: str, out: str) -> dict:
    from commands.engine_cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            status = main(
                [
                    "score",
                    "--model",
                    model,
                    "--input",
                    inp,
                    "--output",
                    out,
                    "--dtype",
                    "float32",
                    "--threads",
                    "1",
                    "--kv-tokens",
                    "4096",
                    "--quiet",
                ]
            )
    except SystemExit as e:
        status = e.code
    except BaseException:  # noqa: BLE001 - what the test must see: an exception the command did not handle
        return {"status": "crash", "stderr": err.getvalue() + traceback.format_exc()}
    rows = []
    if status == 0:
        with open(out, encoding="utf-8") as f:
            rows = [json.loads(line)["logprob"] for line in f]
    return {
        "status": status,
        "stderr": err.getvalue(),
        "logprobs": [lp if math.isfinite(lp) else str(lp) for lp in rows],
    }


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        answer = score(request["model"], request["input"], request["output"])
        answer["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
