"""Hot ops of the engine. Each op has a torch reference (`*_ref`) beside its Triton kernel (`*_triton.py`), and
some a native CPU version (kernels/native, see native_ops.py); `dispatch` picks the implementation the engine
calls (ENGINE_KERNELS=auto|torch|triton|native or set_backend()) and logs which one runs. batch_invariant.py holds
the deterministic mode's forms of the step (fixed-shape matmuls, attention in fixed absolute KV chunks); the model
picks its mode once through dispatch.StepKernels. Importing the package changes no process setting
(dispatch.configure_cpu does, called by the engine)."""

from .attention import AttentionPlan, AttentionWindow, Segment
from .dispatch import (
    StepKernels,
    cascade_attention,
    configure_cpu,
    describe,
    get_backend,
    greedy_logprobs,
    paged_decode_attention,
    rms_norm,
    rope_store_kv,
    segment_attention_merge,
    set_backend,
    silu_and_mul,
    target_logprobs,
)
from .host import HostCopy, copy_to, index_ranges, to_device
from .logprob import LogProbs, TokenLogProb
from .rope import rope_cos_sin

__all__ = [
    "AttentionPlan",
    "AttentionWindow",
    "Segment",
    "LogProbs",
    "TokenLogProb",
    "StepKernels",
    "configure_cpu",
    "cascade_attention",
    "paged_decode_attention",
    "segment_attention_merge",
    "rope_store_kv",
    "target_logprobs",
    "greedy_logprobs",
    "rms_norm",
    "rope_cos_sin",
    "to_device",
    "copy_to",
    "HostCopy",
    "index_ranges",
    "silu_and_mul",
    "set_backend",
    "get_backend",
    "describe",
]
