"""`python -m engine score --ray`: the rows of a score command run on a DistributedEngine, written in input order
as they arrive (commands/engine_cli.py has checked everything before)."""

from __future__ import annotations

import sys

from frontends.ray_runner import DistributedEngine

from .tables import write_result


def score_rows(args, engine: DistributedEngine, todo: list[tuple[int | str, dict]], encoded, out) -> int:
    """`python -m engine score --ray`, once engine/cli.py has checked everything (the same checks and errors as the
    local path) and found the rows to do (`todo`: (where, row) after those a previous run wrote). Results arrive in
    any order; each is appended to `out` (commands.tables: JSONL or Parquet), in input order, as soon as the rows
    before it are there, so the output resumes exactly as the local path's does. The workers stop at the end."""
    ready, written = {}, 0
    with engine:

        def on_result(i, result, worker):
            nonlocal written
            ready[i] = result
            while written in ready:
                line, row = todo[written]
                res = ready.pop(written)
                write_result(out, row, res, args.input, line)
                written += 1

        engine.score(encoded, progress=not args.quiet, on_result=on_result)  # token ids: used as they are
    s, plan = engine.last_stats, engine.last_plan
    print(
        f"scored {len(todo)} requests on {engine.cluster.workers} Ray workers, {plan.shards} shards of {plan.keys} prefix "
        f"keys: {s.tokens_computed} tokens computed of {s.tokens_requested} requested",
        file=sys.stderr,
    )
    return 0
