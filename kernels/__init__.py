"""Hot ops of the engine. Each op has a torch reference (`*_ref`) beside its Triton kernel; `dispatch` picks
the implementation the engine calls."""
from .attention import cascade_attention_ref as cascade_attention
from .kv_store import store_kv_ref as store_kv
from .logprob import target_logprobs_ref as target_logprobs
from .rmsnorm import rms_norm_ref as rms_norm
from .rope import apply_rope_ref as apply_rope, rope_cos_sin
from .swiglu import silu_and_mul_ref as silu_and_mul

__all__ = ["cascade_attention", "store_kv", "target_logprobs", "rms_norm", "apply_rope", "rope_cos_sin",
           "silu_and_mul"]
