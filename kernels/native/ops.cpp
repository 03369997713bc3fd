// The op library `icqs_native`: every op's schema, in one place (torch.ops.icqs_native.*, called through
// kernels/native_ops.py). Each op's CPU kernel is registered beside its code (TORCH_LIBRARY_IMPL):
//   attention.cpp  varlen_causal_attention, segment_attention_merge_, segments_attention_merge_
//   pointwise.cpp  rms_norm, rope_store_kv, silu_and_mul, greedy_logprobs
//   linear.cpp     linear_panels, target_logprobs, simd
#include <torch/library.h>

TORCH_LIBRARY(icqs_native, m) {
  m.def("varlen_causal_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, int window=0) "
        "-> (Tensor, Tensor)");
  m.def("segment_attention_merge_(Tensor q, Tensor rows, Tensor k_cache, Tensor v_cache, Tensor slots, "
        "float scale, Tensor(a!) out, Tensor(b!) lse, Tensor? limits=None, Tensor? starts=None) -> ()");
  m.def("segments_attention_merge_(Tensor q, Tensor rows_cat, Tensor row_off, Tensor k_cache, Tensor v_cache, "
        "Tensor slots_cat, Tensor slot_off, float scale, Tensor(a!) out, Tensor(b!) lse, Tensor? starts_cat=None) "
        "-> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor? residual) -> (Tensor, Tensor)");
  m.def("rope_store_kv(Tensor qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor slots, int num_heads, int num_kv_heads) -> (Tensor, Tensor, Tensor)");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("greedy_logprobs(Tensor logits) -> (Tensor, Tensor)");
  m.def("linear_panels(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor");
  m.def("target_logprobs(Tensor hidden, Tensor weight, Tensor targets) -> (Tensor, Tensor)");
  m.def("simd() -> str");
}
