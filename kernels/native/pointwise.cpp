// Native CPU row-wise ops of the Llama block, the torch ops `icqs_native::*` (schemas in ops.cpp): RMSNorm
// fused with the residual add, RoPE fused with the KV-cache store, SwiGLU, and greedy decoding's argmax with its
// log-prob. Each is one pass over its rows instead of the 2-9 ATen ops (each with its own allocation and parallel
// region) of the torch reference, which dominate when a step holds few tokens. Rounding follows the references:
// intermediate results are rounded to the tensor dtype where the reference computes in that dtype, so bf16
// outputs match the torch path.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>

#include "vec16.h"

namespace icqs {
namespace {

constexpr int64_t kGrainElems = 1 << 15;  // elements per thread below which a call stays on one thread

template <typename T>
inline T round_to(float x) { return static_cast<T>(x); }

int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, row_len)); }

template <typename T>
void rms_norm_rows(const T* x, const T* res, const T* w, T* out, T* sum, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(n + kLanes);
    for (int64_t r = r0; r < r1; ++r) {
      V16 ss = V16::zero();
      for (int64_t i = 0; i < n; i += kLanes) {
        const int c = int(std::min<int64_t>(kLanes, n - i));
        V16 v = load_as_float(x + r * n + i, c);
        if (res) {  // the sum is rounded to T, as the reference adds in T
          v = round_as<T>(v + load_as_float(res + r * n + i, c));
          store_as(v, sum + r * n + i, c);
        }
        v.store(&buf[i]);
        ss = fma(v, v, ss);
      }
      const V16 rstd = V16::set1(1.f / std::sqrt(ss.sum() / float(n) + eps));
      for (int64_t i = 0; i < n; i += kLanes) {
        const int c = int(std::min<int64_t>(kLanes, n - i));
        const V16 normed = round_as<T>(V16::load(&buf[i]) * rstd);
        store_as(load_as_float(w + i, c) * normed, out + r * n + i, c);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && weight.is_contiguous(), "expected contiguous CPU tensors");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and x dtypes differ");
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  TORCH_CHECK(weight.numel() == n, "weight does not match the last dimension");
  const bool has_res = residual.has_value() && residual->defined();
  if (has_res)
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous() &&
                residual->scalar_type() == x.scalar_type(), "residual must be like x");
  auto out = at::empty_like(x);
  auto sum = has_res ? at::empty_like(x) : at::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), has_res ? residual->data_ptr<scalar_t>() : nullptr,
                            weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                            has_res ? sum.data_ptr<scalar_t>() : nullptr, rows, n, float(eps));
  });
  return {out, sum};
}

// x * cos + rotate_half(x) * sin of `heads` rows of D values at src, written at dst; each product and the sum
// rounded to T as the reference computes them in T.
template <typename T>
void rope_heads(const T* src, T* dst, int64_t heads, int64_t D, const float* c, const float* s) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* x = src + h * D;
    T* y = dst + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[i + half]);
      const float c1 = static_cast<float>(round_to<T>(c[i])), c2 = static_cast<float>(round_to<T>(c[i + half]));
      const float s1 = static_cast<float>(round_to<T>(s[i])), s2 = static_cast<float>(round_to<T>(s[i + half]));
      const float a1 = static_cast<float>(round_to<T>(x1 * c1)), b1 = static_cast<float>(round_to<T>(-x2 * s1));
      const float a2 = static_cast<float>(round_to<T>(x2 * c2)), b2 = static_cast<float>(round_to<T>(x1 * s2));
      y[i] = round_to<T>(a1 + b1);
      y[i + half] = round_to<T>(a2 + b2);
    }
  }
}

// A layer's attention inputs from its fused q/k/v projection, in one pass over each token's row: q and k rotated
// into contiguous [T, H, D] / [T, Hkv, D] tensors, v copied out, and k, v written into the cache at the token's
// slot (the reference: split, two copies, RoPE in place, two index_copy_ calls).
std::tuple<at::Tensor, at::Tensor, at::Tensor> rope_store_kv(const at::Tensor& qkv, const at::Tensor& positions,
                                                             const at::Tensor& cos, const at::Tensor& sin,
                                                             const at::Tensor& k_cache, const at::Tensor& v_cache,
                                                             const at::Tensor& slots, int64_t num_heads,
                                                             int64_t num_kv_heads) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 2 && (qkv.size(0) <= 1 || qkv.stride(1) == 1),
              "qkv: CPU [T, (H + 2 Hkv) * D] with contiguous rows");
  const int64_t T = qkv.size(0), H = num_heads, Hkv = num_kv_heads;
  TORCH_CHECK(H > 0 && Hkv > 0 && qkv.size(1) % (H + 2 * Hkv) == 0, "qkv width is not (H + 2 Hkv) * head_dim");
  const int64_t D = qkv.size(1) / (H + 2 * Hkv);
  TORCH_CHECK(D % 2 == 0, "head_dim must be even");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.size(1) == Hkv &&
              k_cache.size(2) == D && v_cache.sizes() == k_cache.sizes(), "caches: contiguous [slots, Hkv, D]");
  TORCH_CHECK(k_cache.scalar_type() == qkv.scalar_type() && v_cache.scalar_type() == qkv.scalar_type(),
              "the cache dtype differs from qkv's");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos/sin tables must be fp32");
  const auto pos = positions.to(at::kLong).contiguous(), sl = slots.to(at::kLong).contiguous();
  const auto c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(pos.numel() == T && sl.numel() == T, "positions and slots must have one entry per token");
  TORCH_CHECK(c.size(1) == D && s.size(1) == D, "cos/sin tables do not match head_dim");
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t max_pos = c.size(0), num_slots = k_cache.size(0);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos, "position out of the rope table");
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot out of the cache");
  }
  auto q = at::empty({T, H, D}, qkv.options()), k = at::empty({T, Hkv, D}, qkv.options()),
       v = at::empty({T, Hkv, D}, qkv.options());
  const int64_t row_stride = T > 0 ? qkv.stride(0) : 0, kv_row = Hkv * D;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_store_kv", [&] {
    const scalar_t* src = qkv.data_ptr<scalar_t>();
    scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    scalar_t *kc = k_cache.data_ptr<scalar_t>(), *vc = v_cache.data_ptr<scalar_t>();
    const float* cp = c.data_ptr<float>();
    const float* snp = s.data_ptr<float>();
    at::parallel_for(0, T, row_grain((H + 2 * Hkv) * D), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const scalar_t* row = src + t * row_stride;
        const float *ct = cp + pp[t] * D, *st = snp + pp[t] * D;
        rope_heads(row, qp + t * H * D, H, D, ct, st);
        rope_heads(row + H * D, kp + t * kv_row, Hkv, D, ct, st);
        std::memcpy(vp + t * kv_row, row + (H + Hkv) * D, kv_row * sizeof(scalar_t));
        std::memcpy(kc + sp[t] * kv_row, kp + t * kv_row, kv_row * sizeof(scalar_t));
        std::memcpy(vc + sp[t] * kv_row, vp + t * kv_row, kv_row * sizeof(scalar_t));
      }
    });
  });
  return {q, k, v};
}

// silu(gate) rounded to T (F.silu's output), times up, rounded to T.
template <typename T>
void silu_mul_rows(const T* gu, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, row_grain(2 * inter), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = gu + r * 2 * inter;
      const T* up = gate + inter;
      for (int64_t i = 0; i < inter; i += kLanes) {
        const int c = int(std::min<int64_t>(kLanes, inter - i));
        const V16 g = load_as_float(gate + i, c);
        const V16 silu = round_as<T>(g / (V16::set1(1.f) + (g * V16::set1(-kLog2e)).exp2()));
        store_as(silu * load_as_float(up + i, c), out + r * inter + i, c);
      }
    }
  });
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.is_contiguous() && gate_up.size(-1) % 2 == 0,
              "gate_up: contiguous CPU [..., 2 * intermediate]");
  const int64_t inter = gate_up.size(-1) / 2, rows = gate_up.numel() / std::max<int64_t>(1, 2 * inter);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = inter;
  auto out = at::empty(sizes, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_and_mul", [&] {
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, inter);
  });
  return out;
}

// Greedy decoding's row-wise part: per row of logits, the first index of the largest value and its log-prob
// under log-softmax (-log sum exp(x - max)), in fp32, in two reads of the row and no [rows x vocab] output
// (the reference needs argmax, a log-softmax written out and a gather: four passes and two copies).
template <typename T>
void greedy_rows(const T* x, int64_t* tok, float* lp, int64_t rows, int64_t V) {
  at::parallel_for(0, rows, row_grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * V;
      float best = kNegInf;
      int64_t arg = 0;
#if defined(__AVX512F__)
      __m512 vbest = _mm512_set1_ps(kNegInf);
      __m512i varg = _mm512_setzero_si512();
      __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i step = _mm512_set1_epi32(kLanes);
      int64_t i = 0;
      for (; i + kLanes <= V && i + kLanes <= (int64_t(1) << 31); i += kLanes) {
        const __m512 v = load_as_float(row + i, kLanes).v;
        const __mmask16 gt = _mm512_cmp_ps_mask(v, vbest, _CMP_GT_OQ);  // strictly greater: first index per lane
        vbest = _mm512_mask_blend_ps(gt, vbest, v);
        varg = _mm512_mask_blend_epi32(gt, varg, idx);
        idx = _mm512_add_epi32(idx, step);
      }
      alignas(64) float bv[kLanes];
      alignas(64) int32_t bi[kLanes];
      _mm512_store_ps(bv, vbest);
      _mm512_store_si512(bi, varg);
      for (int l = 0; l < kLanes; ++l)
        if (bv[l] > best || (bv[l] == best && bi[l] < arg)) best = bv[l], arg = bi[l];
      for (; i < V; ++i) {
        const float v = static_cast<float>(row[i]);
        if (v > best) best = v, arg = i;
      }
#else
      for (int64_t i = 0; i < V; ++i) {
        const float v = static_cast<float>(row[i]);
        if (v > best) best = v, arg = i;
      }
#endif
      tok[r] = arg;
      lp[r] = -std::log(sum_exp(row, V, best));
    }
  });
}

std::tuple<at::Tensor, at::Tensor> greedy_logprobs(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous(),
              "logits: contiguous CPU [rows, vocab]");
  TORCH_CHECK(logits.size(1) > 0, "an empty vocabulary");
  const int64_t rows = logits.size(0), V = logits.size(1);
  auto tok = at::empty({rows}, logits.options().dtype(at::kLong));
  auto lp = at::empty({rows}, logits.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "greedy_logprobs", [&] {
    greedy_rows<scalar_t>(logits.data_ptr<scalar_t>(), tok.data_ptr<int64_t>(), lp.data_ptr<float>(), rows, V);
  });
  return {tok, lp};
}

}  // namespace
}  // namespace icqs

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("rms_norm", &icqs::rms_norm);
  m.impl("rope_store_kv", &icqs::rope_store_kv);
  m.impl("silu_and_mul", &icqs::silu_and_mul);
  m.impl("greedy_logprobs", &icqs::greedy_logprobs);
}
