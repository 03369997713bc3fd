"""Plain scoring throughput: one batch of unrelated (context, continuation) requests, no prefix sharing
(share_prefix=False), on this CPU, the engine against transformers in the same run and on the same weights.

    .venv/bin/python benchmarks/bench_scoring.py [--requests 64] [--repeat 3] [--dtype bfloat16] [--model PATH]

The requests are ~150-200 tokens of English: each is a random draw of sentences from the list below (context:
the first seven, continuation: the eighth). transformers runs them as lm-evaluation-harness does with
--batch_size 1: one full forward per request, log-softmax over every position, gather. Printed: tokens requested
and computed, wall and CPU seconds (best of --repeat), tokens/s and the engine/transformers ratio; then the
log-prob spread that bf16 costs: engine bf16, transformers bf16 and engine fp32 each against transformers fp32
(max and mean absolute difference of the per-request sums, in nats).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

import numpy as np
import torch
from common import hf_model, hf_naive, load_average, machine, max_abs_diff, table, timed

from engine import Engine
from engine.engine import DTYPES
from engine.loader import load_model_files

SENTENCES = [
    "The library opens at nine every morning, and the reading room fills up quickly with students preparing for "
    "their exams.",
    "A small bakery on the corner sells bread that is still warm at seven, so there is usually a queue outside.",
    "When the river floods in spring, the farmers move their animals to the higher fields near the old church.",
    "She wrote the first draft of her novel in three months, then spent two years rewriting every chapter.",
    "The committee met on Tuesday to discuss the budget, but the meeting ended before anyone could agree.",
    "Most of the paintings in the museum were donated by a family that made its fortune in shipping.",
    "He learned to play the violin as a child and still practises for an hour before breakfast each day.",
    "The new bridge shortened the journey to the city by almost forty minutes for people living on the island.",
    "Scientists measured the temperature of the lake every week for ten years and found a steady warming trend.",
    "The train was delayed by a fallen tree, so the passengers waited in the station and drank coffee.",
    "Our neighbours planted tomatoes, beans and sunflowers, and by August the garden was taller than the fence.",
    "The report argues that cheaper public transport would reduce traffic more than building new roads.",
    "After the storm, volunteers cleared the beach of plastic bottles, broken nets and pieces of wood.",
    "The teacher asked each pupil to describe their favourite place in exactly one hundred words.",
    "A good map shows not only the roads but also the hills, the rivers and the paths that walkers use.",
    "The company hired twenty engineers last year to rebuild its software from the ground up.",
    "In the evening the old square is full of musicians, street vendors and families eating ice cream.",
    "The doctor explained that regular sleep matters as much for health as a balanced diet and exercise.",
    "Hundreds of birds stop at the marsh each autumn on their long flight south to warmer countries.",
    "The recipe calls for two cups of flour, a pinch of salt, three eggs and a little melted butter.",
    "During the long winter the village school was the only warm building, so people gathered there at night.",
    "The pilot announced that the plane would land early because of a strong tail wind over the ocean.",
    "His grandmother kept every letter she had ever received in a wooden box under her bed.",
    "The city council voted to turn the empty car park into a playground with trees and benches.",
    "Reading aloud to children helps them learn new words long before they can read on their own.",
    "The mountain road is closed from November to April because snow makes it too dangerous to drive.",
    "Our team won the final match after a penalty in the last minute, and the crowd ran onto the field.",
    "The factory switched to solar power and now produces more electricity than it uses in summer.",
    "She photographed the same tree from her window every day for a year and published the pictures as a book.",
    "Prices at the market rise in winter, when fresh vegetables have to be brought in from the south.",
    "The museum guide told us that the castle walls were built over two centuries by three different kings.",
    "Many people learn a second language more easily when they live in a country where it is spoken.",
    "The old lighthouse no longer guides ships, but tourists climb its stairs to watch the sunset.",
    "Engineers tested the new engine for six months before they allowed it to fly on a passenger plane.",
    "The children built a raft from empty barrels and planks, and it floated for almost an hour.",
    "A quiet office with good light can make a bigger difference to work than an expensive computer.",
    "The festival began with a parade through the main street, followed by fireworks over the harbour.",
    "Researchers asked a thousand people how they spend their weekends and found that most stay at home.",
    "The bookshop survived the arrival of online stores by hosting readings and a weekly chess club.",
    "Heavy rain washed away part of the path, so the rangers built a wooden bridge across the stream.",
    "The orchestra rehearsed the symphony for weeks, yet the first performance still felt nervous and rushed.",
    "He keeps a notebook in his pocket and writes down every interesting thing he overhears on the bus.",
    "The hospital opened a new wing for children, with bright walls, a library and a small garden.",
    "Fishing boats leave the harbour before dawn and return in the afternoon with their catch on ice.",
    "The students designed a robot that can sort recycling into paper, glass and plastic.",
    "Travellers are advised to carry water and a map, because the desert road has no petrol stations.",
    "The city's oldest tree is more than four hundred years old and is protected by law.",
    "Every summer the family drives to the coast and rents the same small house by the sea.",
]


def make_requests(n: int, seed: int = 0, context_sentences: int = 7) -> list[tuple[str, str]]:
    """n unrelated requests: a random order of sentences, the last one the continuation."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pick = [SENTENCES[i] for i in rng.permutation(len(SENTENCES))[: context_sentences + 1]]
        out.append((" ".join(pick[:-1]), " " + pick[-1]))
    return out


def best_of(repeat: int, fn):
    """(result of the last run, the Timing with the smallest wall time) over `repeat` runs."""
    best = None
    for _ in range(repeat):
        with timed() as t:
            result = fn()
        best = t if best is None or t.wall < best.wall else best
    return result, best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the embedded SmolLM2)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each runner; the fastest is reported")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--token-budget", type=int, default=1024, help="engine: new tokens per forward step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dtype = DTYPES[args.dtype]

    print(f"# Plain scoring throughput ({machine()}; load average {load_average()})")
    config, weights, tok = load_model_files(args.model)
    requests = make_requests(args.requests, args.seed)
    engine = Engine(config, weights, tok, dtype=dtype, token_budget=args.token_budget)
    engine.score(requests[:2], share_prefix=False)  # warm-up
    eng_scores, eng_t = best_of(args.repeat, lambda: engine.score(requests, share_prefix=False))
    stats = asdict(engine.last_stats)
    requested, computed = stats["tokens_requested"], stats["tokens_computed"]

    hf = hf_model(config, weights, dtype)
    hf_naive(hf, tok, requests[:2])
    hf_scores, hf_t = best_of(args.repeat, lambda: hf_naive(hf, tok, requests))

    rows = [
        [
            "engine (share_prefix=False)",
            requested,
            computed,
            stats["forward_steps"],
            eng_t.wall,
            eng_t.cpu,
            requested / eng_t.wall,
            requested / eng_t.cpu,
        ],
        [
            "transformers, one forward per request",
            requested,
            requested,
            len(requests),
            hf_t.wall,
            hf_t.cpu,
            requested / hf_t.wall,
            requested / hf_t.cpu,
        ],
    ]
    print(
        f"\n{len(requests)} requests, {requested / len(requests):.0f} tokens each on average, {args.dtype}, "
        f"best of {args.repeat} runs\n"
    )
    print(
        table(
            [
                "runner",
                "tokens requested",
                "tokens computed",
                "forward steps",
                "wall s",
                "CPU s",
                "tokens/s (wall)",
                "tokens/s (CPU)",
            ],
            rows,
        )
    )
    speedup, speedup_cpu = hf_t.wall / eng_t.wall, hf_t.cpu / eng_t.cpu
    print(f"\nengine / transformers: {speedup:.2f}x tokens/s (wall), {speedup_cpu:.2f}x (CPU time)")

    # the log-prob spread of bf16: everything against transformers fp32
    ref = hf_naive(hf_model(config, weights, torch.float32), tok, requests)
    engine32 = Engine(config, weights, tok, dtype=torch.float32, token_budget=args.token_budget)
    compared = {
        f"engine {args.dtype}": [r.logprob for r in eng_scores],
        f"transformers {args.dtype}": hf_scores,
        "engine float32": [r.logprob for r in engine32.score(requests, share_prefix=False)],
    }
    spread = {name: max_abs_diff(v, ref) for name, v in compared.items()}
    print("\nlog-prob of each request (sum over its continuation) against transformers float32, in nats\n")
    print(
        table(
            ["runner", "max abs diff", "mean abs diff"],
            [[name, spread[name], float(np.mean(np.abs(np.subtract(v, ref))))] for name, v in compared.items()],
        )
    )
    return dict(
        requests=len(requests),
        tokens_requested=requested,
        tokens_computed=computed,
        engine_tokens_per_s=requested / eng_t.wall,
        hf_tokens_per_s=requested / hf_t.wall,
        speedup=speedup,
        speedup_cpu=speedup_cpu,
        spread=spread,
    )


if __name__ == "__main__":
    main()
