"""How close the engine runs to this CPU's limits: its linear-layer FLOP rate as a fraction of the best bf16 GEMM
rate at the model's own shapes, and decode's step time against the memory-bandwidth and GEMM bounds, all measured
in the same process.

    .venv/bin/python benchmarks/bench_bound.py [--threads 1,2] [--parts icqs,plain,decode] [--scale 0.1]
                                               [--dtype bfloat16] [--model PATH]

For each thread count (torch.set_num_threads, in this order, back to back):
- bound: the best of --repeat runs of a 1024-row `F.linear` (plain weight), of oneDNN's prepacked linear and, where
  the engine packs fp32 and bf16 weights for it, of the native panel linear (kernels/linear.py) at each of a
  layer's four weight shapes (qkv, o, gate_up, down); the GEMM rate is a layer's FLOPs over the sum of the best
  times, i.e. one 1024-row pass through a whole layer's linears.
- icqs: the ICQS-shaped job of bench_icqs_workload.py (11 ratios x 4 demo sets x 4 models' answers; --scale of its
  50 questions) through `Engine.score(share_prefix=True)`. Its rate counts the layers' linear FLOPs only
  (2 x tokens computed x a layer stack's linear weights), over the job's whole wall time: everything that is not a
  GEMM (attention, elementwise ops, packing, scheduling, the LM head rows) shows up as a lower fraction.
  Two more columns put that in context: "all matmuls' fraction" counts the other matmul work the job cannot skip
  (attention's scores and P.V over every computed token's keys, from the engine's attention_keys counter, and
  the LM head's rows), and "ceiling of the linear fraction" is what the issue's measure would read if every
  matmul ran at the bound and nothing else took time (linear FLOPs over all matmul FLOPs).
  The linear FLOPs are those the engine ran: the last layer's o-projection and MLP run only on the rows whose
  hidden states a request reads (the engine's hidden_rows counter), so a computed token that no request reads
  costs that much less. "Fraction, whole layers" counts every computed token through whole layers instead: the
  job's time against the bound for the work a model without that saving would do.
  The GEMM bound is measured again after the jobs and the larger of the two is used.
- plain: unrelated (context, continuation) pairs of bench_scoring.py, `share_prefix=False`, the same measure.
- decode: 32 prompts x 64 new tokens, greedy, against transformers `generate` (batch 32, same weights and dtype).
  A decode step's bound is the larger of the weight bytes over the memory bandwidth (a streamed read of a buffer
  well above the caches, measured here) and its FLOPs over the GEMM rate; the line says which applies.
The load average is printed before and after each part: on a shared machine read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from common import engine_weight_bytes, hf_model, load_average, machine, table

from engine import Engine
from engine.engine import DTYPES
from engine.loader import load_model_files
from kernels.linear import Panels, prepack
from kernels.linear import linear as packed_linear


def layer_shapes(config) -> dict[str, tuple[int, int]]:
    """(out, in) of a layer's four linears, as the model fuses them."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {
        "qkv": (q + 2 * kv, c.hidden_size),
        "o": (c.hidden_size, q),
        "gate_up": (2 * c.intermediate_size, c.hidden_size),
        "down": (c.hidden_size, c.intermediate_size),
    }


def linear_params(config) -> int:
    """Weights of the layer stack's linears (the FLOPs per token are twice this; embedding and LM head excluded)."""
    return config.num_layers * sum(o * i for o, i in layer_shapes(config).values())


def trimmed_params(config) -> int:
    """Weights of the last layer's linears that a row whose hidden state nobody reads skips (o, gate_up, down)."""
    return sum(o * i for name, (o, i) in layer_shapes(config).items() if name != "qkv")


def best_seconds(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_bound(config, dtype, rows: int, repeat: int) -> tuple[float, list[list]]:
    """GFLOP/s of one `rows`-row pass through a layer's four linears, each at its best of plain F.linear, oneDNN's
    prepacked linear and the native panels (where the engine uses them); and a row per shape for the table."""
    gen = torch.Generator().manual_seed(0)
    total_flops, total_s, out = 0.0, 0.0, []
    for name, (o, i) in layer_shapes(config).items():
        w = (torch.randn(o, i, generator=gen) * i**-0.5).to(dtype)
        x = torch.randn(rows, i, generator=gen).to(dtype)
        packed, panels = prepack(w, rows), prepack(w, rows, panels=True)
        plain_s = best_seconds(lambda: F.linear(x, w), repeat)
        packed_s = best_seconds(lambda: packed_linear(x, packed), repeat)
        panels_s = best_seconds(lambda: packed_linear(x, panels), repeat) if isinstance(panels, Panels) else None
        flops = 2.0 * rows * o * i
        total_flops, total_s = total_flops + flops, total_s + min(plain_s, packed_s, panels_s or packed_s)
        out.append(
            [
                name,
                f"{o}x{i}",
                flops / plain_s / 1e9,
                flops / packed_s / 1e9,
                flops / panels_s / 1e9 if panels_s else "-",
            ]
        )
    return total_flops / total_s / 1e9, out


def memory_bandwidth(repeat: int, mib: int = 1024) -> float:
    """GB/s of a streamed read (a sum over a buffer far larger than the caches)."""
    buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    return buf.nbytes / best_seconds(lambda: buf.sum(), repeat) / 1e9


def engine_stat(engine, name: str) -> int:
    return int(getattr(engine.last_stats, name))


def job_flops(config, stats) -> tuple[float, float, float, float]:
    """The matmul FLOPs of an engine job from its counters (EngineStats): (linears as run, linears counting whole
    layers for every computed token, attention, LM head). The linears as run skip the last layer's o-projection
    and MLP on the rows whose hidden state no request reads (the hidden_rows counter); attention is the scores
    and P.V (a token at position p sees p + 1 keys, in every layer and query head); the LM head counts the rows
    of the scored tokens."""
    tokens = stats.tokens_computed
    whole = 2.0 * tokens * linear_params(config)
    linear = whole - 2.0 * (tokens - stats.hidden_rows) * trimmed_params(config)
    attention = 4.0 * stats.attention_keys * config.num_heads * config.head_dim * config.num_layers
    lm_head = 2.0 * stats.lm_head_rows * config.vocab_size * config.hidden_size
    return linear, whole, attention, lm_head


def naive_flops(config, lengths) -> float:
    """The matmul FLOPs of a runner that feeds every request whole, one sequence each (transformers, as
    lm-evaluation-harness runs it): every token through whole layers and the LM head, and causal attention
    within each request (`lengths`: the tokens each request feeds)."""
    tokens = sum(lengths)
    keys = sum(n * (n + 1) // 2 for n in lengths)
    return (
        2.0 * tokens * (linear_params(config) + config.vocab_size * config.hidden_size)
        + 4.0 * keys * config.num_heads * config.head_dim * config.num_layers
    )


def part_scoring(engine, config, requests, share: bool, rate: float) -> list:
    """One scoring job: [requests, tokens computed, seconds, tokens/s, linear GFLOP/s, its fraction of the bound,
    the matmul work's fraction (linears + attention + LM head rows), the linear fraction's ceiling, the fraction
    counting whole layers for every computed token]."""
    engine.score(requests[:2], share_prefix=share)  # warm-up
    t = time.perf_counter()
    engine.score(requests, share_prefix=share)
    seconds = time.perf_counter() - t
    tokens = engine_stat(engine, "tokens_computed")
    linear, whole, attention, lm_head = job_flops(config, engine.last_stats)
    gflops = linear / seconds / 1e9
    matmul = linear + attention + lm_head
    return [
        len(requests),
        tokens,
        seconds,
        tokens / seconds,
        gflops,
        gflops / rate,
        matmul / seconds / 1e9 / rate,
        linear / matmul,
        whole / seconds / 1e9 / rate,
    ]


def part_decode(
    engine, config, tok, weights, dtype, prompts: int, new_tokens: int, rate: float, bandwidth: float, repeat: int
) -> list:
    from bench_generation import engine_generate, hf_generate
    from bench_generation import prompts as make_prompts

    ids = make_prompts(tok, prompts)
    hf = hf_model(config, weights, dtype)
    engine_generate(engine, ids[:2], 2)
    hf_generate(hf, tok, ids[:2], 2)
    mine = theirs = None
    for _ in range(repeat):  # alternate, so that a change of the machine's load hits both
        e = engine_generate(engine, ids, new_tokens)
        h = hf_generate(hf, tok, ids, new_tokens)
        mine = e if mine is None or e[2] / e[0] > mine[2] / mine[0] else mine
        theirs = h if theirs is None or h[2] / h[0] > theirs[2] / theirs[0] else theirs
    steps = engine_stat(engine, "forward_steps")
    step_s = mine[0] / max(steps, 1)
    weight_bytes = engine_weight_bytes(engine)
    memory_s = weight_bytes / (bandwidth * 1e9)
    all_params = linear_params(config) + config.vocab_size * config.hidden_size  # layers + LM head
    compute_s = 2.0 * prompts * all_params / (rate * 1e9)
    bound_s = max(memory_s, compute_s)
    return [
        prompts,
        new_tokens,
        mine[2] / mine[0],
        theirs[2] / theirs[0],
        (mine[2] / mine[0]) / (theirs[2] / theirs[0]),
        step_s * 1e3,
        memory_s * 1e3,
        compute_s * 1e3,
        "memory" if memory_s >= compute_s else "GEMM",
        bound_s / step_s,
    ]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the embedded SmolLM2)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts, run in this order")
    ap.add_argument("--parts", default="icqs,plain,decode")
    ap.add_argument("--scale", type=float, default=0.1, help="fraction of the ICQS job's 50 questions")
    ap.add_argument("--plain-requests", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1024, help="rows of the GEMM bound")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    dtype = DTYPES[args.dtype]
    config, weights, tok = load_model_files(args.model)
    print(f"# bench_bound ({machine()}; load average {load_average()})")
    results: dict = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        engine = Engine(config, weights, tok, dtype=dtype)
        rate, shape_rows = gemm_bound(config, dtype, args.rows, args.repeat)
        bandwidth = memory_bandwidth(args.repeat)
        print(
            f"\n## {threads} thread(s): {args.rows}-row GEMM bound {rate:.1f} GFLOP/s, memory read "
            f"{bandwidth:.1f} GB/s (load average {load_average()})\n"
        )
        print(
            table(
                ["linear", "out x in", "F.linear GFLOP/s", "oneDNN prepacked GFLOP/s", "native panels GFLOP/s"],
                shape_rows,
            )
        )
        res = results[threads] = dict(gemm_gflops=rate, bandwidth_gbs=bandwidth)
        jobs = []
        if "icqs" in parts:
            from bench_icqs_workload import QUESTIONS, build_job

            _, _, requests = build_job(max(1, round(QUESTIONS * args.scale)), 11, 16, 4)
            jobs.append(("icqs", "ICQS-shaped (shared)", requests, True))
        if "plain" in parts:
            from bench_scoring import make_requests

            jobs.append(("plain", "plain (unshared)", make_requests(args.plain_requests), False))
        rows = [[label] + part_scoring(engine, config, requests, share, rate) for _, label, requests, share in jobs]
        if rows:
            # the bound again after the jobs: on a shared machine the best rate seen is the bound (a slow first
            # measurement would flatter the fractions)
            again, _ = gemm_bound(config, dtype, args.rows, args.repeat)
            best = max(rate, again)
            for row in rows:
                row[6] *= rate / best
                row[7] *= rate / best
                row[9] *= rate / best
            print(
                f"\nscoring ({args.dtype}; GEMM bound {rate:.1f} before, {again:.1f} after the jobs: fractions of "
                f"{best:.1f}; load average {load_average()}):\n"
            )
            print(
                table(
                    [
                        "job",
                        "requests",
                        "tokens computed",
                        "wall s",
                        "tokens/s",
                        "linear GFLOP/s",
                        "fraction of GEMM bound",
                        "all matmuls' fraction",
                        "ceiling of the linear fraction",
                        "fraction, whole layers",
                    ],
                    rows,
                )
            )
            for (key, *_), row in zip(jobs, rows):
                res[key], res[key + "_matmuls"], res[key + "_ceiling"] = row[6], row[7], row[8]
                res[key + "_whole_layers"] = row[9]
        if "decode" in parts:
            d = part_decode(
                engine, config, tok, weights, dtype, args.prompts, args.new_tokens, rate, bandwidth, args.repeat
            )
            print(f"\ndecode ({args.dtype}, greedy; load average {load_average()}):\n")
            print(
                table(
                    [
                        "prompts",
                        "new tokens",
                        "engine tokens/s",
                        "transformers tokens/s",
                        "engine / transformers",
                        "ms per step",
                        "memory bound ms",
                        "GEMM bound ms",
                        "bound that applies",
                        "fraction of bound",
                    ],
                    [d],
                )
            )
            res["decode_vs_hf"], res["decode_fraction"] = d[4], d[-1]
        del engine
    print(f"\nload average at the end: {load_average()}")
    return results


if __name__ == "__main__":
    main()
