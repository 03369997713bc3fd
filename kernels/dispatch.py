"""One entry point per op; picks the implementation from the backend setting and the tensors' device.

Backends (env ENGINE_KERNELS, or set_backend()):
  auto    CUDA tensors -> Triton. CPU tensors -> the path measured faster on the CPU by
          benchmarks/bench_kernels.py: the native ops (kernels/native, C++/OpenMP) where the library is built and
          the op is in CPU_NATIVE_OPS (or CPU_NATIVE_AVX2_OPS, on an AVX2 build), the torch references for
          the others.
          Without the library, the torch references, and a warning says so once.
  torch   the torch references (*_ref) everywhere.
  triton  the Triton kernels everywhere; on a CPU this is the Triton interpreter, which needs TRITON_INTERPRET=1
          in the environment from the start (an error says so otherwise), slow, meant for tests.
  native  the native ops where they exist, torch references for the rest; an error if the library is not built.
One log line per (op, device) says which path runs.

IMPLS registers every op that has a reference and a kernel, tested and benchmarked (benchmarks/bench_kernels*.py)
pair by pair; the engine calls all of them, through the entry points at the bottom of this file. The model reaches
its matmuls, attention and target log-prob through a `StepKernels` (one per model): the fast mode (CPU weights
prepacked for oneDNN or the native panels, kernels/linear.py; the cascade attention) or the deterministic mode (the
batch-invariant forms of kernels/batch_invariant.py, and the panels, whose rows are batch-invariant by
construction) is chosen there, once, not in the model.

Process settings are made by `configure_cpu` (called where the engine sets its thread count), never at import.
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

from . import batch_invariant, native_ops
from . import linear as _linear_forms
from .attention import AttentionPlan, segment_attention_merge_ref
from .linear import Panels
from .linear import linear as _packed_linear
from .linear import prepack as _prepack

log = logging.getLogger("kernels")
BACKENDS = ("auto", "torch", "triton", "native")

# op -> {backend: "module:function"}
IMPLS = {
    "rms_norm": {
        "torch": "rmsnorm:rms_norm_ref",
        "triton": "rmsnorm_triton:rms_norm_triton",
        "native": "native_ops:rms_norm_native",
    },
    "rope_store_kv": {
        "torch": "rope:rope_store_kv_ref",
        "triton": "rope_triton:rope_store_kv_triton",
        "native": "native_ops:rope_store_kv_native",
    },
    "silu_and_mul": {
        "torch": "swiglu:silu_and_mul_ref",
        "triton": "swiglu_triton:silu_and_mul_triton",
        "native": "native_ops:silu_and_mul_native",
    },
    "cascade_attention": {
        "torch": "attention:cascade_attention_ref",
        "triton": "attention_triton:cascade_attention_triton",
        "native": "native_ops:cascade_attention_native",
    },
    "paged_decode_attention": {
        "torch": "attention:paged_decode_attention_ref",
        "triton": "attention_triton:paged_decode_attention_triton",
    },
    "segment_attention_merge": {
        "torch": "attention:segment_attention_merge_ref",
        "triton": "attention_triton:segment_attention_merge_triton",
        "native": "native_ops:segment_attention_merge_native",
    },
    "target_logprobs": {
        "torch": "logprob:target_logprobs_ref",
        "triton": "logprob_triton:target_logprobs_triton",
        "native": "native_ops:target_logprobs_native",
    },
    "greedy_logprobs": {"torch": "logprob:greedy_logprobs_ref", "native": "native_ops:greedy_logprobs_native"},
}
ENGINE_OPS = (
    "rms_norm",
    "rope_store_kv",
    "silu_and_mul",
    "cascade_attention",
    "paged_decode_attention",
    "segment_attention_merge",
    "target_logprobs",
    "greedy_logprobs",
)
# Ops whose native CPU version beat the torch reference in benchmarks/bench_kernels.py (bf16 and fp32, SmolLM2
# shapes), and those measured so only in a library built for AVX2 without AVX-512 (kernels/linear.panels_available):
# the target log-prob's fused LM head (on an AVX-512 build torch's own fp32 GEMM is twice as wide; not measured).
CPU_NATIVE_OPS = frozenset(
    {"cascade_attention", "segment_attention_merge", "rms_norm", "rope_store_kv", "silu_and_mul", "greedy_logprobs"}
)
CPU_NATIVE_AVX2_OPS = frozenset({"target_logprobs"})
# The wave form of a segment merge, where it has one: one launch merges many row-disjoint segments, each exactly as
# alone (the deterministic mode's key chunks of one position; batch_invariant.cascade_attention)
MERGE_WAVES = {"attention_triton:segment_attention_merge_triton": "attention_triton:wave_merge_triton"}

_state = {"backend": None}
_chosen: dict[tuple[str, str, str], object] = {}


def set_backend(name: str | None) -> None:
    """Forces one backend for every op (None: back to ENGINE_KERNELS / auto)."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r} (expected one of {', '.join(BACKENDS)})")
    _state["backend"] = name
    _chosen.clear()


def get_backend() -> str:
    name = _state["backend"] or os.environ.get("ENGINE_KERNELS", "auto") or "auto"
    if name not in BACKENDS:
        raise ValueError(f"ENGINE_KERNELS={name!r} is not one of {', '.join(BACKENDS)}")
    return name


def _import_triton_module(module: str):
    """Without a GPU, Triton kernels run in Triton's interpreter, which must be on before triton itself is imported
    (its own library functions are decorated then): the user starts the process with TRITON_INTERPRET=1 (the test
    suite does); it is not switched on behind their back."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the Triton kernels on a machine without CUDA run in Triton's interpreter: start the "
            "process with TRITON_INTERPRET=1 (slow; meant for tests)"
        )
    return importlib.import_module(f"{__package__}.{module}")


def _wave_form(merge):
    """MERGE_WAVES' form of a resolved segment merge, or None."""
    spec = MERGE_WAVES.get(f"{merge.__module__.rsplit('.', 1)[-1]}:{merge.__name__}")
    if spec is None:
        return None
    module, name = spec.split(":")
    return getattr(_import_triton_module(module), name)


def _pick(op: str, device: torch.device, backend: str) -> tuple[str, str]:
    impls = IMPLS[op]
    if backend == "auto":
        if device.type == "cuda":
            return ("triton", "CUDA") if "triton" in impls else ("torch", "no Triton kernel for this op")
        if op in CPU_NATIVE_AVX2_OPS:
            return (
                ("native", "measured faster on an AVX2 build")
                if _linear_forms.panels_available()
                else ("torch", "no faster CPU path measured for this build")
            )
        if op in CPU_NATIVE_OPS:
            if native_ops.load():
                return "native", f"measured faster on CPU ({native_ops.LIB_DIR.name}/libicqs_native.so)"
            if not _state.get("warned"):
                _state["warned"] = True
                log.warning(
                    "kernels: native CPU ops are not built (no libicqs_native.so in %s); the CPU runs the "
                    "torch references",
                    native_ops.LIB_DIR,
                )
            return "torch", "native library absent"
        return "torch", "no faster CPU path measured"
    if backend == "native":
        if "native" not in impls:
            return "torch", "no native version of this op"
        if not native_ops.load():
            raise RuntimeError(f"ENGINE_KERNELS=native but libicqs_native.so is not built in {native_ops.LIB_DIR}")
        return "native", "forced"
    if backend == "triton" and "triton" not in impls:
        return "torch", "no Triton kernel for this op"
    if backend == "triton" and device.type == "cpu":
        return "triton", "forced; Triton interpreter"
    return backend, "forced"


def resolve(op: str, device: torch.device):
    """The function that runs `op` for tensors on `device` under the current backend."""
    backend = get_backend()
    key = (op, device.type, backend)
    fn = _chosen.get(key)
    if fn is None:
        impl, why = _pick(op, device, backend)
        module, name = IMPLS[op][impl].split(":")
        mod = _import_triton_module(module) if impl == "triton" else importlib.import_module(f"{__package__}.{module}")
        fn = _chosen[key] = getattr(mod, name)
        log.info("kernels: %s on %s -> %s (%s)", op, device.type, impl, why)
    return fn


def describe(device: str | None = None) -> str:
    """One line: the backend and the implementation each op the engine calls gets on `device` (default: cuda if
    present)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    picks = {op: _pick(op, dev, get_backend())[0] for op in ENGINE_OPS}
    common = max(set(picks.values()), key=list(picks.values()).count)
    rest = ", ".join(f"{op}={impl}" for op, impl in picks.items() if impl != common)
    return f"{get_backend()} on {dev.type}: {rest + ', ' if rest else ''}others={common}"


# oneDNN (torch's CPU GEMMs) picks AMX on CPUs that list amx_bf16; on virtual machines that list the flag without
# enabling the AMX tile state, a bf16 matmul then dies with SIGILL. The engine caps oneDNN at AVX-512 BF16 (what AMD
# Zen4 runs anyway) unless the user chose an ISA (export ONEDNN_MAX_CPU_ISA=ALL where AMX works). oneDNN reads the
# variable at its first GEMM, so this must run before the model's first matmul.
ONEDNN_ISA_CAP = "AVX512_CORE_BF16"


def configure_cpu(threads: int | None = None) -> None:
    """The process settings the engine's CPU kernels need: the oneDNN ISA cap (unless the user set one) and, when
    given, torch's thread count. Called by the engine where it configures threads and when a model is built."""
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA_CAP)
    if threads is not None:
        torch.set_num_threads(threads)


def _panels_run(dtype: torch.dtype, device) -> bool:
    """Whether the linears of this dtype and device run on the native panels (unless another backend is forced)."""
    return get_backend() in ("auto", "native") and _linear_forms.panels_for(dtype, device)


class StepKernels:
    """The matmuls, attention and target log-prob of one model, in its mode, chosen here once:

    fast           linear weights prepacked once (kernels/linear.py: oneDNN's blocked layout on the CPU, fp32 in
                   the native op's panels on an AVX2 build),
                   the cascade attention over the step's new K/V and the shared cached segments.
    deterministic  the batch-invariant forms (kernels/batch_invariant.py): fixed-shape row tiles for matmuls and
                   the target log-prob, attention from the cache in fixed absolute KV chunks (merged by the native
                   op, the Triton kernel, or on the torch path by batch_invariant's fixed-shape torch form)."""

    def __init__(self, deterministic: bool = False):
        self.deterministic = deterministic
        configure_cpu()

    @staticmethod
    def thread_invariant(dtype: torch.dtype, device) -> bool:
        """Whether the deterministic mode's results are the same at any CPU thread count here: where its fp32 and
        bf16 linears run on the native panels (AVX2 builds), each output one FMA chain whatever the thread
        count; its attention computes each work item on one thread, the row-wise ops each row on one, and the
        target log-prob (the native op there) merges fixed vocabulary chunks in order; its top-k form's fixed
        [64 x 8192] fp32 tiles gave the same bits on 1 and 2 threads (tests/test_deterministic.py checks whole
        jobs). Elsewhere the GEMM's split of a row tile changes with the thread count, so the mode runs on a
        fixed one (Engine.load)."""
        return _panels_run(dtype, device)

    def weight(self, w: torch.Tensor):
        """The form of a linear weight that `linear` runs fastest in this mode: fp32 and bf16 CPU weights as the
        native op's panels where that was measured faster (kernels/linear.py), unless a backend other than the
        native ops is forced; otherwise oneDNN's packed copy in the fast mode, the plain weight in the
        deterministic one (the panels' rows are batch-invariant by construction, oneDNN's are not)."""
        if self.deterministic:  # the panels or the plain weight (prepack's probe may refuse the panels)
            return _prepack(w, panels=True) if _panels_run(w.dtype, w.device) else w
        return _prepack(w, panels=get_backend() in ("auto", "native"))

    def linear(self, x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.deterministic and not isinstance(w, Panels):
            return batch_invariant.linear(x, w, bias)
        return _packed_linear(x, w, bias)

    def attention(self, q, k_new, v_new, k_cache, v_cache, plan: AttentionPlan, scale, window=None):
        """One layer's attention of the step (the new K/V are already in the cache), from the step's
        AttentionPlan. Returns [T, H, D]. A sliding `window` (attention.AttentionWindow, Gemma-3's local layers)
        masks keys by absolute position in every backend and mode."""
        if self.deterministic:  # every key from the cache, in fixed absolute chunks
            merge = resolve("segment_attention_merge", q.device)
            if merge is segment_attention_merge_ref:  # the reference makes no invariance promise: its fixed-shape form
                merge = batch_invariant.segment_attention_merge
            waves = _wave_form(merge)
            return batch_invariant.cascade_attention(q, k_cache, v_cache, plan, scale, merge, window, waves=waves)
        return cascade_attention(q, k_new, v_new, k_cache, v_cache, plan, scale, window)

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        """Full-vocabulary logits of a few rows in the model's dtype, `head` as `weight` returned it."""
        return _packed_linear(hidden, head)

    def target_logprobs(self, hidden, weight, targets, top_k=0):
        """The fused LM head and target log-prob: in the deterministic mode the batch-invariant form, unless the
        native op runs (a row's result there is the same whatever the other rows, by construction)."""
        fn = resolve("target_logprobs", hidden.device)
        if self.deterministic and not (
            fn is native_ops.target_logprobs_native and native_ops.target_logprobs_native_runs(hidden, weight, top_k)
        ):
            return batch_invariant.target_logprobs(hidden, weight, targets, top_k)
        return fn(hidden, weight, targets, top_k)


def rms_norm(x, weight, eps, residual=None):
    return resolve("rms_norm", x.device)(x, weight, eps, residual)


def rope_store_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads):
    """(q, k, v) of a layer from its fused projection, q and k rotated, k and v stored in the cache: see
    rope.rope_store_kv_ref."""
    return resolve("rope_store_kv", qkv.device)(
        qkv, positions, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads
    )


def silu_and_mul(gate_up):
    return resolve("silu_and_mul", gate_up.device)(gate_up)


def cascade_attention(q, k_new, v_new, k_cache, v_cache, plan: AttentionPlan, scale, window=None):
    """The step's attention (attention.cascade_attention_ref): new tokens causally, then the cached segments."""
    return resolve("cascade_attention", q.device)(q, k_new, v_new, k_cache, v_cache, plan, scale, window)


def paged_decode_attention(q, k_cache, v_cache, table, lens, scale, window: int = 0):
    """A decode step's attention in fixed shapes, for a captured graph (attention.paged_decode_attention_ref)."""
    return resolve("paged_decode_attention", q.device)(q, k_cache, v_cache, table, lens, scale, window)


def segment_attention_merge(q, rows, k_cache, v_cache, slots, scale, out, lse, limits=None, starts=None):
    """The deterministic mode's attention step (kernels/batch_invariant.py): rows attend to cached slots, each from
    its start up to its limit, merged into their running (out, lse) in place."""
    return resolve("segment_attention_merge", q.device)(
        q, rows, k_cache, v_cache, slots, scale, out, lse, limits, starts
    )


def greedy_logprobs(logits):
    """(tokens, log-probs) of greedy decoding from logits [n, V]: see logprob.greedy_logprobs_ref."""
    return resolve("greedy_logprobs", logits.device)(logits)


def target_logprobs(hidden, weight, targets, top_k=0):
    """A LogProbs (log-prob and is_greedy per row, and with top_k > 0 the top ids and their log-probs): see
    logprob.target_logprobs_ref."""
    return resolve("target_logprobs", hidden.device)(hidden, weight, targets, top_k)
