"""The `icqs` command line: score, leaderboard, report, demo; the judges and ALLURE packages add their subcommands
through `register(subparsers)` in icqs.judges.cli and icqs.allure.cli.

Contract for a registered subcommand: `subparsers.add_parser(...)`, then `parser.set_defaults(func=handler)` where
`handler(args) -> int | None` is the exit status. Bad input raises engine.errors.UserError: main() prints
`error: <message>` on stderr and exits 2.

The run itself (run directory, methods, leaderboard) is icqs.score_run; this module only reads the options.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from commands.cli_args import ArgumentParser, check_report_output, run_command
from engine.errors import UserError
from commands.factory import add_engine_args, draws_int, engine_from_args, int_in_range, model_label

from .methods import DEFAULT_METHODS, METHODS
from .run_dirs import ScoreRun, open_run
from .run_tables import add_json_arg, say, show
from .run import add_run_args, deterministic_by_default
from .sampler import SAMPLERS
from .task import BALANCE, LIMITS
from .score_run import describe_model, record_headline, score_run, score_run_dir


def cmd_score(args) -> None:
    from .candidates import check_labels, check_truth_dists, read_candidates
    from .task import load_task

    task = load_task(args.task, {key: getattr(args, key) for key in ("M", "N", "L", "seed", "balance", "calibrate")})
    candidates = read_candidates(args.candidates)
    check_truth_dists(candidates, task.M + 1, args.candidates)
    check_labels(candidates, task, args.candidates)
    if "icl" in args.method and not task.is_label_task:
        raise UserError("the icl method needs a label task (every pool answer one of a few 'labels'); this task's "
                        "answers are free text, which plain ICL cannot predict: leave icl out of --method", args.task)
    model = model_label(args)
    run = score_run_dir(args.out, task, candidates, model, args.sampler, args.method, args.draws)  # nothing written
    engine = engine_from_args(args, keep_cache=True)  # chunks of one job reuse the demo sets
    rows = score_run(engine, task, candidates, run, args.method, args.sampler, model, progress=not args.quiet,
                     path=args.candidates, draws=args.draws, audit=not args.no_audit,
                     model_info=describe_model(args.server or args.model, engine))
    section = ScoreRun(run.path).leaderboard_of(task, rows, run.meta)
    record_headline(run, section.data["headline"])
    show(args, section.data, section.text, section.warnings)


def cmd_section(args) -> None:
    """`icqs leaderboard DIR` and `icqs audit DIR`, on a run directory of any kind."""
    run = open_run(args.dir)
    section = run.leaderboard() if args.section == "leaderboard" else run.audit()
    show(args, section.data, section.text, section.warnings)


def cmd_report(args) -> None:
    if args.output:
        check_report_output(args.output, args.dir, "report.html")  # never over a run's files or an input
    path = open_run(args.dir).report(args.output)
    say(args, f"wrote {path}")


def cmd_demo(args) -> None:
    from .demo import run_demo
    run_demo(args.out, args, progress=not args.quiet)


def cmd_preview(args) -> None:
    from .candidates import Candidate, check_labels, read_candidates
    from .preview import preview
    from .task import load_task

    task = load_task(args.task)
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
    print(f"next: icqs preview {args.dir}/task.yaml {args.dir}/candidates.jsonl\n"
          f"      icqs score {args.dir}/task.yaml {args.dir}/candidates.jsonl --out {args.dir}/run")


def register(subparsers) -> None:
    """This package's own subcommands (their heavy imports happen inside the handlers)."""
    from .contracts import FORMATS, NAMES
    p = subparsers.add_parser("score", help="score candidate answers with ICQS and the baselines",
                              description="Score each candidate answer with the chosen methods, audit every method "
                              "on the task's own good/bad pool, and print the audit and the leaderboard. "
                              + FORMATS["score"] + ".")
    p.add_argument("task", help="task YAML: template, good and bad example pools, labels, M/N/L "
                                "(`icqs schema task`; `icqs init DIR` writes an example)")
    p.add_argument("candidates", help="candidates JSONL: id, model, x, y, optional truth / truth_dist "
                                      "(`icqs schema candidates`)")
    add_run_args(p, seed_default=None, seed_help="sampling seed (default: the task's)")
    add_json_arg(p)
    p.add_argument("--method", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS),
                   help=f"default: {' '.join(DEFAULT_METHODS)} (the likelihood baselines and ICQS share their "
                        "engine work); judge (a generation per answer) and icl (label tasks) on request")
    p.add_argument("--sampler", choices=SAMPLERS, default="coupled",
                   help="demo sets: coupled across ratios (default), independent per ratio as in the paper, or "
                        "bernoulli (the earlier sampler: random good counts; for comparison)")
    p.add_argument("--balance", choices=BALANCE, default=None,
                   help="label tasks: the label counts of every demo set (default: the task's, marginal)")
    p.add_argument("--calibrate", action="store_true", default=None,
                   help="also report scores calibrated with a content-free input (the task's content_free)")
    p.add_argument("--draws", type=draws_int, default=3,
                   help="independent demo draws (seeds seed, seed+1, ...) for the methods that use demos: the "
                        "leaderboard's CIs resample them with the questions and it shows the spread between them "
                        "(default: 3; 1 is the cost of one)")
    p.add_argument("--no-audit", action="store_true",
                   help="skip the evaluator audit (each method cross-validated on the task's own good/bad pool)")
    for key, what in (("M", "ratios r = j/M"), ("N", "demos per set"), ("L", "demo sets per ratio")):
        p.add_argument(f"--{key}", type=int_in_range(1, LIMITS[key]), default=None,
                       help=f"{what}, at most {LIMITS[key]} (default: the task's)")
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_score)
    runs = "a run directory of `icqs score`, `judge`, `pairwise` or `allure run`"
    for name, help_, description in (
            ("leaderboard", "print the leaderboard of a run directory (score, judge, pairwise)",
             "Print the models' ranking a run directory holds: a score run's leaderboard per method (after its "
             "evaluator audit), a judge run's mean grade per model beside the truth, a pairwise run's Bradley-Terry "
             "leaderboard (marked when the judge's bias check distrusts it). An ALLURE run ranks no models."),
            ("audit", "print how far a run's evaluator can be trusted",
             "Print a run directory's checks of its own evaluator: a score run's evaluator audit, a judge run's "
             "grades per K and their agreement with the labels, a pairwise run's bias check (measured vs a judge "
             "without bias), an ALLURE run's evaluator per round.")):
        p = subparsers.add_parser(name, help=help_, description=description)
        p.add_argument("dir", help=runs)
        add_json_arg(p)
        p.set_defaults(func=cmd_section, section=name)
    p = subparsers.add_parser("report", help="write the HTML report of a run directory (any kind)",
                              description="Write the HTML report of " + runs + ": its settings and warnings, "
                              "its tables with their CIs, figures, and every item.")
    p.add_argument("dir", help=runs)
    p.add_argument("--output", default=None, help="HTML file (default: DIR/report.html)")
    p.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    p.set_defaults(func=cmd_report)
    p = subparsers.add_parser("demo", help="score simulated models on a built-in task; leaderboard and report")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--draws", type=draws_int, default=3, help="independent demo draws (default: 3)")
    p.add_argument("--no-audit", action="store_true", help="skip the evaluator audit")
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_demo)
    p = subparsers.add_parser("preview", help="show each method's rendered prompt, requests, tokens and time "
                              "estimate without scoring", description="Per method: one fully rendered prompt with "
                              "its token count, the engine requests and unique tokens the run (and its audit) would "
                              "compute, and a time estimate from a short measurement on this machine. "
                              + FORMATS["score"] + " (optional: without it, a pool example stands in).")
    p.add_argument("task", help="task YAML (`icqs schema task`)")
    p.add_argument("candidates", nargs="?", default=None, help="candidates JSONL (`icqs schema candidates`)")
    p.add_argument("--method", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS))
    p.add_argument("--sampler", choices=SAMPLERS, default="coupled")
    p.add_argument("--draws", type=draws_int, default=3, help="demo draws, as `icqs score --draws`")
    p.add_argument("--no-audit", action="store_true", help="leave the audit's requests out")
    add_engine_args(p)
    deterministic_by_default(p)
    p.set_defaults(func=cmd_preview)
    p = subparsers.add_parser("schema", help="print the JSON Schema of an input format",
                              description="Print the JSON Schema of an input format: " + "; ".join(
                                  f"{k}: {v}" for k, v in FORMATS.items()))
    p.add_argument("name", choices=NAMES)
    p.set_defaults(func=cmd_schema)
    p = subparsers.add_parser("init", help="write a small working example task and candidates into DIR")
    p.add_argument("dir")
    p.set_defaults(func=cmd_init)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="icqs", description="In-context quality scoring of LLM answers.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _subcommand_modules():
        module.register(subparsers)
    return parser


def _subcommand_modules() -> list:
    """The modules whose `register(subparsers)` adds subcommands: this one, the judges' and ALLURE's."""
    from .allure import cli as allure_cli
    from .judges import cli as judges_cli

    return [sys.modules[__name__], judges_cli, allure_cli]


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # runs the cleanup (temporary files, the run directory's lock) as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    return run_command(args.func, args, "finished results are kept")


if __name__ == "__main__":
    sys.exit(main())
