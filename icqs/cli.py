"""The `icqs` command line: score, leaderboard, report, demo; the judges and ALLURE packages add their subcommands
through `register(subparsers)` in icqs.judges.cli and icqs.allure.cli.

Contract for a registered subcommand: `subparsers.add_parser(...)`, then `parser.set_defaults(func=handler)` where
`handler(args) -> int | None` is the exit status. Bad input raises engine.errors.UserError: main() prints
`error: <message>` on stderr and exits 2.

A score run directory holds run.json (task, candidates' digest, model, sampler, methods asked for), the raw
results as append-only logs (loglik.jsonl, icl.jsonl, judge.jsonl: a killed run resumes from them), and the
derived scores.jsonl and leaderboard.txt, written whole (temp file + rename).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from engine.errors import UserError
from engine.factory import add_engine_args, model_label

from .io import ResultWriter, atomic_write, open_run, read_results
from .sampler import SAMPLERS
from .task import BALANCE

METHODS = ("icqs", "epistemic", "icl", "judge")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _open_run(out: Path, task, candidates, model: str, sampler: str, methods) -> None:
    """Create run.json, or check that an existing run directory is for the same task, candidates, model, sampler."""
    from .candidates import candidate_row
    from .task import task_to_dict

    meta = {"task": task_to_dict(task), "candidates": _digest([candidate_row(c) for c in candidates]),
            "model": model, "sampler": sampler}
    open_run(out, meta, accumulate={"methods": methods})
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "candidates.jsonl", "".join(json.dumps(candidate_row(c), ensure_ascii=False) + "\n"
                                                   for c in candidates))


def score_run(engine, task, candidates, out, methods=("icqs", "epistemic"), sampler: str = "coupled",
              model: str = "default", progress: bool = True) -> list[dict]:
    """Compute (or resume) the methods for every candidate into `out`, then write scores.jsonl; returns its rows."""
    from .baselines import compute_icl, compute_judge
    from .scoring import compute_loglik

    out = Path(out)
    _open_run(out, task, candidates, model, sampler, methods)
    if "icqs" in methods or "epistemic" in methods:
        with ResultWriter(out / "loglik.jsonl", ("sampler", "l", "id")) as w:
            compute_loglik(engine, task, candidates, w, sampler, task.L if "epistemic" in methods else 1,
                           progress=progress)
    if "icl" in methods:
        with ResultWriter(out / "icl.jsonl", "id") as w:
            compute_icl(engine, task, candidates, w, sampler, progress=progress)
    if "judge" in methods:
        with ResultWriter(out / "judge.jsonl", "id") as w:
            compute_judge(engine, task, candidates, w, progress=progress)
    _, _, rows = load_scores(out)
    atomic_write(out / "scores.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def load_scores(out) -> tuple:
    """(task, candidates, score rows) of a run directory, for every method whose raw results are complete."""

    from . import baselines, scoring
    from .candidates import read_candidates
    from .task import task_from_dict

    out = Path(out)
    if not (out / "run.json").exists():
        raise UserError("not a score run directory (no run.json); make one with `icqs score`", str(out))
    meta = json.loads((out / "run.json").read_text())
    task, candidates = task_from_dict(meta["task"]), read_candidates(out / "candidates.jsonl")
    base = [{"id": c.id, "model": c.model, "truth": c.truth, "truth_dist": c.truth_dist} for c in candidates]
    rows = []
    for method in [m for m in METHODS if m in meta["methods"]]:
        if method in ("icqs", "epistemic"):
            scores = scoring.method_scores(read_results(out / "loglik.jsonl"), candidates, task, meta["sampler"],
                                           epistemic=method == "epistemic")
            if scores is None:  # some row missing: the run stopped early
                continue
        else:
            by_id = {r["id"]: r for r in read_results(out / f"{method}.jsonl")}
            if any(c.id not in by_id for c in candidates):
                continue
            scores = [baselines.icl_score(task, c, by_id[c.id]) if method == "icl" else baselines.judge_score(
                by_id[c.id]) for c in candidates]
        rows += [{"method": method, **b, **s} for b, s in zip(base, scores)]
    return task, candidates, rows


def _load_engine(args):
    from engine.factory import engine_from_args
    return engine_from_args(args, keep_cache=True)  # chunks of one job reuse the demo sets


def print_leaderboard(out: Path, rows: list[dict], task) -> str:
    from .aggregate import format_leaderboards, leaderboard
    boards = [leaderboard(rows, m) for m in METHODS if any(r["method"] == m for r in rows)]
    text = format_leaderboards(boards, title=f"task {task.name}, {len({r['id'] for r in rows})} candidates")
    atomic_write(out / "leaderboard.txt", text)
    atomic_write(out / "leaderboard.json", json.dumps(boards, indent=1, ensure_ascii=False))
    print(text)
    return text


def cmd_score(args) -> None:
    from .candidates import check_truth_dists, read_candidates
    from .task import load_task

    task = load_task(args.task)
    for key in ("M", "N", "L", "seed", "balance", "calibrate"):
        if getattr(args, key) is not None:
            if key in ("M", "N", "L") and getattr(args, key) < 1:
                raise UserError(f"--{key} must be a positive integer")
            setattr(task, key, getattr(args, key))
    task.check_ratio_grid()
    candidates = read_candidates(args.candidates)
    check_truth_dists(candidates, task.M + 1, args.candidates)
    if "icl" in args.method and not task.labels:
        raise UserError("the icl method needs label options ('labels' in the task)", args.task)
    engine = _load_engine(args)
    out = Path(args.out)
    model = model_label(args)
    rows = score_run(engine, task, candidates, out, args.method, args.sampler, model, progress=not args.quiet)
    print_leaderboard(out, rows, task)


def cmd_leaderboard(args) -> None:
    task, _, rows = load_scores(args.dir)
    if not rows:
        raise UserError("no method has complete results yet; run `icqs score` again to finish", args.dir)
    print_leaderboard(Path(args.dir), rows, task)


def cmd_report(args) -> None:
    from .report import write_report
    path = write_report(args.dir, args.output)
    print(f"wrote {path}")


def cmd_demo(args) -> None:
    from .demo import run_demo
    run_demo(args.out, args, progress=not args.quiet)


def _model_args(p) -> None:
    add_engine_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def register(subparsers) -> None:
    """This package's own subcommands (their heavy imports happen inside the handlers)."""
    p = subparsers.add_parser("score", help="score candidate answers with ICQS and the baselines")
    p.add_argument("task", help="task YAML")
    p.add_argument("candidates", help="candidates JSONL (id, model, x, y, optional truth / truth_dist)")
    p.add_argument("--out", required=True, help="run directory (a killed run resumes from it)")
    p.add_argument("--method", nargs="+", choices=METHODS, default=["icqs", "epistemic"])
    p.add_argument("--sampler", choices=SAMPLERS, default="coupled",
                   help="demo sets: coupled across ratios (default), independent per ratio as in the paper, or "
                        "bernoulli (the earlier sampler: random good counts; for comparison)")
    p.add_argument("--balance", choices=BALANCE, default=None,
                   help="label tasks: the label counts of every demo set (default: the task's, marginal)")
    p.add_argument("--calibrate", action="store_true", default=None,
                   help="also report scores calibrated with a content-free input (the task's content_free)")
    for key, what in (("M", "ratios r = j/M"), ("N", "demos per set"), ("L", "demo sets per ratio"),
                      ("seed", "sampling seed")):
        p.add_argument(f"--{key}", type=int, default=None, help=f"{what} (default: the task's)")
    _model_args(p)
    p.set_defaults(func=cmd_score)
    p = subparsers.add_parser("leaderboard", help="print the leaderboard of a score run directory")
    p.add_argument("dir")
    p.set_defaults(func=cmd_leaderboard)
    p = subparsers.add_parser("report", help="write the HTML report of a score run directory")
    p.add_argument("dir")
    p.add_argument("--output", default=None, help="HTML file (default: DIR/report.html)")
    p.set_defaults(func=cmd_report)
    p = subparsers.add_parser("demo", help="score simulated models on a built-in task; leaderboard and report")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    _model_args(p)
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="icqs", description="In-context quality scoring of LLM answers.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _subcommand_modules():
        module.register(subparsers)
    return parser


def _subcommand_modules() -> list:
    """The modules whose `register(subparsers)` adds subcommands: this one, the judges' and ALLURE's."""
    from .allure import cli as allure_cli
    from .judges import cli as judges_cli

    return [sys.modules[__name__], judges_cli, allure_cli]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (finished results are kept; run the same command again to resume)", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
