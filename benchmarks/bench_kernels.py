"""CPU kernel benchmark: native ops vs torch references, per op on SmolLM2 shapes and end to end.

    .venv/bin/python benchmarks/bench_kernels.py [--repeat 5] [--no-e2e]

Per op it prints the median wall time of each CPU implementation (torch reference, native C++ where one exists)
in bf16 and fp32, their ratio, and the path the dispatch picks (`auto`); the fp32 and bf16 linears at a decode
step's 32 rows, one row and a 1024-row chunk in each weight form (F.linear, oneDNN prepacked, the native panels)
and the form the engine's fast mode packs; then the engine end to end (SmolLM2,
bf16) with ENGINE_KERNELS=torch vs auto. CPU time (all threads) is printed beside wall time because the machine
may be shared: it is the steadier of the two under load. The last line says whether `auto` picked the faster
path everywhere.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package; the kernel tests' problems

from attention_problems import cascade_problem  # noqa: E402

import kernels  # noqa: E402
from kernels import dispatch, native_ops  # noqa: E402

H, HKV, D, HIDDEN, INTER, VOCAB = 9, 3, 64, 576, 1536, 49152  # SmolLM2-135M


def timed(fn, repeat: int) -> tuple[float, float]:
    """Median (wall ms, CPU ms) over `repeat` runs after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def op_cases(dtype):
    """(op, label, kwargs) on SmolLM2 shapes."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    cos, sin = kernels.rope_cos_sin(D, 100000.0, None, 8192)
    T = 512
    cache = rand(4096, HKV, D)
    yield (
        "cascade_attention",
        "200 candidates x 1 token, 600-token shared prefix",
        cascade_problem([1] * 200, 600, [0] * 200, H, HKV, D, dtype),
    )
    yield (
        "cascade_attention",
        "40 candidates x 5 tokens, 600 shared + 20 own",
        cascade_problem([5] * 40, 600, [20] * 40, H, HKV, D, dtype),
    )
    yield (
        "cascade_attention",
        "512-token chunk after 2000 cached tokens",
        cascade_problem([512], 2000, [0], H, HKV, D, dtype),
    )
    yield (
        "rms_norm",
        f"{T} x {HIDDEN} with residual",
        dict(x=rand(T, HIDDEN), weight=rand(HIDDEN), eps=1e-5, residual=rand(T, HIDDEN)),
    )
    for n in (T, 32):  # a prefill chunk, a decode step
        yield (
            "rope_store_kv",
            f"{n} tokens",
            dict(
                qkv=rand(n, (H + 2 * HKV) * D),
                positions=torch.arange(n),
                cos=cos,
                sin=sin,
                k_cache=cache,
                v_cache=cache.clone(),
                slots=torch.randperm(4096, generator=g)[:n],
                num_heads=H,
                num_kv_heads=HKV,
            ),
        )
    yield "silu_and_mul", f"{T} x 2*{INTER}", dict(gate_up=rand(T, 2 * INTER))
    # LM-head scale of a trained model (logits with std ~3): random unit weights would push exp() into denormals
    lm_head = rand(VOCAB, HIDDEN) * 0.12
    for n in (64, 4):  # a scoring step's rows: a few for the ICQS job's short candidates
        yield (
            "target_logprobs",
            f"{n} rows x vocab {VOCAB}",
            dict(hidden=rand(n, HIDDEN), weight=lm_head, targets=torch.randint(0, VOCAB, (n,), generator=g)),
        )
    yield "greedy_logprobs", f"a decode step's 32 rows of logits x vocab {VOCAB}", dict(logits=rand(32, VOCAB) * 3)


LINEAR_SHAPES = {
    "qkv": ((H + 2 * HKV) * D, HIDDEN),
    "o": (HIDDEN, H * D),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
    "lm_head": (VOCAB, HIDDEN),
}


def linear_cases(dtype: torch.dtype = torch.float32):
    """(label, x, {form: weight}) for SmolLM2's linears in `dtype` (fp32 or bf16) at 1, 32 and 1024 rows (the LM
    head: decode rows only): the plain weight (F.linear, the reference), oneDNN's prepacked copy (where it packs
    this dtype) and the native panels (where the library runs them)."""
    from kernels.linear import Packed, Panels, panels_available, prepack

    g = torch.Generator().manual_seed(0)
    for name, (n, k) in LINEAR_SHAPES.items():
        w = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype)
        forms, packed = {"F.linear": w}, prepack(w)
        if isinstance(packed, Packed):
            forms["oneDNN"] = packed
        if panels_available():
            forms["panels"] = Panels(w)
        for rows in (1, 32) if name == "lm_head" else (1, 32, 1024):
            yield f"{name} {n}x{k}, {rows} rows", torch.randn(rows, k, generator=g).to(dtype), forms


def bench_linear(repeat: int) -> None:
    from kernels.dispatch import StepKernels
    from kernels.linear import Packed, Panels, linear

    for dtype in (torch.float32, torch.bfloat16):
        packed = StepKernels().weight(torch.randn(48, 32).to(dtype))
        engine_form = "panels" if isinstance(packed, Panels) else "oneDNN" if isinstance(packed, Packed) else "plain"
        name = f"{str(dtype).removeprefix('torch.')} linear"
        print(f"\n{name:<32} {'F.linear ms':>11} {'oneDNN ms':>10} {'panels ms':>10}   engine packs: {engine_form}")
        for label, x, forms in linear_cases(dtype):
            t = {f: timed(lambda: linear(x, w), repeat)[0] for f, w in forms.items()}
            cells = " ".join(f"{t[f]:10.3f}" if f in t else f"{'-':>10}" for f in ("oneDNN", "panels"))
            print(f"{label:<32} {t['F.linear']:11.3f} {cells}   fastest: {min(t, key=t.get)}")


def impl(op: str, backend: str):
    module, name = dispatch.IMPLS[op][backend].split(":")
    return getattr(__import__(f"kernels.{module}", fromlist=[name]), name)


def bench_ops(repeat: int) -> bool:
    ok = True
    print(f"{'op':<24} {'case':<48} {'dtype':<8} {'torch ms':>9} {'native ms':>10} {'ratio':>6} {'auto':>7}")
    for dtype in (torch.bfloat16, torch.float32):
        for op, label, kw in op_cases(dtype):
            t_torch = timed(lambda: impl(op, "torch")(**kw), repeat)
            has_native = "native" in dispatch.IMPLS[op] and native_ops.load()
            t_native = timed(lambda: impl(op, "native")(**kw), repeat) if has_native else None
            auto = dispatch._pick(op, torch.device("cpu"), "auto")[0]
            ratio = t_torch[0] / t_native[0] if t_native else None
            nat = f"{t_native[0]:10.2f}" if t_native else f"{'-':>10}"
            rat = f"{ratio:6.2f}" if ratio else f"{'-':>6}"
            print(
                f"{op:<24} {label:<48} {str(dtype)[6:]:<8} {t_torch[0]:9.2f} {nat} {rat} {auto:>7}"
                f"   (cpu ms: torch {t_torch[1]:.1f}" + (f", native {t_native[1]:.1f})" if t_native else ")")
            )
            if t_native and (auto == "native") != (t_native[0] < t_torch[0]):
                ok = False
    return ok


def bench_engine(repeat: int) -> bool:
    from engine import Engine

    engine = Engine.load(None, dtype="bfloat16")
    context = " ".join(f"Item {i}: a short sentence about topic number {i}." for i in range(40))
    requests = [(context + "\nRating:", f" {i}") for i in range(1, 11)]
    requests += [(context + f"\nCandidate {i} says:", " this is a fine answer to the question.") for i in range(30)]
    print(
        f"\nend to end: SmolLM2 bf16, {len(requests)} requests sharing a "
        f"{len(engine.tokenizer.encode(context))}-token context"
    )
    times = {}
    for backend in ("torch", "auto"):
        kernels.set_backend(backend)
        times[backend] = timed(lambda: engine.score(requests), repeat)
        stats = asdict(engine.last_stats)
        print(
            f"  {backend:<6} ({kernels.describe('cpu')}): {times[backend][0]:8.0f} ms wall, "
            f"{times[backend][1]:8.0f} ms CPU, {stats['tokens_computed'] / times[backend][0] * 1e3:7.0f} tokens/s"
        )
    kernels.set_backend(None)
    ratio = times["torch"][0] / times["auto"][0]
    print(f"  auto vs torch: {ratio:.2f}x")
    return ratio >= 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end engine run")
    ap.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, native library: {'yes' if native_ops.load() else 'absent'}"
    )
    ok = bench_ops(args.repeat)
    bench_linear(args.repeat)
    if not args.no_e2e:
        ok = bench_engine(max(1, args.repeat // 2)) and ok
    print("auto picks the faster CPU path everywhere" if ok else "WARNING: auto did not pick the faster path above")


if __name__ == "__main__":
    main()
