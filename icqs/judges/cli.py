"""`icqs judge` (single answer grading, zero- and many-shot) and `icqs pairwise` (four-variant comparison).

As `icqs score`: JSONL input, a run directory --out (icqs.run.RunDir: run.json with the settings and the engine's
stats, a lock, append-only result rows from which a killed run resumes), tqdm progress, and the summary files
written through a temporary file and a rename. Inputs, options and prompt lengths are checked, and the model
loaded, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from commands.cli_args import input_path
from commands.factory import MAX_BATCH, MAX_BOOTSTRAP, MAX_RUNS, add_engine_args, int_in_range, new_tokens_int
from engine.errors import UserError

from ..contracts import FORMATS
from ..run import MeteredEngine, RunDir, add_run_args, deterministic_by_default, format_stats


def register(subparsers) -> None:
    from ..command_table import COMMANDS

    p = subparsers.add_parser(
        "judge",
        help=COMMANDS["judge"].help,
        description="Input JSONL rows: question, response, optional id. OUT/grades.jsonl rows: "
        "id, k, run, the rating distribution over 1..10 (probs), expected, argmax, and with "
        "--generate the generated answer and its parsed rating (null = unscored); "
        "OUT/summary.json: per K, and the consistency of runs 0 and 1.",
    )
    _common(p)
    p.add_argument(
        "--method",
        choices=("reinforced", "unsupervised"),
        default="reinforced",
        help="the many-shot prompt (default: reinforced): reinforced (each demo is shown solved, with the "
        "model's own generated judgment) or unsupervised (the K demos as unsolved problems, then 4 "
        "solved ones that fix the reply's format)",
    )
    p.add_argument(
        "--shots",
        default="0,1,2,4",
        help="comma-separated K values, or 'auto' (0, 1, 2, 4, ... up to "
        "what fits the model's context); K=0 is the zero-shot prompt (the instruction, the question and the "
        "response, no demos)",
    )
    p.add_argument(
        "--demos",
        type=input_path,
        help="JSONL pool of demo (question, response) rows; default: the input itself, the "
        "graded item left out of its own demos",
    )
    p.add_argument(
        "--demo-tokens", type=new_tokens_int, default=48, help="max tokens of a demo judgment's generated reason"
    )
    p.add_argument(
        "--runs",
        type=int_in_range(1, MAX_RUNS, "each run judges every item again"),
        default=1,
        help="independent demo draws (seed, seed+1, ...); with 2 or more the summary has the consistency "
        "of runs 0 and 1 for every K",
    )
    p.add_argument(
        "--per-item-draws",
        action="store_true",
        help="draw demos for each item separately (the paper's "
        "setting) instead of one draw shared by all items (whose prompts then share the demo block)",
    )
    p.add_argument("--generate", action="store_true", help="also generate the judgment and parse its rating")
    p.add_argument("--max-tokens", type=new_tokens_int, default=64, help="max generated tokens with --generate")
    p.set_defaults(func=_run_judge)

    p = subparsers.add_parser(
        "pairwise",
        help=COMMANDS["pairwise"].help,
        description="Input JSONL rows: question, answer_a, answer_b, optional id, model_a, "
        "model_b (for a leaderboard) and winner (model_a | model_b | tie: accuracy against "
        "it). OUT/verdicts.jsonl rows: each variant's verdict distribution and verdict, the "
        "aggregate; OUT/summary.json: accuracy, bias and flip rates; OUT/leaderboard.json: "
        "the Bradley-Terry leaderboard when every row names its two models.",
    )
    _common(p)
    p.add_argument("--generate", action="store_true", help="also generate each variant's judgment and parse it")
    p.add_argument("--max-tokens", type=new_tokens_int, default=256, help="max generated tokens with --generate")
    p.add_argument(
        "--bootstrap",
        type=int_in_range(1, MAX_BOOTSTRAP, "each resample refits the leaderboard"),
        default=200,
        help="bootstrap rounds for the leaderboard's 95%% CIs",
    )
    p.add_argument("--no-tie", action="store_true", help="two-way verdicts: the judge must pick A or B (no [[C]])")
    p.add_argument(
        "--rubric",
        default=None,
        metavar="FILE",
        type=input_path,
        help="a text file with the criteria the judge should use (appended to its instruction)",
    )
    p.set_defaults(func=_run_pairwise)


MAX_SHOTS = 64  # K values of one judge run


def _common(p) -> None:
    from ..run_tables import add_json_arg

    p.add_argument("input", type=input_path, help=FORMATS[p.prog.split()[-1]])
    add_run_args(p)
    add_json_arg(p)
    add_engine_args(p)
    deterministic_by_default(p)
    p.add_argument(
        "--batch",
        type=int_in_range(1, MAX_BATCH, "items held in memory together"),
        default=16,
        help="items per engine call (the unit of resumption)",
    )


def _items(path: str, fields: tuple[str, ...], schema: str) -> tuple[list[dict], dict[str, int]]:
    """The rows of an input file, each checked against its JSON Schema, and the line of each row's id."""
    from ..contracts import check_row
    from ..io import read_jsonl

    rows, lines = [], {}
    for n, (line, row) in enumerate(read_jsonl(path, required=fields, with_lines=True)):
        check_row(schema, row, path, line)
        row["id"] = str(row.get("id", n))
        if row["id"] in lines:
            raise UserError(f"duplicate id {row['id']!r} (first on line {lines[row['id']]})", path, line)
        lines[row["id"]] = line
        rows.append(row)
    if not rows:
        raise UserError("no rows", path)
    return rows, lines


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def _write_json(path: Path, obj) -> Path:
    from ..io import atomic_write, strict_json

    atomic_write(path, json.dumps(strict_json(obj), indent=2) + "\n")
    return path


def _load_engine(args) -> MeteredEngine:
    # keep_cache: prefixes computed in one engine call (a demo block, a prompt scored then generated from) are
    # reused by the next ones; MeteredEngine: the run records the engine's work. The factory is looked up at the
    # call, as the other commands do, not bound when this module is first imported.
    from commands.factory import engine_from_args

    return MeteredEngine(engine_from_args(args, keep_cache=True))


def _finish(args, run: RunDir, part: str, eng: MeteredEngine, summary: dict, text: str) -> None:
    """Record the engine's work of this run in run.json and the summary, write summary.json, and print the tables
    (or the summary with --json), the warnings and the engine's work."""
    from ..run_tables import say, show

    summary["engine_stats"] = run.add_stats(part, eng.stats)
    path = _write_json(run.path / "summary.json", summary)
    show(args, summary, text, summary["warnings"])
    say(args, f"engine: {format_stats(eng.stats)}")
    say(args, f"summary: {path}  (report: icqs report {run.path})")


def _write_items(run: RunDir, items: list[dict]) -> None:
    """items.jsonl: the input rows as read (their ids made unique strings), so that the run directory alone can be
    reported on (labels, models, texts)."""
    from ..io import atomic_write

    atomic_write(run.path / "items.jsonl", "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))


def _run_judge(args) -> int:
    from engine.progress import progress_bar

    from ..io import ResultWriter
    from ..logs import grades_schema, validator
    from .grading import build_prompts, fitting_shots, grade, prompt_tokens
    from .reinforced import demo_drawer, generate_demos
    from .results import judge_summary, judge_tables

    items, lines = _items(args.input, ("question", "response"), "judge")
    pool = items
    if args.demos:  # a separate pool: its ids must not be taken for graded items (a graded item skips its own demo)
        pool = [{**row, "id": f"demo:{row['id']}"} for row in _items(args.demos, ("question", "response"), "judge")[0]]
    auto = args.shots.strip() == "auto"
    try:
        ks = None if auto else sorted({int(k) for k in args.shots.split(",")})
    except ValueError:
        raise UserError(f"--shots must be comma-separated integers or 'auto', got {args.shots!r}") from None
    if ks is not None and min(ks) < 0:
        raise UserError("--shots must not be negative")
    if ks is not None and len(ks) > MAX_SHOTS:
        raise UserError(f"--shots: {len(ks)} K values; at most {MAX_SHOTS} (each K judges every item again)")
    need = 0 if auto else max(max(ks), 4 if args.method == "unsupervised" and max(ks) else 0)
    if need > len(pool) - (0 if args.demos else 1):  # a graded item is never its own demo
        raise UserError(
            f"{need} demos needed but the demo pool has {len(pool)} items"
            f"{'' if args.demos else ' (one of them the graded item itself)'}; use fewer --shots or a "
            f"larger --demos pool"
        )
    fixed = {
        "input": _digest(items),
        "demos": _digest(pool),
        "model": args.model,
        "dtype": args.dtype,
        "method": args.method,
        "seed": args.seed,
        "demo_tokens": args.demo_tokens,
        "per_item_draws": args.per_item_draws,
        "max_tokens": args.max_tokens if args.generate else None,
    }
    run = RunDir(args.out, "judge", {**fixed, "input_file": args.input}, fixed=tuple(fixed))
    eng = _load_engine(args)
    reserve = args.max_tokens if args.generate else 4
    limit = eng.max_request_tokens - reserve

    def check(prompts, advice: str = "") -> None:
        for it, k, prompt in prompts:
            if (n := prompt_tokens(eng.tokenizer, prompt)) > limit:
                raise UserError(
                    f"item {it['id']!r}: its {k}-shot prompt has {n} tokens, over the {limit} that fit "
                    f"the model's context{advice}",
                    args.input,
                    lines[it["id"]],
                )

    check(build_prompts(items, lambda it: [], [0], args.method))  # before anything is written
    with run.start():
        _write_items(run, items)
        needs_demos = auto or max(ks) > 0
        demos = (
            generate_demos(eng, pool, run.path / "demos.jsonl", args.demo_tokens, progress=not args.quiet)
            if needs_demos
            else {}
        )
        drawers = [demo_drawer(demos, args.seed + r, args.per_item_draws) for r in range(args.runs)]
        if auto:
            ks = fitting_shots(eng.tokenizer, items, drawers, args.method, limit, len(demos))
        for drawer in drawers:
            check(build_prompts(items, drawer, [max(ks)], args.method), "; use fewer --shots (or --shots auto)")
        with ResultWriter(
            run.path / "grades.jsonl", key=("id", "k", "run"), validate=validator(grades_schema())
        ) as log:
            for r, drawer in enumerate(drawers):
                todo = [it for it in items if not all(log.done((it["id"], k, r)) for k in ks)]
                for start in progress_bar(range(0, len(todo), args.batch), desc=f"judge run {r}", disable=args.quiet):
                    jobs = build_prompts(todo[start : start + args.batch], drawer, ks, args.method)
                    for row in grade(eng, jobs, args.generate, args.max_tokens):
                        if not log.done((row["id"], row["k"], r)):
                            log.write({**row, "run": r, "seed": args.seed + r})
            rows = [row for row in log.rows if row["k"] in ks and row["run"] < args.runs]
        summary = {
            "method": args.method,
            "demos": len(demos),
            "demo_pool": len(pool),
            "per_item_draws": args.per_item_draws,
            **judge_summary(items, rows),
        }
        _finish(args, run, "judge", eng, summary, "\n\n".join(t.text() for t in judge_tables(summary)))
    return 0


def _read_rubric(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the rubric ({e.__class__.__name__})", path) from None
    if not text.strip():
        raise UserError("the rubric file is empty", path)
    return text


def _run_pairwise(args) -> int:
    from engine.progress import progress_bar

    from ..io import ResultWriter
    from ..logs import validator, verdicts_schema
    from .pairwise import VARIANTS, pairwise_generated_verdicts, pairwise_logprob_verdicts, verdict_options
    from .prompts import VERDICT_PREFIX, chat_wrap
    from .results import pairwise_summary, pairwise_tables

    items, lines = _items(args.input, ("question", "answer_a", "answer_b"), "pairwise")
    given = [dict(it) for it in items]
    for it in items:
        it["x"], it["y"] = it["answer_a"], it["answer_b"]
    rubric = _read_rubric(args.rubric)
    tie = not args.no_tie
    fixed = {
        "input": _digest(items),
        "model": args.model,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens if args.generate else None,
        "tie": tie,
        "rubric": rubric,
    }
    # the leaderboard's bootstrap may change between runs in OUT: the latest is recorded (its report repeats it)
    run = RunDir(
        args.out,
        "pairwise",
        {**fixed, "input_file": args.input, "bootstrap": args.bootstrap, "seed": args.seed},
        fixed=tuple(fixed),
    )
    eng = _load_engine(args)
    limit = eng.max_request_tokens - (args.max_tokens if args.generate else 0)
    longest_option = max(verdict_options(tie), key=len)
    for it in items:  # before anything is written
        for v in VARIANTS:
            prompt = chat_wrap(eng.tokenizer, v.prompt(it["question"], it["x"], it["y"], tie, rubric), VERDICT_PREFIX)
            if (n := len(eng.tokenizer.encode(prompt + longest_option))) > limit:
                raise UserError(
                    f"item {it['id']!r}: its {v.name} prompt has {n} tokens, over the {limit} that fit "
                    f"the model's context",
                    args.input,
                    lines[it["id"]],
                )
    with run.start(), ResultWriter(run.path / "verdicts.jsonl", key="id", validate=validator(verdicts_schema())) as log:
        _write_items(run, given)
        todo = [it for it in items if not log.done(it["id"])]
        for start in progress_bar(range(0, len(todo), args.batch), desc="pairwise", disable=args.quiet):
            part = todo[start : start + args.batch]
            results = pairwise_logprob_verdicts(eng, part, tie=tie, rubric=rubric)
            if args.generate:
                for res, gen in zip(
                    results, pairwise_generated_verdicts(eng, part, args.max_tokens, tie=tie, rubric=rubric)
                ):
                    res["generated"] = gen
            for it, res in zip(part, results):
                log.write({"id": it["id"], **{k: it[k] for k in ("model_a", "model_b", "winner") if k in it}, **res})
        done = {row["id"]: row for row in log.rows}
        rows = [done[it["id"]] for it in items]
        summary = pairwise_summary(rows, args.bootstrap, args.seed)
        if "leaderboard" in summary:
            _write_json(run.path / "leaderboard.json", summary["leaderboard"])
        _finish(args, run, "pairwise", eng, summary, "\n\n".join(t.text() for t in pairwise_tables(summary)))
    return 0
