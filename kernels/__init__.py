"""Hot ops of the engine. Each op has a torch reference (`*_ref`) beside its Triton kernel (`*_triton.py`), and
the attention ops a native CPU version (kernels/native, see native_ops.py); `dispatch` picks the implementation
the engine calls (ENGINE_KERNELS=auto|torch|triton|native or set_backend()). batch_invariant.py holds the
deterministic mode's forms of the step (fixed-shape matmuls, attention in fixed absolute KV chunks)."""
from .dispatch import (apply_rope, cascade_attention, dequantize, describe, get_backend, paged_prefill_attention,
                       rms_norm, segment_attention_merge, set_backend, silu_and_mul, store_kv, target_logprobs)
from .rope import rope_cos_sin

__all__ = ["cascade_attention", "segment_attention_merge", "paged_prefill_attention", "store_kv", "target_logprobs",
           "rms_norm", "apply_rope", "rope_cos_sin", "silu_and_mul", "dequantize", "set_backend", "get_backend",
           "describe"]
