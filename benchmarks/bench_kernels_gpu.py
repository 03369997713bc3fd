"""GPU kernel benchmark: Triton kernels vs torch references vs flash-attn (where it applies), bf16.

How to run (a CUDA machine, torch with CUDA, `pip install -e '.[triton]'`, optionally `pip install flash-attn`):

    python benchmarks/bench_kernels_gpu.py [--model smollm2|llama3-8b] [--csv out.csv]

`--smoke` runs tiny shapes instead, on the CPU through the Triton interpreter when there is no GPU: it checks
that the script works, its numbers mean nothing.

For every op and shape it prints the time per call (triton.testing.do_bench: median ms), tokens/s, and the
achieved TFLOP/s for the matmul-bound ops (attention: 4 * D flops per query-key pair and head; target log-prob:
2 * hidden flops per token and vocabulary entry) or GB/s for the memory-bound ones. flash-attn runs only on the
contiguous causal prefill (the cascade's self part), which is what the engine uses it for.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {  # heads, kv heads, head dim, hidden, intermediate, vocab
    "smollm2": (9, 3, 64, 576, 1536, 49152),
    "llama3-8b": (32, 8, 128, 4096, 14336, 128256),
}
SMOKE_MODEL = (4, 2, 16, 32, 48, 100)


def bench(fn) -> float:
    """Median ms per call."""
    if torch.cuda.is_available():
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=50)
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def attention_cases(H, Hkv, D, dev, dtype, smoke):
    from kernels.attention import AttentionPlan, Segment
    from kernels.problems import cascade_problem

    def to_dev(p):
        out = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in p.items()}
        if "plan" in p:
            out["plan"] = AttentionPlan(p["plan"].cu_seqlens,
                                        [Segment(s.rows.to(dev), s.slots.to(dev)) for s in p["plan"].segments])
        return out

    for n_cand, cand_len, shared in ((3, 1, 20), (2, 4, 24)) if smoke else ((256, 1, 1024), (64, 8, 2048)):
        p = to_dev(cascade_problem([cand_len] * n_cand, shared, [0] * n_cand, H, Hkv, D, dtype))
        pairs = n_cand * (cand_len * shared + cand_len * (cand_len + 1) // 2)
        yield "cascade_attention", f"{n_cand} cands x {cand_len} tok, {shared} shared", p, n_cand * cand_len, pairs


def run(model: str, rows: list, smoke: bool = False):
    from kernels import dispatch

    H, Hkv, D, hidden, inter, vocab = SMOKE_MODEL if smoke else MODELS[model]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the interpreter has no bf16

    def impl(op, backend):
        module, name = dispatch.IMPLS[op][backend].split(":")
        return getattr(__import__(f"kernels.{module}", fromlist=[name]), name)

    def report(op, case, backend, ms, tokens, flops=None, nbytes=None):
        rate = f"{flops / ms / 1e9:8.1f} TFLOP/s" if flops else f"{nbytes / ms / 1e6:8.1f} GB/s"
        print(f"{op:<24} {case:<36} {backend:<8} {ms:9.3f} ms {tokens / ms * 1e3:12.0f} tok/s {rate}")
        rows.append(dict(model=model, op=op, case=case, backend=backend, ms=ms, tokens_per_s=tokens / ms * 1e3,
                         tflops=flops / ms / 1e9 if flops else None, gbps=nbytes / ms / 1e6 if nbytes else None))

    for op, case, p, tokens, pairs in attention_cases(H, Hkv, D, dev, dtype, smoke):
        flops = 4 * H * D * pairs
        for backend in ("triton", "torch"):
            fn = impl(op, backend)
            report(op, case, backend, bench(lambda: fn(**p)), tokens, flops)

    T = 16 if smoke else 4096
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device=dev, generator=g, dtype=dtype)

    from kernels.rope import rope_cos_sin
    cos, sin = rope_cos_sin(D, 500000.0, None, T, dev)
    elementwise = [
        ("rms_norm", dict(x=rand(T, hidden), weight=rand(hidden), eps=1e-5, residual=rand(T, hidden)), 6 * hidden),
        ("rope_store_kv", dict(qkv=rand(T, (H + 2 * Hkv) * D), positions=torch.arange(T, device=dev), cos=cos,
                               sin=sin, k_cache=rand(2 * T, Hkv, D), v_cache=rand(2 * T, Hkv, D),
                               slots=torch.randperm(2 * T, device=dev)[:T], num_heads=H, num_kv_heads=Hkv),
         4 * (H + 2 * Hkv) * D + 4 * Hkv * D + 16 * D),
        ("silu_and_mul", dict(gate_up=rand(T, 2 * inter)), 6 * inter),
    ]
    for op, kw, bytes_per_token in elementwise:
        for backend in ("triton", "torch"):
            fn = impl(op, backend)
            report(op, f"{T} tokens", backend, bench(lambda: fn(**kw)), T, nbytes=bytes_per_token * T)

    n = 8 if smoke else 2048
    kw = dict(hidden=rand(n, hidden), weight=rand(vocab, hidden),
              targets=torch.randint(0, vocab, (n,), device=dev, generator=g))
    for backend in ("triton", "torch"):
        fn = impl("target_logprobs", backend)
        report("target_logprobs", f"{n} rows, vocab {vocab}", backend, bench(lambda: fn(**kw)), n,
               flops=2 * n * vocab * hidden)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), action="append", help="shapes to run (default: all)")
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; on the Triton interpreter without a GPU")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        if not args.smoke:
            sys.exit("bench_kernels_gpu.py needs a CUDA GPU (the CPU benchmark is benchmarks/bench_kernels.py)")
        os.environ["TRITON_INTERPRET"] = "1"
    print(f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU (Triton interpreter)'}, "
          f"torch {torch.__version__}")
    rows: list[dict] = []
    for model in (["smoke"] if args.smoke else args.model or sorted(MODELS)):
        print(f"\n== {model} shapes ({'bf16' if torch.cuda.is_available() else 'fp32'})")
        run(model, rows, smoke=args.smoke)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
