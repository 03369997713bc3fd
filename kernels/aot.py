"""Ahead-of-time compilation of every Triton kernel for a GPU target, on any machine (no GPU needed).

Each launcher (`*_triton.py`) is run as the engine runs it, on meta tensors with a model's widths, while its
kernels are replaced by recorders: that yields exactly the launches a GPU step makes (grid, arguments, tile
constexprs, num_warps). The launchers pick their tiles with `tiles.gpu_tiles(tensor)` (kernels/tiles.py), which
`tiles.forced_gpu_tiles()` turns on for CPU tensors, so the recorded tiles are the ones a GPU gets. Each launch is
then specialised as Triton's JIT would specialise it (argument types, 16-divisibility) and compiled by
`triton.compile` for the target down to PTX and a cubin; the compiled metadata gives the shared memory each kernel
needs.

`python -m kernels.aot` prints the table for sm_80 (A100) and sm_90 (H100) (`--json`: one record a line);
tests/test_kernels_aot.py runs it in a subprocess (Triton's interpreter, which the other kernel tests use on a
CPU, and its compiler cannot share one process) and fails if a kernel does not lower or needs more shared
memory than the target has."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .attention import AttentionPlan, AttentionWindow, Segment
from .tiles import forced_gpu_tiles

# target name -> (compute capability, shared memory a block may use, bytes: the opt-in maximum per block)
TARGETS = {"sm_80": (80, 163 * 1024), "sm_90": (90, 227 * 1024)}

# The widths that set the tile constexprs (head_dim, GQA group, hidden / intermediate size, vocabulary)
MODEL_SHAPES = {
    "smollm2-135m": dict(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152),
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256),
    "qwen2-7b": dict(hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=18944, vocab=152064),
    "gemma-3-270m": dict(hidden=640, heads=4, kv_heads=1, head_dim=256, intermediate=2048, vocab=262144),
}

KERNEL_MODULES = (
    "rmsnorm_triton",
    "rope_triton",
    "swiglu_triton",
    "attention_triton",
    "logprob_triton",
    "linear_triton",
)


def compiled_module(name: str):
    """A fresh copy of kernels/<name>.py whose @triton.jit functions are compiled kernels, not interpreted ones
    (the tests may have imported the engine's copy under TRITON_INTERPRET=1)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{__package__}._aot_{name}", path)
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module


@dataclass
class Launch:
    kernel: object  # triton.runtime.jit.JITFunction
    grid: tuple
    args: tuple
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@contextlib.contextmanager
def recording(module):
    """Within: every `kernel[grid](...)` of `module` is recorded into the yielded list instead of launched."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(Launch(self.kernel, tuple(grid), args, kwargs))

    kernels = {k: v for k, v in vars(module).items() if isinstance(v, JITFunction)}
    for k, v in kernels.items():
        setattr(module, k, Recorder(v))
    try:
        with forced_gpu_tiles():
            yield launches
    finally:
        for k, v in kernels.items():
            setattr(module, k, v)


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def model_launches(shape: dict, dtype: torch.dtype, tokens: int = 48) -> list[Launch]:
    """Every kernel launch of one engine step for a model of these widths."""
    H, Hkv, D = shape["heads"], shape["kv_heads"], shape["head_dim"]
    out: list[Launch] = []
    m = {name: compiled_module(name) for name in KERNEL_MODULES}
    x, w = _meta(tokens, shape["hidden"], dtype=dtype), _meta(shape["hidden"], dtype=dtype)
    with recording(m["rmsnorm_triton"]) as rec:
        m["rmsnorm_triton"].rms_norm_triton(x, w, 1e-5)
        m["rmsnorm_triton"].rms_norm_triton(x, w, 1e-5, residual=x)
    out += rec
    with recording(m["rope_triton"]) as rec:
        m["rope_triton"].rope_store_kv_triton(
            _meta(tokens, (H + 2 * Hkv) * D, dtype=dtype),
            _meta(tokens, dtype=torch.int64),
            _meta(4096, D),
            _meta(4096, D),
            _meta(1024, Hkv, D, dtype=dtype),
            _meta(1024, Hkv, D, dtype=dtype),
            _meta(tokens, dtype=torch.int64),
            H,
            Hkv,
        )
    out += rec
    with recording(m["swiglu_triton"]) as rec:
        m["swiglu_triton"].silu_and_mul_triton(_meta(tokens, 2 * shape["intermediate"], dtype=dtype))
    out += rec
    # the batch-invariant linear (a candidate for the deterministic mode's GPU linears): with and without a bias
    with recording(m["linear_triton"]) as rec:
        for bias in (None, _meta(shape["intermediate"], dtype=dtype)):
            m["linear_triton"].linear_invariant_triton(
                x, _meta(shape["intermediate"], shape["hidden"], dtype=dtype), bias
            )
    out += rec

    # a small step (the constexprs depend only on the widths): sequences of 3 and 18 new tokens below a 21-token
    # segment shared by both, the second with 5 cached tokens of its own; q, K/V and the cache on meta
    T, cu, scale = 21, [0, 3, 21], D**-0.5
    q, kv, cache = _meta(T, H, D, dtype=dtype), _meta(T, Hkv, D, dtype=dtype), _meta(26, Hkv, D, dtype=dtype)
    shared = Segment(torch.arange(T), torch.arange(21))
    plan = AttentionPlan(cu, [shared, Segment(torch.arange(3, T), torch.arange(21, 26))])
    # sliding-window layers (Gemma-3): slot i holds position i, the new tokens follow their cached ones
    window = AttentionWindow(8, torch.cat([torch.arange(21, 24), torch.arange(26, 44)]), torch.arange(26))
    attention = m["attention_triton"]
    with recording(attention) as rec:
        attention.varlen_causal_attention_triton(q, kv, kv, cu, scale)
        attention.cascade_attention_triton(q, kv, kv, cache, cache, plan, scale)
        # the window in the self part and a first key per row in the segments
        attention.cascade_attention_triton(q, kv, kv, cache, cache, plan, scale, window=window)
        # the deterministic mode's merge: a causal limit per row, and under a window a first key too
        for starts in (None, torch.zeros_like(shared.rows)):
            attention.segment_attention_merge_triton(
                q,
                shared.rows,
                cache,
                cache,
                shared.slots,
                scale,
                _meta(T, H, D),
                _meta(T, H),
                torch.zeros_like(shared.rows),
                starts,
            )
        # the fixed-shape decode attention a captured graph replays (engine/decode_graphs.py): whole rows, and
        # rows cut into parts merged by a second kernel (a few sequences over long contexts)
        for splits in (1, 8):
            attention.paged_decode_attention_split(
                _meta(4, H, D, dtype=dtype),
                cache,
                cache,
                _meta(4, 64, dtype=torch.int32),
                _meta(4, dtype=torch.int32),
                scale,
                0,
                splits,
            )
    out += rec
    with recording(m["logprob_triton"]) as rec:
        for top_k in (0, 5):
            m["logprob_triton"].target_logprobs_triton(
                x, _meta(shape["vocab"], shape["hidden"], dtype=dtype), _meta(tokens, dtype=torch.int64), top_k
            )
    out += rec
    return out


@dataclass
class Compiled:
    kernel: str
    target: str
    constexprs: dict
    num_warps: int
    num_stages: int
    shared: int  # bytes of shared memory per block
    limit: int
    ptx_lines: int

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


def compile_launch(launch: Launch, target: str) -> Compiled:
    """Specialises `launch` as Triton's JIT would and compiles it for `target` (sm_80 / sm_90) to a cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    capability, limit = TARGETS[target]
    gpu = GPUTarget("cuda", capability, 32)
    backend = make_backend(gpu)
    fn = launch.kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=gpu, options=options.__dict__)
    named = {fn.arg_names[k[0]]: v for k, v in constexprs.items() if len(k) == 1 and fn.params[k[0]].is_constexpr}
    return Compiled(
        launch.name,
        target,
        named,
        compiled.metadata.num_warps,
        compiled.metadata.num_stages,
        compiled.metadata.shared,
        limit,
        compiled.asm["ptx"].count("\n"),
    )


def distinct(launches: list[Launch]) -> list[Launch]:
    """One launch per (kernel, specialisation): the same compiled kernel is not compiled twice."""
    from triton.runtime.jit import mangle_type

    seen, out = set(), []
    for la in launches:
        key = (
            la.name,
            tuple(mangle_type(a, True) if not isinstance(a, (str, bool)) else repr(a) for a in la.args),
            tuple(sorted((k, repr(v)) for k, v in la.kwargs.items())),
        )
        if key not in seen:
            seen.add(key)
            out.append(la)
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    p.add_argument("--json", action="store_true", help="one JSON record per compiled kernel")
    a = p.parse_args(argv)
    failed = 0
    if not a.json:
        print(
            f"{'model':14} {'dtype':9} {'target':6} {'kernel':24} {'warps':>5} {'stages':>6} {'shared KiB':>10} "
            f"{'limit KiB':>9}  tiles"
        )
    for model in a.models:
        for dtype in a.dtypes:
            launches = distinct(model_launches(MODEL_SHAPES[model], getattr(torch, dtype)))
            for target in a.targets:
                for la in launches:
                    c = compile_launch(la, target)
                    failed += not c.fits
                    if a.json:
                        print(json.dumps(dict(vars(c), model=model, dtype=dtype, fits=c.fits)), flush=True)
                        continue
                    tiles = " ".join(f"{k}={v}" for k, v in c.constexprs.items())
                    print(
                        f"{model:14} {dtype:9} {target:6} {c.kernel:24} {c.num_warps:5d} {c.num_stages:6d} "
                        f"{c.shared / 1024:10.1f} {c.limit / 1024:9.0f}  {tiles}{'' if c.fits else '  TOO LARGE'}",
                        flush=True,
                    )
    return 1 if failed else 0


if __name__ == "__main__":  # run the imported module's main: its switch is the one the launchers read
    sys.exit(importlib.import_module("kernels.aot").main())
