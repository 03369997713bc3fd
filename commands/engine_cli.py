"""`python -m engine score --model PATH --input pairs.jsonl --output out.jsonl`

Each input row has `context` and `continuation` (text); other fields pass through to the output row, which adds
`logprob`, `token_logprobs`, `num_tokens` and `is_greedy`. Input and output are JSONL, or Parquet when the name ends
in `.parquet` (engine/tables.py: a Parquet row is named `file:row N` in errors; a Parquet output is a folder of
part files).

Everything is checked before any work: the input (readable UTF-8 JSONL, every row valid), the output (its folder
exists and is writable, it is not a folder), the options, then, once the model is loaded, every request's length,
each error one line naming file:line. Rows are scored in chunks and appended to the output in input order as each
chunk finishes, so a killed run keeps what it finished: the same command again checks that the output's rows are
the input's first rows (same id, context and continuation) and scores only the rest. No temporary file is used."""

from __future__ import annotations

import logging
import sys

from engine.encoding import encode_pairs
from engine.errors import UserError
from engine.stats import EngineStats
from engine.validation import RequestError, check_scores

from . import tables
from .cli_args import ArgumentParser, input_path, output_path, run_command
from .factory import add_engine_args

CHUNK_ROWS = 256  # rows per Engine.score call: the unit of resumption (prefixes are kept across chunks)


def _check_pair(row: dict) -> str | None:
    for key in ("context", "continuation"):
        if not isinstance(row.get(key), str):
            return f"missing or non-text field {key!r}"
    return None if row["continuation"] else "empty continuation: nothing to score"


def _same_request(done: dict, row: dict) -> bool:
    return all(done.get(k) == row.get(k) for k in ("id", "context", "continuation"))


def _finished_rows(output: str, rows: list[tuple[int, dict]], input_path: str) -> int:
    """How many rows a previous run of this job already wrote to `output` (0 if it does not exist); a different
    job's output is refused."""
    done = tables.read_results(output)
    if len(done) > len(rows):
        raise UserError(
            f"holds {len(done)} rows but the input has {len(rows)}; it is another job's output "
            "(use another --output, or delete it)",
            output,
        )
    for j, (old, (line, row)) in enumerate(zip(done, rows), 1):
        if not _same_request(old, row):
            raise UserError(
                f"row {j} is not the request at {input_path}:{line}; it is another job's output (use "
                "another --output, or delete it)",
                output,
            )
    return len(done)


def _at_line(error: UserError, rows: list[tuple[int, dict]], path: str) -> UserError:
    """A request's error (RequestError: its index in the call) named by the request's input line instead."""
    if isinstance(error, RequestError) and error.index is not None and error.index < len(rows):
        return error.at(path, rows[error.index][0])
    return error


def cmd_score(args) -> int:
    from engine.progress import progress_bar

    from .factory import engine_from_args

    if args.ray is not None and args.no_share:
        raise UserError("--ray always shares prefixes (--no-share is for single-process comparisons)")
    rows, schema = tables.read_rows(args.input, ("context", "continuation"), _check_pair)
    if not rows:
        raise UserError("no rows to score", args.input)
    out_schema = tables.check_output(args.output, args.input, rows, schema)
    skip = _finished_rows(args.output, rows, args.input)
    if not getattr(args, "server", None):  # bad options or a damaged model: errors even with nothing left to do
        from engine.loader import load_model_config

        from .factory import engine_options

        engine_options(args)
        load_model_config(args.model)
    if skip == len(rows):
        print(f"{args.output} already holds all {len(rows)} rows; nothing to do", file=sys.stderr)
        return 0
    eng = engine_from_args(args, keep_cache=not args.no_share)  # chunks reuse each other's prefixes
    todo = rows[skip:]
    try:  # the engine's own checks (engine/validation.py), before any work
        encoded = encode_pairs(eng.tokenizer, [(row["context"], row["continuation"]) for _, row in todo])
        check_scores(encoded, 0, eng.limits)
    except UserError as e:
        raise _at_line(e, todo, args.input) from None
    if skip:
        print(f"resuming: {skip} rows already in {args.output}", file=sys.stderr)
    if args.ray is not None:  # the same checks, then the shards on a Ray cluster: frontends/ray_runner.py
        from .ray_score import score_rows

        with tables.open_results(args.output, out_schema) as out:
            return score_rows(args, eng, todo, encoded, out)
    totals = EngineStats()
    with (
        tables.open_results(args.output, out_schema) as out,
        progress_bar(total=len(rows), initial=skip, unit="row", desc="scoring", disable=args.quiet) as bar,
    ):
        for start in range(0, len(todo), CHUNK_ROWS):
            part, ids = todo[start : start + CHUNK_ROWS], encoded[start : start + CHUNK_ROWS]
            try:
                results = eng.score(ids, share_prefix=not args.no_share)
            except UserError as e:  # e.g. a non-finite log-prob; the chunks before it are kept
                raise _at_line(e, part, args.input) from None
            for (line, row), res in zip(part, results):
                tables.write_result(out, row, res, args.input, line)
            totals = totals.plus(eng.last_stats)
            bar.update(len(part))
    print(
        f"scored {len(todo)} requests: {totals.tokens_computed} tokens computed of {totals.tokens_requested} "
        f"requested, {totals.forward_steps} steps, peak {totals.peak_kv_pages} KV pages",
        file=sys.stderr,
    )
    return 0


def add_score_parser(sub) -> None:
    s = sub.add_parser("score", help="score (context, continuation) pairs from a JSONL file")
    s.add_argument(
        "--input", required=True, type=input_path, help="JSONL (or .parquet) rows with context and continuation (text)"
    )
    s.add_argument(
        "--output",
        required=True,
        type=output_path,
        help="JSONL (or .parquet: a folder of parts) results; a killed run resumes from it",
    )
    add_engine_args(s)
    s.add_argument("--no-share", action="store_true", help="turn prefix sharing off (for comparisons)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_score)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    add_score_parser(sub)
    from .serve import add_serve_parser

    add_serve_parser(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return run_command(args.func, args, "finished rows are kept")
