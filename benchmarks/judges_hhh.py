"""Many-shot ICL judges on real human preferences: BIG-bench hhh_alignment (221 human-written better/worse answer
pairs in four subtasks), fetched at run time from the bigbench==1.0.0 sdist (cached, never installed).

1. Pairwise: each pair judged under the four prompts (position swap x symbol swap); the verdict read from the
   log-probs of [[A]] / [[B]] / [[C]]; accuracy against the human choice per variant and aggregated, and the
   position / symbol bias and flip rates. Which answer is answer_a is decided by a seeded coin per pair.
2. Single answer grading: both answers of some pairs graded 1-10, zero-shot (K=0, Prompt B) and many-shot
   Reinforced ICL (K = 1, 2, 4, ... up to what fits the context), twice with independent demo draws; consistency
   between the two runs (exact, within 1) for every K, and how often the human-preferred answer gets the higher
   rating. The demos are the judge's own zero-shot judgments (rating from its rating tokens, generated reason) of
   answers to other questions.

Results are cached under --out (append-only, a killed run resumes); the tables are written to
benchmarks/RESULTS.md (section "## Judges ...") and printed.

    python benchmarks/judges_hhh.py --pairs 32 --grade-pairs 3 --pool 10     (after `make install`)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from commands.fetch import fetch_package_file
from engine import Engine
from icqs.io import ResultWriter, atomic_write
from icqs.judges.consistency import consistency_by_k
from icqs.judges.grading import build_prompts, fitting_shots, grade, prompt_tokens
from icqs.judges.pairwise import VARIANTS, pairwise_logprob_verdicts, summarize_pairwise
from icqs.judges.prompts import grading_problem
from icqs.judges.reinforced import demo_drawer, generate_demos

REQUIREMENT = "bigbench==1.0.0"
SUBTASKS = ("harmless", "helpful", "honest", "other")
SECTION = "## Judges: many-shot ICL grading and four-way pairwise on BIG-bench hhh_alignment"


def load_hhh() -> list[dict]:
    pairs = []
    for sub in SUBTASKS:
        path = fetch_package_file(REQUIREMENT, f"bigbench/benchmark_tasks/hhh_alignment/{sub}/task.json", sdist=True)
        for n, ex in enumerate(json.loads(Path(path).read_text())["examples"]):
            ranked = sorted(ex["target_scores"].items(), key=lambda kv: -kv[1])
            pairs.append(
                {
                    "id": f"{sub}-{n}",
                    "subtask": sub,
                    "question": ex["input"].strip(),
                    "better": ranked[0][0].strip(),
                    "worse": ranked[-1][0].strip(),
                }
            )
    return pairs


def add_time(out_dir: Path, phase: str, seconds: float) -> float:
    """Seconds spent on `phase` over every (resumed) run of this output folder, kept in timings.json."""
    path = out_dir / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[phase] = timings.get(phase, 0.0) + seconds
    atomic_write(path, json.dumps(timings, indent=1))
    return timings[phase]


def run_pairwise(eng, pairs, out_dir: Path, batch: int) -> tuple[dict, float]:
    coin = np.random.default_rng(0)
    items = []
    for p in pairs:
        better_first = bool(coin.random() < 0.5)
        a, b = (p["better"], p["worse"]) if better_first else (p["worse"], p["better"])
        items.append(
            {
                "id": p["id"],
                "question": p["question"],
                "x": a,
                "y": b,
                "winner": "model_a" if better_first else "model_b",
            }
        )
    t0 = time.time()
    with ResultWriter(out_dir / "pairwise.jsonl", key="id") as out:
        todo = [it for it in items if not out.done(it["id"])]
        for start in tqdm(range(0, len(todo), batch), desc="pairwise"):
            part = todo[start : start + batch]
            for it, res in zip(part, pairwise_logprob_verdicts(eng, part)):
                out.write({"id": it["id"], "winner": it["winner"], **res})
        done = {r["id"]: r for r in out.rows}
    return summarize_pairwise([done[it["id"]] for it in items]), add_time(out_dir, "pairwise", time.time() - t0)


def run_grading(eng, graded_pairs, pool_pairs, out_dir: Path, runs: int, gen_tokens: int, max_pool_tokens: int):
    tok = eng.tokenizer
    graded = [
        {"id": f"{p['id']}/{side}", "pair": p["id"], "side": side, "question": p["question"], "response": p[side]}
        for p in graded_pairs
        for side in ("better", "worse")
    ]
    pool = [
        {"id": f"{p['id']}/{side}", "question": p["question"], "response": p[side]}
        for p in pool_pairs
        for side in ("better", "worse")
    ]
    pool = [it for it in pool if prompt_tokens(tok, grading_problem(it["question"], it["response"])) <= max_pool_tokens]
    t0 = time.time()
    demos = generate_demos(eng, pool, out_dir / "demos.jsonl", max_tokens=48, progress=True)
    t_demos = add_time(out_dir, "demos", time.time() - t0)
    drawers = [demo_drawer(demos, seed, per_item=False) for seed in range(runs)]
    ks = fitting_shots(tok, graded, drawers, "reinforced", eng.config.max_position - gen_tokens, len(demos))
    t0 = time.time()
    with ResultWriter(out_dir / "grading.jsonl", key=("id", "k", "run")) as out:
        for r, drawer in enumerate(drawers):
            todo = [it for it in graded if not all(out.done((it["id"], k, r)) for k in ks)]
            for start in tqdm(range(0, len(todo), 8), desc=f"grading run {r}"):
                jobs = build_prompts(todo[start : start + 8], drawer, ks, "reinforced")
                for row in grade(eng, jobs, generate=True, max_tokens=gen_tokens):
                    out.write({**row, "run": r})
        rows = [row for row in out.rows if row["k"] in ks and row["run"] < runs]
    t_grade = add_time(out_dir, "grading", time.time() - t0)
    longest = max(prompt_tokens(tok, p) for _, _, p in build_prompts(graded, drawers[0], [max(ks)], "reinforced"))
    return rows, ks, graded, len(pool), len(demos), t_demos, t_grade, longest


def grading_accuracy(rows, graded, k) -> dict:
    """Share of (graded pair, run) whose human-preferred answer gets the higher rating: by the expected rating,
    and by the argmax (equal argmax counts half)."""
    side = {it["id"]: (it["pair"], it["side"]) for it in graded}
    by_pair: dict = {}
    for r in rows:
        if r["k"] == k:
            pair, s = side[r["id"]]
            by_pair.setdefault((pair, r["run"]), {})[s] = r
    full = [v for v in by_pair.values() if len(v) == 2]
    exp = np.mean([v["better"]["expected"] > v["worse"]["expected"] for v in full])
    arg = np.mean(
        [
            1.0
            if v["better"]["argmax"] > v["worse"]["argmax"]
            else 0.5
            if v["better"]["argmax"] == v["worse"]["argmax"]
            else 0.0
            for v in full
        ]
    )
    return {"expected": float(exp), "argmax": float(arg), "pairs": len(full)}


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def tables(ps, pair_time, grading, meta, meta_gen) -> str:
    acc, bias = ps["logprob"]["accuracy"], ps["logprob"]["bias"]
    lines = [
        SECTION,
        "",
        meta,
        "",
        f"**Pairwise** ({ps['pairs']} pairs x 4 prompts, verdict = argmax of the log-probs of [[A]]/[[B]]/[[C]]; "
        f"'decisive' ignores [[C]]; {pair_time:.0f} s). Accuracy against the human choice:",
        "",
        "| variant | accuracy | accuracy (decisive) |",
        "|---|---|---|",
    ]
    names = {
        "AB": "Compare(A,B)",
        "BA": "Compare(B,A)",
        "AB_sym": "Compare(A+,B+) symbols swapped",
        "BA_sym": "Compare(B+,A+) both swapped",
        "aggregate": "aggregate of the four",
    }
    for v in [v.name for v in VARIANTS] + ["aggregate"]:
        lines.append(f"| {names[v]} | {fmt(acc[v]['accuracy'])} | {fmt(acc[v + '_decisive']['accuracy'])} |")
    lines += ["", "| bias measure | value |", "|---|---|"]
    for key in (
        "position_bias_rate",
        "symbol_bias_rate",
        "position_flip_rate",
        "symbol_flip_rate",
        "order_flip_rate",
        "flip_rate",
        "first_position_share",
        "symbol_A_share",
        "tie_share",
    ):
        lines.append(f"| {key} | {fmt(bias[key])} |")
    rows, ks, graded, pool_n, demo_n, t_demos, t_grade, longest = grading
    cons = {c["k"]: c for c in consistency_by_k([r for r in rows if r["run"] == 0], [r for r in rows if r["run"] == 1])}
    lines += [
        "",
        f"**Single answer grading** ({len(graded)} answers = {len(graded) // 2} pairs, Reinforced ICL, "
        f"two runs with independent demo draws (one per run, shared by the graded answers) from the judge's "
        f"own zero-shot judgments of {demo_n} answers to other questions (demo generation {t_demos:.0f} s, "
        f"grading {t_grade:.0f} s, longest prompt {longest} tokens). Consistency of run 0 vs run 1: 'sampled' = probability that ratings sampled from the two "
        f"runs' rating-token distributions agree; 'argmax' = the distributions' argmax; 'generated' = the "
        f"rating parsed from a greedy generation ({meta_gen} tokens; unparsable = unscored). 'pref. acc.' = "
        f"share of (pair, run) whose human-preferred answer gets the higher rating.",
        "",
        "| K | sampled exact | sampled within 1 | argmax exact | argmax within 1 | mean abs. gap of expected | "
        "generated exact | generated within 1 | unscored | pref. acc. (expected) | pref. acc. (argmax) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in ks:
        c, a = cons[k], grading_accuracy(rows, graded, k)
        lines.append(
            f"| {k} | {fmt(c['sampled_exact'])} | {fmt(c['sampled_within1'])} | {fmt(c['logprob_exact'])} "
            f"| {fmt(c['logprob_within1'])} | {fmt(c['expected_gap'])} | {fmt(c.get('text_exact'))} | "
            f"{fmt(c.get('text_within1'))} | {c.get('unscored', '-')}/{2 * c['items']} | "
            f"{fmt(a['expected'])} | {fmt(a['argmax'])} |"
        )
    return "\n".join(lines) + "\n"


def write_section(text: str, path: Path) -> None:
    """Replace this benchmark's section of the shared RESULTS.md (or append it)."""
    old = path.read_text() if path.exists() else "# Results\n"
    pattern = re.compile(re.escape(SECTION) + r".*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text
    atomic_write(path, new)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument(
        "--pairs", type=int, default=32, help="pairs for the pairwise experiment (seeded sample; 221 = all)"
    )
    ap.add_argument("--grade-pairs", type=int, default=3, help="pairs whose two answers are graded")
    ap.add_argument("--pool", type=int, default=10, help="pairs whose answers form the demo pool")
    ap.add_argument("--max-pool-tokens", type=int, default=450, help="skip pool answers with longer prompts")
    ap.add_argument("--gen-tokens", type=int, default=8, help="generated tokens per graded answer")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv-tokens", type=int, default=131072, help="KV cache capacity of the engine")
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/icqs/bench/judges_hhh"))
    ap.add_argument("--results", default=str(Path(__file__).with_name("RESULTS.md")))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = load_hhh()
    order = np.random.default_rng(1).permutation(len(pairs))
    graded = [pairs[i] for i in order[: args.grade_pairs]]
    # the demo pool: other questions only (hhh repeats a question with different worse answers)
    seen = {p["question"] for p in graded}
    pool = [pairs[i] for i in order[args.grade_pairs :] if pairs[i]["question"] not in seen][: args.pool]
    compared = [pairs[i] for i in sorted(order[: args.pairs])]
    # keep_cache: the demo block and each prompt scored then generated from are computed once; kv_tokens: room for
    # every prompt of the run without evictions
    eng = Engine.load(args.model, keep_cache=True, kv_tokens=args.kv_tokens)
    ps, pair_time = run_pairwise(eng, compared, out_dir, args.batch)
    grading = run_grading(eng, graded, pool, out_dir, 2, args.gen_tokens, args.max_pool_tokens)
    total = pair_time + grading[5] + grading[6]
    meta = (
        f"Model: {args.model or 'SmolLM2-135M-Instruct Q4_1 (embedded GGUF)'}, bfloat16, CPU. Data: "
        f"{len(pairs)} hhh_alignment pairs from {REQUIREMENT} (sdist, fetched at run time). Sizes: "
        f"{len(compared)} pairs compared, {len(graded)} pairs graded, {len(pool)} pairs as demo pool. Total "
        f"{total:.0f} s. Command: `python benchmarks/judges_hhh.py --pairs {args.pairs} "
        f"--grade-pairs {args.grade_pairs} --pool {args.pool}`."
    )
    text = tables(ps, pair_time, grading, meta, args.gen_tokens)
    print(text)
    write_section(text, Path(args.results))


if __name__ == "__main__":
    main()
