"""Generation and mixed-workload benchmarks of the engine loop, and the CPU-threads comparison.

    .venv/bin/python benchmarks/bench_generation.py [--parts gen,judge,threads] [--prompts 32] [--new-tokens 64]
                                                    [--base-tree DIR] [--judge-scorings 2000] [--model PATH]

gen: 32 prompts x 64 new tokens, greedy, bf16: the engine's tokens/s against transformers `generate` with batch 32
  (left-padded, the same weights), and against another checkout of the engine (--base-tree, e.g. a git worktree of
  main before the loop) run in a subprocess; the runs alternate (engine, transformers, base, twice) so a change
  in the machine's load hits all of them. Tokens/s counts the tokens each runner returns (up to EOS).
judge: a judge's mixed workload in one loop: 64 generations and --judge-scorings scoring requests (rating options)
  on one long many-shot prefix; the stats show the prefix computed once.
threads: the same scoring job with 1 thread, 2 threads and the engine's default (engine.engine.default_threads),
  on the machine as it is and with two CPU-bound competitor processes started by the benchmark.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import asdict

import torch
from common import hf_model, load_average, machine, table, timed

from engine import Engine
from engine.engine import DTYPES, default_threads
from engine.loader import load_model_files

TOPICS = [
    "the history of tea",
    "how bridges carry weight",
    "why the sky is blue",
    "the rules of chess",
    "growing tomatoes on a balcony",
    "how vaccines work",
    "the water cycle",
    "learning a second language",
    "the first moon landing",
    "how a bicycle stays upright",
    "making bread at home",
    "the life of bees",
    "why leaves change colour",
    "how batteries store energy",
    "the origins of jazz",
    "caring for a cat",
    "how volcanoes form",
    "the invention of printing",
    "saving money each month",
    "how rainbows appear",
    "the migration of birds",
    "writing a good essay",
    "how the heart pumps blood",
    "the game of cricket",
    "the Roman aqueducts",
    "how compasses point north",
    "planting a tree",
    "the speed of light",
    "how coffee is roasted",
    "the northern lights",
    "how glaciers move",
    "the basics of photography",
]


def prompts(tok, n: int) -> list[list[int]]:
    """n chat prompts (the model's chat template when it has one), as token ids."""
    out = []
    for i in range(n):
        text = f"Write a short paragraph for a curious child about {TOPICS[i % len(TOPICS)]}."
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": text}])
        out.append(([tok.bos_id] if tok.add_bos and tok.bos_id is not None else []) + tok.encode(text))
    return out


def engine_generate(engine, ids, new_tokens) -> tuple[float, float, int, list[list[int]]]:
    with timed() as t:
        out = engine.generate(ids, max_tokens=new_tokens)
    return t.wall, t.cpu, sum(len(g.token_ids) for g in out), [g.token_ids for g in out]


def hf_generate(model, tok, ids, new_tokens) -> tuple[float, float, int, list[list[int]]]:
    """transformers generate, batch = all prompts, left padding, greedy."""
    pad = tok.eos_id
    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    eos = sorted(set(tok.eos_ids) | {tok.eos_id})
    with timed() as t, torch.inference_mode():
        out = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    seqs = []
    for row in out[:, width:].tolist():
        cut = next((i for i, t_ in enumerate(row) if t_ in eos), len(row))
        seqs.append(row[:cut])
    return t.wall, t.cpu, sum(map(len, seqs)), seqs


# run by another checkout's interpreter, with only that checkout on its path: the same job, given as token ids
CHILD = """
import json, sys, time, torch
from engine.engine import Engine, DTYPES
from engine.loader import load_model_files
job = json.load(sys.stdin)
torch.set_num_threads(job["threads"])
config, weights, tok = load_model_files(job["model"])
engine = Engine(config, weights, tok, dtype=DTYPES[job["dtype"]])
engine.generate(job["ids"][:2], max_tokens=2)
t, c = time.perf_counter(), time.process_time()
out = engine.generate(job["ids"], max_tokens=job["new_tokens"])
seconds, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps(dict(seconds=seconds, cpu=cpu, tokens=sum(len(g.token_ids) for g in out), seqs=[g.token_ids for g in out])))
"""


def base_generate(tree: str, args, ids) -> tuple[float, float, int, list[list[int]]]:
    """The same generation job with another checkout of the engine (a subprocess with that tree on its path)."""
    job = dict(ids=ids, new_tokens=args.new_tokens, dtype=args.dtype, model=args.model, threads=torch.get_num_threads())
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(job),
        env=dict(os.environ, PYTHONPATH=tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["seconds"], r["cpu"], r["tokens"], r["seqs"]


def part_gen(args, config, weights, tok) -> dict:
    engine = Engine(config, weights, tok, dtype=DTYPES[args.dtype])
    ids = prompts(tok, args.prompts)
    hf = hf_model(config, weights, DTYPES[args.dtype])
    engine.generate(ids[:2], max_tokens=2)
    hf_generate(hf, tok, ids[:2], 2)
    runners = [
        ("engine (this tree)", lambda: engine_generate(engine, ids, args.new_tokens)),
        ("transformers generate, batch %d" % len(ids), lambda: hf_generate(hf, tok, ids, args.new_tokens)),
    ]
    if args.base_tree:
        runners.append((f"engine at {args.base_tree}", lambda: base_generate(args.base_tree, args, ids)))
    results: dict[str, list] = {name: [] for name, _ in runners}
    for _ in range(args.repeat):
        for name, fn in runners:
            results[name].append(fn())
    best = {name: min(r, key=lambda x: x[0] / max(x[2], 1)) for name, r in results.items()}
    mine = best["engine (this tree)"]
    rows = []
    for name, (sec, cpu, toks, seqs) in best.items():
        same = sum(a == b for a, b in zip(seqs, mine[3]))
        rows.append(
            [
                name,
                sec,
                cpu,
                toks,
                toks / sec,
                (mine[2] / mine[0]) / (toks / sec),
                (mine[2] / mine[1]) / (toks / cpu),
                f"{same}/{len(seqs)}",
            ]
        )
    print(
        f"\n## generation: {len(ids)} prompts x {args.new_tokens} new tokens, greedy, {args.dtype} "
        f"(best of {args.repeat}; load average {load_average()})\n"
    )
    print(
        table(
            [
                "runner",
                "wall s",
                "CPU s",
                "tokens generated",
                "tokens/s",
                "engine speedup (wall)",
                "engine speedup (CPU s per token)",
                "sequences equal to the engine's",
            ],
            rows,
        )
    )
    return {name: dict(seconds=s, cpu=c, tokens=t) for name, (s, c, t, _) in best.items()}


def part_judge(args, config, weights, tok) -> dict:
    """64 generations + N rating scorings on one many-shot prefix, all in one loop."""
    engine = Engine(config, weights, tok, dtype=DTYPES[args.dtype], keep_cache=False)
    demos = "".join(
        f"Question: Tell me about {t}.\nAnswer: Here is a short explanation of {t}, in plain words.\n"
        f"Rating: {1 + i % 10}\n\n"
        for i, t in enumerate((TOPICS * 4)[: args.judge_demos])
    )
    prefix = tok.encode(demos)
    questions = [tok.encode(f"Question: Tell me about {TOPICS[i % len(TOPICS)]} (item {i}).\n") for i in range(200)]
    options = [tok.encode(f" {r}") for r in range(1, 11)]
    rating = tok.encode("Answer: a short explanation.\nRating:")
    scorings = [(prefix + questions[i % 200] + rating, options[i // 200 % 10]) for i in range(args.judge_scorings)]
    with timed() as t:
        gens = [
            engine.add_generate(prefix + questions[i] + tok.encode("Answer:"), max_tokens=args.judge_tokens)
            for i in range(64)
        ]
        scores = [engine.add_score(c, x) for c, x in scorings]
        engine.run()
    s = asdict(engine.stats)
    unique = set()
    for c, x in scorings:
        unique |= {tuple((c + x)[:i]) for i in range(1, len(c + x))}
    generated = sum(len(g.result().token_ids) for g in gens)
    assert all(h.done and h.error is None for h in scores)
    print(
        f"\n## judge workload in one loop: 64 generations (up to {args.judge_tokens} tokens) + {len(scorings)} "
        f"scorings on one prefix of {len(prefix)} tokens ({args.dtype}; load average {load_average()})\n"
    )
    print(
        table(
            [
                "wall s",
                "requests",
                "tokens requested",
                "tokens computed",
                "of which generated",
                "unique scoring input tokens",
                "prefix tokens",
                "forward steps",
            ],
            [
                [
                    t.wall,
                    s["requests"],
                    s["tokens_requested"] + generated,
                    s["tokens_computed"],
                    generated,
                    len(unique),
                    len(prefix),
                    s["forward_steps"],
                ]
            ],
        )
    )
    return dict(
        seconds=t.wall,
        tokens_computed=s["tokens_computed"],
        prefix=len(prefix),
        unique=len(unique),
        generated=generated,
        requested=s["tokens_requested"],
    )


def burn(stop_at: float):
    x = 0
    while time.time() < stop_at:
        x += 1


def part_threads(args, config, weights, tok) -> dict:
    engine = Engine(config, weights, tok, dtype=DTYPES[args.dtype])
    job = [(p, tok.encode(" and that is all.")) for p in prompts(tok, args.thread_requests)]
    job = [(c * 6, x) for c, x in job]  # ~250-token requests, no sharing between them
    out, rows = {}, []
    for label, competitors in (("as it is", 0), ("+2 CPU-bound processes", 2)):
        procs = [multiprocessing.Process(target=burn, args=(time.time() + 3600,)) for _ in range(competitors)]
        for p in procs:
            p.start()
        time.sleep(2 if competitors else 0)
        try:
            choices = {"1": 1, "2": 2, f"default ({default_threads()})": default_threads()}
            for name, n in choices.items():
                torch.set_num_threads(n)
                engine.score(job[:2], share_prefix=False)
                with timed() as t:
                    engine.score(job, share_prefix=False)
                tokens = engine.last_stats.tokens_computed
                out[(label, name)] = tokens / t.wall
                rows.append([label, load_average(), name, t.wall, tokens / t.wall])
        finally:
            for p in procs:
                p.terminate()
                p.join()
    base = {label: out[(label, "1")] for label, _ in (("as it is", 0), ("+2 CPU-bound processes", 2))}
    for r in rows:
        r.append(r[4] / base[r[0]])
    print(f"\n## CPU threads: {len(job)} unshared scoring requests of ~{len(job[0][0])} tokens ({args.dtype})\n")
    print(table(["machine", "load average", "threads", "wall s", "tokens/s", "vs 1 thread"], rows))
    return {f"{k[0]} / {k[1]}": v for k, v in out.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--parts", default="gen,judge,threads")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--base-tree", default=None, help="another checkout of the project to compare (gen)")
    ap.add_argument("--judge-scorings", type=int, default=2000)
    ap.add_argument("--judge-tokens", type=int, default=32)
    ap.add_argument("--judge-demos", type=int, default=40, help="many-shot demos in the judge's prefix")
    ap.add_argument("--thread-requests", type=int, default=8, help="requests of the threads comparison's job")
    ap.add_argument("--threads", type=int, default=None, help="default: engine.engine.default_threads()")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads or default_threads())
    print(f"# engine loop benchmarks ({machine()}; load average {load_average()})")
    config, weights, tok = load_model_files(args.model)
    out = {}
    for part in args.parts.split(","):
        out[part] = {"gen": part_gen, "judge": part_judge, "threads": part_threads}[part](args, config, weights, tok)
    print(f"\nload average at the end: {load_average()}")
    return out


if __name__ == "__main__":
    main()
