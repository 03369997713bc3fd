"""The `icqs` command line: score, leaderboard, report, demo; the judges and ALLURE packages add their subcommands
through `register(subparsers)` in icqs.judges.cli and icqs.allure.cli.

Contract for a registered subcommand: listed in COMMANDS (its module and one line of help), then, in that module's
`register(subparsers)`, `subparsers.add_parser(name, help=COMMANDS[name].help, description=...)` and
`parser.set_defaults(func=handler)` where `handler(args) -> int | None` is the exit status. Bad input raises
engine.errors.UserError: main() prints `error: <message>` on stderr and exits 2.

Only the module of the command given is imported (and the engine, torch, numpy only when its handler needs them):
`icqs --help`, `icqs` alone and a mistyped command answer from COMMANDS without importing any of them.

The run itself (run directory, methods, leaderboard) is icqs.score_run; this module only reads the options.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from commands.cli_args import ArgumentParser, run_command
from engine.errors import UserError, did_you_mean

from .command_table import COMMANDS


def _load_task(args, overrides: dict | None = None):
    """The TASK argument's task; a JSONL file there (the two files given the other way round) says so."""
    from .task import load_task

    try:
        return load_task(args.task, overrides)
    except UserError as e:
        if not _looks_like_jsonl(args.task):
            raise
        raise UserError(
            f"this looks like a JSONL file of candidates, not a task YAML: the order is `icqs "
            f"{args.command} TASK.yaml CANDIDATES.jsonl` (swapped?); read as a task: {e}",
            args.task,
        ) from None


def _looks_like_jsonl(path: str) -> bool:
    """A regular file (not a FIFO, which would block) whose first non-blank line is a JSON object."""
    import json
    import os

    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return False
    line = next((ln for ln in head.splitlines() if ln.strip()), "")
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def cmd_score(args) -> None:
    from commands.factory import engine_from_args, model_label

    from .candidates import check_labels, check_truth_dists, read_candidates
    from .run_dirs import ScoreRun
    from .run_tables import show
    from .score_run import describe_model, record_headline, score_run, score_run_dir

    task = _load_task(args, {key: getattr(args, key) for key in ("M", "N", "L", "seed", "balance", "calibrate")})
    candidates = read_candidates(args.candidates)
    check_truth_dists(candidates, task.M + 1, args.candidates)
    check_labels(candidates, task, args.candidates)
    if "icl" in args.method and not task.is_label_task:
        raise UserError(
            "the icl method needs a label task (every pool answer one of a few 'labels'); this task's "
            "answers are free text, which plain ICL cannot predict: leave icl out of --method",
            args.task,
        )
    model = model_label(args)
    run = score_run_dir(args.out, task, candidates, model, args.sampler, args.method, args.draws)  # nothing written
    engine = engine_from_args(args, keep_cache=True)  # chunks of one job reuse the demo sets
    rows = score_run(
        engine,
        task,
        candidates,
        run,
        args.method,
        args.sampler,
        model,
        progress=not args.quiet,
        path=args.candidates,
        draws=args.draws,
        audit=not args.no_audit,
        model_info=describe_model(args.server or args.model, engine),
    )
    section = ScoreRun(run.path).leaderboard_of(task, rows, run.meta)
    record_headline(run, section.data["headline"])
    show(args, section.data, section.text, section.warnings)


def cmd_section(args) -> None:
    """`icqs leaderboard DIR` and `icqs audit DIR`, on a run directory of any kind."""
    from .run_dirs import open_run
    from .run_tables import show

    run = open_run(args.dir)
    if getattr(args, "partial", False):
        if run.kind != "score":
            raise UserError(f"--partial is for score runs; this is a {run.kind} run", args.dir)
        run.partial = True
    section = run.leaderboard() if args.section == "leaderboard" else run.audit()
    show(args, section.data, section.text, section.warnings)


def cmd_report(args) -> None:
    from commands.cli_args import check_report_output

    from .run_dirs import open_run
    from .run_tables import say

    if args.output:
        check_report_output(args.output, args.dir, "report.html")  # never over a run's files or an input
    path = open_run(args.dir).report(args.output)
    say(args, f"wrote {path}")


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(args.out, args, progress=not args.quiet)


def cmd_preview(args) -> None:
    from commands.factory import engine_from_args

    from .candidates import Candidate, check_labels, read_candidates
    from .preview import preview

    task = _load_task(args)
    if args.candidates:
        candidates = read_candidates(args.candidates)
        check_labels(candidates, task, args.candidates)
    else:  # the pool's first good example stands for a candidate
        candidates = [Candidate("pool/good0", "pool", task.good[0].x, task.good[0].y)]
    methods = [m for m in args.method if m != "icl" or task.is_label_task]
    if len(methods) < len(args.method):
        print("icl: skipped (a free-text task: plain ICL needs label options)")
    engine = engine_from_args(args, keep_cache=False)
    print(preview(engine, task, candidates, methods, args.sampler, args.draws, not args.no_audit), end="")


def cmd_schema(args) -> None:
    from .contracts import print_schema

    print(print_schema(args.name), end="")


def cmd_init(args) -> None:
    from .demo import write_example

    for path in write_example(args.dir):
        print(f"wrote {path}")
    print(
        f"next: icqs preview {args.dir}/task.yaml {args.dir}/candidates.jsonl\n"
        f"      icqs score {args.dir}/task.yaml {args.dir}/candidates.jsonl --out {args.dir}/run"
    )


def register(subparsers) -> None:
    """This module's own subcommands (their heavy imports happen inside the handlers)."""
    from commands.cli_args import input_path, output_path
    from commands.factory import add_engine_args, draws_int, int_in_range

    from .contracts import FORMATS, NAMES
    from .methods import DEFAULT_METHODS, METHODS
    from .run import add_run_args, deterministic_by_default
    from .run_tables import add_json_arg
    from .sampler import SAMPLERS
    from .task import BALANCE, LIMITS

    methods_help = (
        f"the methods to run (default: {' '.join(DEFAULT_METHODS)}: the likelihood baselines and ICQS "
        "share their engine work; judge, a generation per answer, and icl, label tasks only, on "
        "request): " + "; ".join(f"{name}: {m.title}" for name, m in METHODS.items())
    )
    sampler_help = (
        "how demo sets are drawn (default: coupled): coupled (the sets of the ratios share demos), "
        "independent (a fresh draw per ratio, as in the paper), or bernoulli (random good counts; an "
        "earlier sampler, for comparison)"
    )

    def add(name: str, description: str):
        return subparsers.add_parser(name, help=COMMANDS[name].help, description=description)

    p = add(
        "score",
        "Score each candidate answer with the chosen methods, audit every method on the task's own "
        "good/bad pool, and print the audit and the leaderboard. " + FORMATS["score"] + ".",
    )
    p.add_argument(
        "task",
        type=input_path,
        help="task YAML: template, good and bad example pools, labels, M/N/L "
        "(`icqs schema task`; `icqs init DIR` writes an example)",
    )
    p.add_argument(
        "candidates",
        type=input_path,
        help="candidates JSONL: id, model, x, y, optional truth / truth_dist (`icqs schema candidates`)",
    )
    add_run_args(p, seed_default=None, seed_help="sampling seed (default: the task's)")
    add_json_arg(p)
    p.add_argument(
        "--method", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS), metavar="METHOD", help=methods_help
    )
    p.add_argument("--sampler", choices=SAMPLERS, default="coupled", help=sampler_help)
    p.add_argument(
        "--balance",
        choices=BALANCE,
        default=None,
        help="label tasks: the label counts of every demo set (default: the task's, marginal)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        default=None,
        help="also report scores calibrated with a content-free input (the task's content_free)",
    )
    p.add_argument(
        "--draws",
        type=draws_int,
        default=3,
        help="independent demo draws (seeds seed, seed+1, ...) for the methods that use demos: the "
        "leaderboard's CIs resample them with the questions and it shows the spread between them "
        "(default: 3; 1 is the cost of one)",
    )
    p.add_argument(
        "--no-audit",
        action="store_true",
        help="skip the evaluator audit (each method cross-validated on the task's own good/bad pool)",
    )
    for key, what in (("M", "ratios r = j/M"), ("N", "demos per set"), ("L", "demo sets per ratio")):
        p.add_argument(
            f"--{key}",
            type=int_in_range(1, LIMITS[key]),
            default=None,
            help=f"{what}, at most {LIMITS[key]} (default: the task's)",
        )
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_score)
    runs = "a run directory of `icqs score`, `judge`, `pairwise` or `allure run`"
    for name, description in (
        (
            "leaderboard",
            "Print the models' ranking a run directory holds: a score run's leaderboard per method (after its "
            "evaluator audit), a judge run's mean grade per model beside the truth, a pairwise run's Bradley-Terry "
            "leaderboard (marked when the judge's bias check distrusts it). An ALLURE run ranks no models. No "
            "model is loaded.",
        ),
        (
            "audit",
            "Print a run directory's checks of its own evaluator: a score run's evaluator audit, a judge run's "
            "grades per K and their agreement with the labels, a pairwise run's bias check (measured vs a judge "
            "without bias), an ALLURE run's evaluator per round. No model is loaded.",
        ),
    ):
        p = add(name, description)
        p.add_argument("dir", type=input_path, help=runs)
        if name == "leaderboard":
            p.add_argument(
                "--partial",
                action="store_true",
                help="score runs: when some method lacks results, "
                "rank the complete methods alone (marked PARTIAL) instead of refusing",
            )
        add_json_arg(p)
        p.set_defaults(func=cmd_section, section=name)
    p = add(
        "report",
        "Write the HTML report of " + runs + ": its settings and warnings, its tables with their "
        "CIs, figures, and every item. No model is loaded.",
    )
    p.add_argument("dir", type=input_path, help=runs)
    p.add_argument("--output", default=None, type=output_path, help="HTML file (default: DIR/report.html)")
    p.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    p.set_defaults(func=cmd_report)
    p = add(
        "demo",
        "Score four simulated models (right on 100%, 80%, 60%, 40% of 20 generated movie reviews) "
        "with every method of `icqs score` on the embedded model, audit each method, and print the "
        "leaderboard beside the true ranking; writes a run directory with its HTML report. About 2-3 "
        "minutes on 2 CPU cores.",
    )
    p.add_argument("--out", default="runs/demo", type=output_path, help="run directory (default: runs/demo)")
    p.add_argument("--quiet", action="store_true", help="no banner and no progress")
    p.add_argument("--draws", type=draws_int, default=3, help="independent demo draws (default: 3)")
    p.add_argument("--no-audit", action="store_true", help="skip the evaluator audit")
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_demo)
    p = add(
        "preview",
        "Per method: one fully rendered prompt with its token count, the engine requests and "
        "unique tokens the run (and its audit) would compute, and a time estimate from a short "
        "measurement on this machine. " + FORMATS["score"] + " (optional: without it, a pool "
        "example stands in).",
    )
    p.add_argument("task", type=input_path, help="task YAML (`icqs schema task`)")
    p.add_argument(
        "candidates", nargs="?", default=None, type=input_path, help="candidates JSONL (`icqs schema candidates`)"
    )
    p.add_argument(
        "--method", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS), metavar="METHOD", help=methods_help
    )
    p.add_argument("--sampler", choices=SAMPLERS, default="coupled", help=sampler_help)
    p.add_argument("--draws", type=draws_int, default=3, help="demo draws, as `icqs score --draws` (default: 3)")
    p.add_argument("--no-audit", action="store_true", help="leave the audit's requests out")
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_preview)
    p = add("schema", "Print the JSON Schema of an input format: " + "; ".join(f"{k}: {v}" for k, v in FORMATS.items()))
    p.add_argument("name", choices=NAMES, help="the format: " + ", ".join(NAMES))
    p.set_defaults(func=cmd_schema)
    p = add(
        "init",
        "Write a small working label task (DIR/task.yaml: 12 right and 12 wrong movie-review "
        "sentiments) and the answers of three simulated models to 8 other reviews (DIR/candidates.jsonl, "
        "with their true quality), then print the next commands. Never overwrites a file.",
    )
    p.add_argument("dir", type=output_path, help="the folder to write into (created if missing)")
    p.set_defaults(func=cmd_init)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given the command line, of the command it names only (so that the module
    of no other command is imported; `icqs --help` or an unknown command: the list of COMMANDS alone)."""
    parser = ArgumentParser(
        prog="icqs",
        description="Score LLM answers with in-context quality scoring (ICQS), "
        "judge them with ICL judges, and audit an evaluator with ALLURE. New here: `icqs init "
        "DIR`, then the commands it prints.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if argv is None:
        modules = dict.fromkeys(c.module for c in COMMANDS.values())
    elif argv and argv[0] in COMMANDS:
        modules = [COMMANDS[argv[0]].module]
    else:
        modules = []
        for name, command in COMMANDS.items():
            subparsers.add_parser(name, help=command.help)
    for module in modules:
        importlib.import_module(module).register(subparsers)
    return parser


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # runs the cleanup (temporary files, the run directory's lock) as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        print(
            f"error: unknown command {argv[0]!r}{did_you_mean(argv[0], COMMANDS)} (commands: "
            f"{', '.join(COMMANDS)}; `icqs --help` says what each does)",
            file=sys.stderr,
        )
        return 2
    args = build_parser(argv).parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    return run_command(args.func, args, "finished results are kept")


if __name__ == "__main__":
    sys.exit(main())
