"""GPU kernel benchmark: Triton kernels vs torch references vs flash-attn (where it applies), bf16.

How to run (a CUDA machine, torch with CUDA, `pip install -e '.[triton]'`, optionally `pip install flash-attn`):

    python benchmarks/bench_kernels_gpu.py [--model smollm2|llama3-8b] [--csv out.csv]

`--smoke` runs tiny shapes instead, on the CPU through the Triton interpreter when there is no GPU: it checks
that the script works, its numbers mean nothing.

For every op and shape it prints the time per call (triton.testing.do_bench: median ms), tokens/s, and the
achieved TFLOP/s for the matmul-bound ops (attention: 4 * D flops per query-key pair and head; target log-prob:
2 * hidden flops per token and vocabulary entry) or GB/s for the memory-bound ones. torch's SDPA (the flash
backend on CUDA) runs where it computes the same attention: the plain prefill and the candidates below one shared
prefix, with each sequence's keys materialised (the prefix copied per sequence, as an engine without sharing holds
it); not under a sliding window. `cases` is also what benchmarks/gpu_check.py checks against the references.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package; the kernel tests' problems

MODELS = {  # heads, kv heads, head dim, hidden, intermediate, vocab, sliding window (0: none)
    "smollm2": (9, 3, 64, 576, 1536, 49152, 0),
    "llama3-8b": (32, 8, 128, 4096, 14336, 128256, 0),
    "gemma-3-270m": (4, 1, 256, 640, 2048, 262144, 512),
}
SMOKE_MODEL = (4, 2, 16, 32, 48, 100, 8)
# kernels of the GPU path that the engine reaches inside another op (the cascade's self part), checked and timed
# on their own beside dispatch.IMPLS
EXTRA_IMPLS = {
    "varlen_causal_attention": {
        "torch": "attention:varlen_causal_attention_ref",
        "triton": "attention_triton:varlen_causal_attention_triton",
    },
    # the fixed-shape decode attention without its split over the keys, beside the engine's choice
    "paged_decode_attention_unsplit": {
        "torch": "attention:paged_decode_attention_ref",
        "triton": "attention_triton:paged_decode_attention_unsplit",
    },
    # the batch-invariant Triton linear (a candidate for the deterministic mode's GPU linears) against cuBLAS on the
    # whole step, and against the mode's current form (cuBLAS on fixed 256-row tiles)
    "linear": {"torch": "linear:linear_ref", "triton": "linear_triton:linear_invariant_triton"},
    "linear_row_tiles": {"torch": "batch_invariant:linear", "triton": "linear_triton:linear_invariant_triton"},
}


@dataclass
class Case:
    """One op at one shape: its keyword arguments (on the device, in the dtype), the tokens it serves, its matmul
    FLOPs or the bytes it moves, and where torch's SDPA computes the same attention, a closure running it."""

    op: str
    case: str
    kwargs: dict
    tokens: int
    flops: float | None = None
    nbytes: float | None = None
    sdpa: Callable | None = None  # () -> a closure running SDPA (or None): built on demand, it copies the keys


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


def impl(op: str, backend: str):
    """The function of `op` ("torch": its reference, "triton": its kernel)."""
    from kernels import dispatch

    module, name = {**dispatch.IMPLS, **EXTRA_IMPLS}[op][backend].split(":")
    return getattr(importlib.import_module(f"kernels.{module}"), name)


def to_device(p: dict, dev) -> dict:
    """A tests/attention_problems.py problem with its tensors (and its plan's segments' and window's) on `dev`."""
    from kernels.attention import AttentionPlan, AttentionWindow, Segment

    out = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in p.items()}
    if "plan" in p:
        out["plan"] = AttentionPlan(
            p["plan"].cu_seqlens, [Segment(s.rows.to(dev), s.slots.to(dev)) for s in p["plan"].segments]
        )
    if isinstance(p.get("window"), AttentionWindow):
        w = p["window"]
        out["window"] = AttentionWindow(w.size, w.positions.to(dev), w.slot_positions.to(dev))
    return out


def sdpa_closure(p: dict, n_seq: int, new: int, shared: int):
    """torch SDPA computing the outputs of a cascade problem of n_seq sequences of `new` tokens each below one
    shared cached segment of `shared` tokens (0: none), the way an engine without sharing would: each sequence's
    keys (the shared segment's, then its own) materialised in [B, H, S, D] layout, its queries causal within
    them, aligned to the end (lower right). Returns fn() -> out [T, H, D], or None where SDPA cannot express it
    (a sliding window, several segments). Runs on the flash backend where it is available (CUDA, fp16/bf16)."""
    if p.get("window") is not None or len(p["plan"].segments) > (1 if shared else 0):
        return None
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k_new, v_new = p["q"], p["k_new"], p["v_new"]
    H, D, Hkv = q.shape[1], q.shape[2], k_new.shape[1]

    def keys(new_kv, cache):
        own = new_kv.view(n_seq, new, Hkv, D)
        if shared:
            slots = p["plan"].segments[0].slots
            own = torch.cat([cache[slots].unsqueeze(0).expand(n_seq, -1, -1, -1), own], dim=1)
        return own.transpose(1, 2).repeat_interleave(H // Hkv, dim=1).contiguous()  # GQA: heads repeated

    qs = q.view(n_seq, new, H, D).transpose(1, 2).contiguous()
    ks, vs = keys(k_new, p["k_cache"]), keys(v_new, p["v_cache"])
    mask = None
    if shared and new > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(new, shared + new)
    backends = (
        [SDPBackend.FLASH_ATTENTION] if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else [SDPBackend.MATH]
    )

    def run():
        with sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=not shared and new > 1, scale=p["scale"]
            )
        return out.transpose(1, 2).reshape(n_seq * new, H, D)

    return run


def cases(shape: tuple, dev, dtype, smoke: bool = False):
    """Every op of the GPU path at one model's shapes (MODELS): the cascade attention (a plain prefill, candidates
    below a shared prefix, and under the model's sliding window), its causal self part on its own, the fixed-shape
    decode attention (and under the window), the deterministic mode's segment merge with row limits, RMSNorm, RoPE + KV store, SwiGLU and the target log-prob
    over the vocabulary. Yields Case."""
    from attention_problems import cascade_problem, cascade_window, varlen_problem

    from kernels.rope import rope_cos_sin

    H, Hkv, D, hidden, inter, vocab, window = shape
    gen = torch.Generator().manual_seed(0)

    def attention(op, case, p, tokens, pairs, sdpa=None):
        return Case(op, case, p, tokens, flops=4 * H * D * pairs, sdpa=sdpa)

    shapes = ((2, 6, 0), (3, 1, 20), (2, 4, 24)) if smoke else ((8, 512, 0), (256, 1, 1024), (64, 8, 2048))
    for n_seq, new, shared in shapes:
        p = to_device(cascade_problem([new] * n_seq, shared, [0] * n_seq, H, Hkv, D, dtype), dev)
        pairs = n_seq * (new * shared + new * (new + 1) // 2)
        case = f"{n_seq} seqs x {new} tok, {shared} shared" if shared else f"prefill {n_seq} x {new} tok"
        yield attention(
            "cascade_attention",
            case,
            p,
            n_seq * new,
            pairs,
            lambda p=p, n_seq=n_seq, new=new, shared=shared: sdpa_closure(p, n_seq, new, shared),
        )
    if window:
        n_seq, new, shared, own = (3, 4, 20, [0, 5, 12]) if smoke else (64, 8, 2048, [0] * 64)
        p = cascade_problem([new] * n_seq, shared, own, H, Hkv, D, dtype)
        p["window"] = cascade_window(p, shared, own, window)
        pairs = n_seq * new * min(window, shared + new)
        yield attention(
            "cascade_attention",
            f"{n_seq} seqs x {new} tok, {shared} shared, window {window}",
            to_device(p, dev),
            n_seq * new,
            pairs,
        )
    seq_lens = [5, 1, 0, 19] if smoke else [256, 1024, 512, 2048] * 2
    pairs = sum(min(i + 1, window or i + 1) for n in seq_lens for i in range(n))
    yield attention(
        "varlen_causal_attention",
        f"{len(seq_lens)} seqs up to {max(seq_lens)} tok" + (f", window {window}" if window else ""),
        dict(to_device(varlen_problem(seq_lens, H, Hkv, D, dtype), dev), window=window),
        sum(seq_lens),
        pairs,
    )
    # the fixed-shape decode attention a captured CUDA graph replays (engine/decode_graphs.py): one new token of
    # each sequence over a shared prompt and its own key, through a slot table
    # (and one long sequence alone: its keys cut into parts, attention_triton.decode_splits, against whole rows,
    # one program per KV head)
    for n_seq, ctx in ((3, 20), (1, 40)) if smoke else ((64, 1024), (1, 8192)):
        table = torch.cat([torch.arange(ctx).expand(n_seq, ctx), ctx + torch.arange(n_seq)[:, None]], 1)
        decode = dict(
            q=torch.randn(n_seq, H, D, generator=gen).to(dev, dtype),
            k_cache=torch.randn(ctx + n_seq, Hkv, D, generator=gen).to(dev, dtype),
            v_cache=torch.randn(ctx + n_seq, Hkv, D, generator=gen).to(dev, dtype),
            table=table.to(dev, torch.int32),
            lens=torch.full((n_seq,), ctx + 1, dtype=torch.int32, device=dev),
            scale=D**-0.5,
        )
        for w in (0, window) if window and n_seq > 1 else (0,):
            # one sequence: the engine's choice (its keys cut into parts, decode_splits) and whole rows
            for op in ("paged_decode_attention",) + (("paged_decode_attention_unsplit",) if n_seq == 1 else ()):
                yield attention(
                    op,
                    f"{n_seq} seq{'s' if n_seq > 1 else ''} x 1 tok, {ctx} "
                    + ("shared" if n_seq > 1 else "keys")
                    + (f", window {w}" if w else ""),
                    dict(decode, window=w),
                    n_seq,
                    n_seq * (min(w, ctx + 1) if w else ctx + 1),
                )
    rows, shared = (12, 40) if smoke else (1024, 2048)
    p = to_device(cascade_problem([rows], shared, [0], H, Hkv, D, dtype), dev)
    limits = torch.randint(0, shared, (rows,), generator=gen).to(dev)
    seg = p["plan"].segments[0]
    merge = dict(
        q=p["q"],
        rows=seg.rows,
        k_cache=p["k_cache"],
        v_cache=p["v_cache"],
        slots=seg.slots,
        scale=p["scale"],
        out=torch.randn(rows, H, D, generator=gen).to(dev),
        lse=torch.randn(rows, H, generator=gen).to(dev),
        limits=limits,
    )
    yield attention(
        "segment_attention_merge", f"{rows} rows, {shared} keys, row limits", merge, rows, int(limits.sum()) + rows
    )

    T = 16 if smoke else 4096
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape_):
        return torch.randn(*shape_, device=dev, generator=g, dtype=dtype)

    cos, sin = rope_cos_sin(D, 500000.0, None, T, dev)
    yield Case(
        "rms_norm",
        f"{T} tokens",
        dict(x=rand(T, hidden), weight=rand(hidden), eps=1e-5, residual=rand(T, hidden)),
        T,
        nbytes=6 * hidden * T,
    )
    yield Case(
        "rope_store_kv",
        f"{T} tokens",
        dict(
            qkv=rand(T, (H + 2 * Hkv) * D),
            positions=torch.arange(T, device=dev),
            cos=cos,
            sin=sin,
            k_cache=rand(2 * T, Hkv, D),
            v_cache=rand(2 * T, Hkv, D),
            slots=torch.randperm(2 * T, device=dev)[:T],
            num_heads=H,
            num_kv_heads=Hkv,
        ),
        T,
        nbytes=(4 * (H + 2 * Hkv) * D + 4 * Hkv * D + 16 * D) * T,
    )
    yield Case("silu_and_mul", f"{T} tokens", dict(gate_up=rand(T, 2 * inter)), T, nbytes=6 * inter * T)
    if smoke or hidden == 4096:  # the linears at the 8B shape (the MFU bar's): the fused QKV and the down projection
        for what, n_out, k_in in (("qkv", (H + 2 * Hkv) * D, hidden), ("down", hidden, inter)):
            lin = dict(x=rand(T, k_in), weight=rand(n_out, k_in) * k_in**-0.5)
            for op in ("linear", "linear_row_tiles"):
                yield Case(op, f"{what}: {T} x {k_in} -> {n_out}", lin, T, flops=2 * T * n_out * k_in)
    n = 8 if smoke else 2048
    # the LM head scaled as a trained one is (logits of order 1, not of order sqrt(hidden))
    yield Case(
        "target_logprobs",
        f"{n} rows, vocab {vocab}",
        dict(
            hidden=rand(n, hidden),
            weight=rand(vocab, hidden) * hidden**-0.5,
            targets=torch.randint(0, vocab, (n,), device=dev, generator=g),
        ),
        n,
        flops=2 * n * vocab * hidden,
    )


def run(model: str, rows: list, smoke: bool = False):
    shape = SMOKE_MODEL if smoke else MODELS[model]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the interpreter has no bf16

    def report(c: Case, backend, ms):
        flops, nbytes = c.flops, c.nbytes
        rate = f"{flops / ms / 1e9:8.1f} TFLOP/s" if flops else f"{nbytes / ms / 1e6:8.1f} GB/s"
        print(f"{c.op:<28} {c.case:<44} {backend:<10} {ms:9.3f} ms {c.tokens / ms * 1e3:12.0f} tok/s {rate}")
        rows.append(
            dict(
                model=model,
                op=c.op,
                case=c.case,
                backend=backend,
                ms=ms,
                tokens_per_s=c.tokens / ms * 1e3,
                tflops=flops / ms / 1e9 if flops else None,
                gbps=nbytes / ms / 1e6 if nbytes else None,
            )
        )

    for c in cases(shape, dev, dtype, smoke):
        for backend in ("triton", "torch"):
            fn = impl(c.op, backend)
            report(c, backend, bench(lambda: fn(**c.kwargs)))
        sdpa = c.sdpa() if c.sdpa is not None else None
        if sdpa is not None:
            report(c, "sdpa", bench(sdpa))


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
    print(
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU (Triton interpreter)'}, "
        f"torch {torch.__version__}"
    )
    rows: list[dict] = []
    for model in ["smoke"] if args.smoke else args.model or sorted(MODELS):
        print(f"\n== {model} shapes ({'bf16' if torch.cuda.is_available() else 'fp32'})")
        run(model, rows, smoke=args.smoke)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
