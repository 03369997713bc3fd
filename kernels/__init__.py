"""Hot ops of the engine. Each op has a torch reference (`*_ref`) beside its Triton kernel (`*_triton.py`), and
some a native CPU version (kernels/native, see native_ops.py); `dispatch` picks the implementation the engine
calls (ENGINE_KERNELS=auto|torch|triton|native or set_backend()) and logs which one runs. batch_invariant.py holds
the deterministic mode's forms of the step (fixed-shape matmuls, attention in fixed absolute KV chunks)."""
import os

# oneDNN (torch's CPU GEMMs) picks AMX on CPUs that list amx_bf16; on virtual machines that list the flag without
# enabling the AMX tile state, a bf16 matmul then dies with SIGILL. Cap oneDNN at AVX-512 BF16 (what AMD Zen4 runs
# anyway) unless the user chose an ISA: export ONEDNN_MAX_CPU_ISA=ALL on hardware where AMX works. oneDNN reads the
# variable at its first GEMM, so setting it here (before any model runs) is enough.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

from .dispatch import (apply_rope, cascade_attention, describe, get_backend, rms_norm, segment_attention_merge,  # noqa: E402
                       set_backend, silu_and_mul, store_kv, target_logprobs)
from .rope import rope_cos_sin  # noqa: E402

__all__ = ["cascade_attention", "segment_attention_merge", "store_kv", "target_logprobs", "rms_norm", "apply_rope",
           "rope_cos_sin", "silu_and_mul", "set_backend", "get_backend", "describe"]
