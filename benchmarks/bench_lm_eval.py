"""lm-evaluation-harness on SmolLM2: a local 5-shot multiple-choice task through `lm_eval.simple_evaluate` with
lm-eval's own `hf` backend and with `icqs-engine`, back to back in one process, on the same weights.

Data: date-arithmetic questions in the style of BIG-bench date_understanding, generated here with a fixed seed
(six MM/DD/YYYY options each); the first --pool questions are the few-shot pool, the next --questions are
evaluated. The task is an lm-eval YAML over local JSONL files (no hub).
Weights: the embedded SmolLM2-135M-Instruct GGUF, written once as an HF directory (dequantized, float32
safetensors + its tokenizer) that both backends load.

Reported per backend: wall time of simple_evaluate (model load included), tokens computed (hf: every request's
context + continuation, less what lm-eval's one-token logits cache merges, padding not counted; icqs-engine: its
own counter), accuracy. The hf backend runs first, then the engine; `uptime`'s load average is printed beside.

    flock /tmp/bench.lock python benchmarks/bench_lm_eval.py --questions 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from datetime import date, timedelta
from pathlib import Path

for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[var] = "1"

from common import load_average, machine  # noqa: E402  (puts the repository and tests/ on sys.path)

from commands.fetch import cache_dir  # noqa: E402
from engine.encoding import encode_pairs  # noqa: E402
from engine.loader import load_model_files  # noqa: E402

TASK = "icqs_bench_dates"
SECTION = "## lm-evaluation-harness backend: icqs-engine vs hf"


def make_questions(n: int, seed: int = 0) -> list[dict]:
    """Date arithmetic in the style of BIG-bench date_understanding: a date, a shift, six MM/DD/YYYY options (the
    answer and dates one day, one week, one month or one year off it), computed with datetime."""
    rng = random.Random(seed)
    shifts = [
        (1, "tomorrow"),
        (-1, "yesterday"),
        (7, "one week from today"),
        (-7, "one week ago"),
        (10, "10 days from today"),
        (-10, "10 days ago"),
        (30, "30 days from today"),
        (-30, "30 days ago"),
    ]
    leads = [("Today is {}.", 0), ("Yesterday was {}.", 1), ("Tomorrow will be {}.", -1)]
    docs = []
    while len(docs) < n:
        day = date(1950, 1, 1) + timedelta(days=rng.randrange(365 * 70))
        lead, to_today = rng.choice(leads)
        shift, phrase = rng.choice(shifts)
        answer = day + timedelta(days=to_today + shift)
        wrong = [answer + timedelta(days=d) for d in (-1, 1, -7, 7)]
        wrong += [answer.replace(year=answer.year + y) for y in (-1, 1) if not (answer.month == 2 and answer.day == 29)]
        options = [answer] + rng.sample([w for w in dict.fromkeys(wrong) if w != answer], 5)
        rng.shuffle(options)
        docs.append(
            {
                "question": f"{lead.format(f'{day:%m/%d/%Y}')} What is the date {phrase} in MM/DD/YYYY?",
                "choices": [f"{o:%m/%d/%Y}" for o in options],
                "label": options.index(answer),
            }
        )
    return docs


def write_task(root: Path, docs: list[dict], pool: int, questions: int) -> None:
    files = {}
    for split, part in (("train", docs[:pool]), ("test", docs[pool : pool + questions])):
        files[split] = str(root / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(d) + "\n" for d in part))
    task = {
        "task": TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": files, "cache_dir": str(root / "datasets_cache")},
        "output_type": "multiple_choice",
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
        "num_fewshot": 5,
        "doc_to_text": "Q: {{question}}\nA:",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
    }
    (root / f"{TASK}.yaml").write_text(json.dumps(task, indent=1))


def write_hf_dir(path: Path) -> Path:
    """The embedded SmolLM2 as an HF directory (the weights the engine reads from the GGUF, in float32)."""
    if path.is_dir():
        return path
    import shutil

    from hf_reference import hf_model_from_weights

    config, weights, tok = load_model_files(None)
    part = path.with_name(path.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    hf_model_from_weights(config, weights).save_pretrained(part)
    tok.backend.save(str(part / "tokenizer.json"))
    special = {
        "bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None else None,
        "eos_token": tok.id_to_token(tok.eos_id),
        "add_bos_token": tok.add_bos,
    }
    (part / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", **special, "chat_template": tok.chat_template}, indent=1
        )
    )
    os.replace(part, path)  # complete or absent
    return path


def hf_tokens(tok, samples: list[dict]) -> int:
    """Tokens the hf backend feeds its model: each request's context + continuation minus the last token, once
    per group of requests that its one-token logits cache merges (same context + continuation[:-1])."""
    pairs = [tuple(a) for s in samples for a in s["arguments"]]
    seen = set()
    for ctx, cont in encode_pairs(tok, pairs):
        seen.add(tuple(ctx + cont[:-1]))
    return sum(len(k) for k in seen)


def run(model: str, model_args: dict, tasks, batch_size: int) -> tuple[dict, float]:
    import lm_eval

    start = time.perf_counter()
    res = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK],
        task_manager=tasks,
        device="cpu",
        batch_size=batch_size,
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    return res, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--pool", type=int, default=40, help="questions kept as the few-shot pool")
    p.add_argument("--hf-dtype", default="float32", help="dtype of the hf backend")
    p.add_argument("--engine-dtype", default="float32")
    p.add_argument("--work", type=Path, default=cache_dir().parent / "bench_lm_eval")
    p.add_argument("--results", type=Path, default=None, help="append the table to this markdown file")
    args = p.parse_args(argv)

    from lm_eval.tasks import TaskManager

    import frontends.lm_eval  # noqa: F401  (registers icqs-engine)

    args.work.mkdir(parents=True, exist_ok=True)
    docs = make_questions(args.pool + args.questions)
    write_task(args.work, docs, args.pool, args.questions)
    model_dir = write_hf_dir(args.work / "smollm2-hf")
    tasks = TaskManager(include_path=str(args.work), include_defaults=False)
    tok = load_model_files(model_dir)[2]

    rows = []
    load_before = load_average()
    hf, hf_wall = run("hf", {"pretrained": str(model_dir), "dtype": args.hf_dtype}, tasks, 8)
    ours, our_wall = run("icqs-engine", {"model": str(model_dir), "dtype": args.engine_dtype}, tasks, 1)
    load_after = load_average()
    samples = hf["samples"][TASK]
    stats = ours["config"]["engine_stats"]["loglikelihood"]
    for name, res, wall, tokens, dtype in (
        ("hf (batch size 8)", hf, hf_wall, hf_tokens(tok, samples), args.hf_dtype),
        ("icqs-engine", ours, our_wall, stats["tokens_computed"], args.engine_dtype),
    ):
        r = res["results"][TASK]
        rows.append(f"| {name} | {dtype} | {wall:.1f} | {tokens:,} | {r['acc,none']:.4f} | {r['acc_norm,none']:.4f} |")
    same = sum(
        a["acc"] == b["acc"]
        for a, b in zip(
            sorted(samples, key=lambda s: s["doc_id"]), sorted(ours["samples"][TASK], key=lambda s: s["doc_id"])
        )
    )
    n_req = sum(len(s["arguments"]) for s in samples)
    text = "\n".join(
        [
            f"{len(samples)} questions x 6 choices ({n_req} loglikelihood requests), 5-shot, SmolLM2-135M-Instruct "
            f"(embedded Q4_1 GGUF written as an HF dir); {machine()}; load average {load_before} before, "
            f"{load_after} after; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
            f"Command: `flock /tmp/bench.lock python benchmarks/bench_lm_eval.py --questions {args.questions}`",
            "",
            "| backend | dtype | wall s | tokens computed | acc | acc_norm |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"icqs-engine / hf: {hf_wall / our_wall:.2f}x faster (wall); tokens requested {stats['tokens_requested']:,},"
            f" computed {stats['tokens_computed']:,} ({stats['tokens_requested'] / max(1, stats['tokens_computed']):.1f}x"
            f" fewer), {stats['forward_steps']} forward steps; same correct/incorrect on {same}/{len(samples)} "
            "questions.",
        ]
    )
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n" + text + "\n")


if __name__ == "__main__":
    main()
