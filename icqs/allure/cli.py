"""`icqs allure run|review|report`: the iterative ICL audit of an evaluator LLM.

icqs allure run ITEMS.jsonl --out DIR      rounds of evaluate -> audit -> grow memory, then optionally the ICL-size
                                           sweep and the failure-mode clustering + cluster ablation; resumable
icqs allure review --memory DB             list pending ICL examples and accept / reject them (human audit)
icqs allure report DIR                     summary.json and report.html from a run folder (no model needed)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from commands.cli_args import check_output_file, check_report_output, input_path, output_path
from commands.factory import MAX_CLUSTERS, MAX_EXAMPLES, MAX_ROUNDS, add_engine_args, int_in_range
from engine.errors import UserError
from icqs.run import add_run_args, deterministic_by_default
from icqs.run_tables import add_json_arg


def register(subparsers) -> None:
    from icqs.command_table import COMMANDS

    p = subparsers.add_parser(
        "allure",
        help=COMMANDS["allure"].help,
        description="ALLURE audits an evaluator LLM: "
        "it labels each (task, response) item right or wrong, its labels are checked against "
        "the ground truth (the item's answer matched by a rule, or its human label), and every "
        "mistake becomes an in-context example that the next round shows it.",
    )
    sub = p.add_subparsers(dest="allure_command", required=True, metavar="ACTION")

    r = sub.add_parser(
        "run",
        help="run (or resume) the audit loop on a JSONL file of (task, response) items",
        description="Print the ground truth (how many responses each match rule counts right, with "
        "examples), then run rounds of evaluate -> check against the truth -> add the mistakes as "
        "ICL examples; optionally the ICL-size sweep and the failure-mode clustering. A killed run "
        "resumes from --out. Writes OUT/summary.json and OUT/report.html.",
    )
    r.add_argument(
        "items",
        type=input_path,
        help="JSONL items: response, and answer (a number, option letter or text) or label "
        "(1/0), optional id/match/split/group/... (`icqs schema allure`)",
    )
    add_run_args(r)
    add_json_arg(r)
    add_engine_args(r)
    deterministic_by_default(r)
    r.add_argument(
        "--template",
        default="answer",
        type=input_path,
        help="built-in 'answer' or 'summary', or a YAML file with system, "
        "user (a format string over the items' fields), optional label_prefix, match "
        "(`icqs schema allure-template`)",
    )
    r.add_argument("--memory", default=None, type=output_path, help="SQLite ICL memory (default: OUT/memory.sqlite)")
    r.add_argument(
        "--rounds",
        type=int_in_range(1, MAX_ROUNDS, "each round evaluates every item again"),
        default=3,
        help="rounds of the loop, at most (default: 3; it stops early when a round adds no ICL example)",
    )
    r.add_argument("--holdout", type=float, default=0.0, help="fraction of items only measured, never audited")
    r.add_argument("--review", action="store_true", help="new ICL examples wait for `icqs allure review`")
    r.add_argument(
        "--max-icl",
        type=int_in_range(1, MAX_EXAMPLES, "ICL examples in one prompt"),
        default=None,
        help="show at most the newest N examples",
    )
    r.add_argument(
        "--sweep",
        default="",
        help="comma-separated ICL example counts, e.g. 0,4,8,16: the "
        "evaluator re-run with that many of the memory's examples, for the F1/AUC vs examples plot",
    )
    r.add_argument(
        "--failure-modes",
        action="store_true",
        help="cluster the memory's examples (MiniLM, k-means, t-SNE) and ablate each cluster",
    )
    r.add_argument(
        "--clusters",
        type=int_in_range(1, MAX_CLUSTERS, "each cluster is ablated with a full evaluation"),
        default=None,
        help="k for k-means (default: best silhouette)",
    )
    r.set_defaults(func=cmd_run)

    v = sub.add_parser(
        "review",
        help="human audit of pending ICL examples",
        description="List the ICL examples that a `--review` run added and that await a person's "
        "verdict; accept, reject or tag them by id (or interactively on a terminal). Then run "
        "`icqs allure run` again to resume with the accepted ones.",
    )
    v.add_argument("--memory", required=True, help="the run's ICL memory (OUT/memory.sqlite unless --memory)")
    v.add_argument("--all", action="store_true", help="list every example, not only pending ones")
    v.add_argument("--accept", default="", help="comma-separated ids to accept ('pending': all pending)")
    v.add_argument("--reject", default="", help="comma-separated ids to reject")
    v.add_argument("--tag", action="append", default=[], metavar="ID=TEXT", help="set a failure-mode tag")
    v.set_defaults(func=cmd_review)

    o = sub.add_parser(
        "report",
        help="write summary.json and report.html of a run folder",
        description="Write RUN_DIR/summary.json and the HTML report (rounds, ICL-size sweep, failure "
        "modes, memory) from a run's files; no model is loaded.",
    )
    o.add_argument("run_dir", type=input_path, help="the run directory (`icqs allure run --out DIR`)")
    o.add_argument("--out", default=None, type=output_path, help="HTML file (default: RUN_DIR/report.html)")
    o.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    o.set_defaults(func=cmd_report)


MAX_SWEEP = 64  # --sweep sizes: each is a full evaluation


def _ints(text: str, what: str, most: int | None = None) -> list[int]:
    """Comma-separated non-negative integers; with `most`, at most MAX_SWEEP of them, each at most `most`."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise UserError(f"{what} must not be negative, got {text!r}")
    if most is not None and (len(values) > MAX_SWEEP or any(v > most for v in values)):
        raise UserError(
            f"{what}: at most {MAX_SWEEP} values of at most {most:,} (each is a full evaluation with that "
            f"many ICL examples), got {len(values)} values up to {max(values):,}"
        )
    return values


def _settings(args, template, tasks: str) -> dict:
    from .run_dir import file_sha256

    memory = args.memory or os.path.join(args.out, "memory.sqlite")
    return dict(
        tasks=os.path.abspath(tasks),
        tasks_sha256=file_sha256(tasks),
        template=template.to_dict(),
        model=args.model or "default",
        dtype=args.dtype,
        holdout=args.holdout,
        seed=args.seed,
        memory=os.path.abspath(memory),
        rounds=args.rounds,
        review=args.review,
        max_icl=args.max_icl,
    )


def cmd_run(args) -> int:
    from commands.factory import engine_from_args
    from icqs.run import MeteredEngine, format_stats
    from icqs.run_tables import say, show

    from .ablation import cluster_ablation, icl_sweep
    from .evaluator import Evaluator
    from .loop import iterate, shown_examples
    from .memory import Memory
    from .report import rounds_table, write_report
    from .run_dir import AuditRun
    from .tasks import ground_truth_text, load_items
    from .template import load_template

    sizes = _ints(args.sweep, "--sweep", MAX_EXAMPLES)
    template = load_template(args.template)
    items = load_items(args.items, template, args.holdout, args.seed)
    run = AuditRun(
        args.out,
        items,
        _settings(args, template, args.items),  # checked, nothing written
        progress=not args.quiet,
    )
    if args.memory and not Path(args.memory).is_file():  # made after the model loads (the default: in --out)
        check_output_file(args.memory)
    memory_path = run.settings["memory"]
    if os.path.exists(memory_path):  # read only, before anything is created: a bad memory leaves no run folder
        if not Path(memory_path).is_file():
            raise UserError("not a file, expected an ICL memory database", memory_path)
        Memory.check(memory_path)
    engine = MeteredEngine(engine_from_args(args, keep_cache=True))
    evaluator = Evaluator(engine, template)
    for line in ground_truth_text(items, template).splitlines():  # every check passed; before any round
        if line.startswith("warning:"):
            print(line, file=sys.stderr)  # also with --quiet
        else:
            say(args, line)
    with run.start():
        memory = Memory(run.settings["memory"])
        try:
            provenance = dict(tasks=run.settings["tasks"], model=run.settings["model"], template=template.name)
            outcome = iterate(run, evaluator, memory, args.rounds, args.review, args.max_icl, provenance)
            say(args, outcome.message)
            if outcome.status != "review":
                ids = shown_examples(memory, args.max_icl)
                if sizes:
                    icl_sweep(run, evaluator, memory, ids, sizes, args.seed)
                if args.failure_modes:
                    _failure_modes(run, evaluator, memory, ids, args.clusters, args.seed, cluster_ablation)
            run.add_stats("allure", engine.stats)
            path, s = write_report(run, memory)
            show(args, s, rounds_table(s["rounds"]).text())
            say(args, f"engine: {format_stats(engine.stats)}")
            say(args, f"report: {path}")
        finally:
            memory.close()
    return 0


def _failure_modes(run, evaluator, memory, ids, k, seed, cluster_ablation) -> None:
    from icqs.io import atomic_write, strict_json

    from .failure_modes import MiniLM, failure_modes, tag_memory
    from .report import MODES_FILE, load_modes

    if len(ids) < 3:
        print(f"warning: --failure-modes: {len(ids)} ICL example(s), too few to cluster", file=sys.stderr)
        return
    modes = load_modes(run)
    if modes is None or modes["ids"] != ids:
        modes = failure_modes(memory.examples(ids=ids), MiniLM(), k, seed)
        atomic_write(run.path / MODES_FILE, json.dumps(strict_json(modes), indent=1) + "\n")
    tag_memory(memory, modes)
    cluster_ablation(run, evaluator, memory, ids, modes)


def cmd_review(args) -> int:
    from .memory import Memory

    if not Path(args.memory).is_file():
        raise UserError("no such memory file", args.memory)
    with Memory(args.memory) as mem:
        accept = (
            [e.id for e in mem.examples(status="pending")]
            if args.accept.strip() == "pending"
            else _ints(args.accept, "--accept")
        )
        reject = _ints(args.reject, "--reject")
        tags = []
        for t in args.tag:
            ex_id, sep, text = t.partition("=")
            if not sep:
                raise UserError(f"--tag wants ID=TEXT, got {t!r}")
            tags.append((_ints(ex_id, "--tag id")[0], text.strip() or None))
        for ex_id in accept + reject + [i for i, _ in tags]:
            mem.get(ex_id)  # every id checked before anything is changed
        for ex_id in accept:
            mem.review(ex_id, "accepted")
        for ex_id in reject:
            mem.review(ex_id, "rejected")
        for ex_id, text in tags:
            mem.tag(ex_id, text)
        if not (accept or reject or tags) and sys.stdin.isatty():
            _interactive(mem)
        shown = mem.examples() if args.all else mem.examples(status="pending")
        for e in shown:
            print(
                f"--- #{e.id} [{e.status}] item {e.item_id}, round {e.round}, {e.error_kind}, "
                f"failure mode: {e.failure_mode or '-'}\nuser: {e.user_text}\nassistant: {e.assistant_text}"
            )
        print(f"memory: {json.dumps(mem.counts())}", file=sys.stderr)
    return 0


def _interactive(mem) -> None:
    for e in mem.examples(status="pending"):
        print(
            f"--- #{e.id} item {e.item_id} ({e.error_kind}; the evaluator said {e.evaluator_label})\n"
            f"user: {e.user_text}\nassistant: {e.assistant_text}"
        )
        answer = input("[a]ccept, [r]eject, [s]kip, [q]uit? ").strip().lower()[:1]
        if answer == "q":
            break
        if answer in ("a", "r"):
            mem.review(e.id, "accepted" if answer == "a" else "rejected")


def cmd_report(args) -> int:
    from icqs.run import read_run_json
    from icqs.run_dirs import AllureRun
    from icqs.run_tables import say

    read_run_json(args.run_dir, "allure")  # `icqs report DIR` reports on every kind of run
    if args.out:
        check_report_output(args.out, args.run_dir, "report.html")
    say(args, f"report: {AllureRun(Path(args.run_dir)).report(args.out)}")
    return 0
