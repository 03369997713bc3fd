"""`python -m engine score --model PATH --input pairs.jsonl --output out.jsonl`

Each input row has `context` and `continuation` (text); other fields pass through to the output row, which adds
`logprob`, `token_logprobs`, `num_tokens` and `is_greedy`. The output file appears only when every row is done."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

from .errors import UserError
from .factory import add_engine_args
from .jsonl import read_jsonl


def _check_pair(row: dict) -> str | None:
    for key in ("context", "continuation"):
        if not isinstance(row.get(key), str):
            return f"missing or non-text field {key!r}"
    return None if row["continuation"] else "empty continuation: nothing to score"


def cmd_score(args) -> int:
    from .factory import engine_from_args

    if args.ray is not None:  # on a Ray cluster: engine/distributed.py
        from .distributed import score_file
        return score_file(args, _check_pair)
    rows = read_jsonl(args.input, validate=_check_pair)
    eng = engine_from_args(args)
    results = eng.score([(r["context"], r["continuation"]) for r in rows], share_prefix=not args.no_share,
                        progress=True)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".part", encoding="utf-8") as f:
        for row, res in zip(rows, results):
            f.write(json.dumps({**row, "logprob": res.logprob, "token_logprobs": res.token_logprobs,
                                "num_tokens": res.num_tokens, "is_greedy": res.is_greedy}) + "\n")
    os.replace(f.name, args.output)
    s = eng.last_stats
    print(f"scored {len(rows)} requests: {s['tokens_computed']} tokens computed of {s['tokens_requested']} "
          f"requested, {s['forward_steps']} steps, peak {s['peak_kv_pages']} KV pages", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="score (context, continuation) pairs from a JSONL file")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    add_engine_args(s)
    s.add_argument("--no-share", action="store_true", help="turn prefix sharing off (for comparisons)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return cmd_score(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
