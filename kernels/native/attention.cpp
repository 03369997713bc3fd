// Native CPU attention over the paged KV cache: the ops `icqs_native::*` below (schemas in ops.cpp).
//
// Keys and values are read in place, row by row (through slot indices for the cache): no gathered copy of the
// cache is made. A work item is one KV head and a block of query tokens; its
// queries (tokens x the heads of the GQA group) sweep the keys in tiles of 32 with an online softmax in fp32,
// in the log2 domain. Each tile is packed into a small buffer (K transposed), then a 6-query x 32-key
// register-blocked micro-kernel (attention_fp32.h, attention_avx512bf16.h) computes the scores and the P.V update:
//   - bf16 inputs on a CPU with AVX512_BF16 (head_dim a multiple of 16): bf16 dot products with fp32
//     accumulation (vdpbf16ps), K packed as pairs of dimensions, V as pairs of keys, P rounded to bf16 for P.V
//     as the torch reference does; twice the fp32 FMA rate;
//   - otherwise fp32 FMAs on tiles converted to fp32 (vec16.h).
// Every query vector sees a range of the keys [first, last] (causal limits, a sliding window's lower bound);
// the keys it does not see contribute exact zeros. Work items run in parallel under OpenMP.
//
//   varlen_causal_attention: the new tokens of many sequences, packed back to back, attend causally to
//       themselves (the cascade's self part); `window` > 0 masks keys `window` or more rows before the query.
//   segment_attention_merge_: stacked queries of the sequences below one cached segment attend to it, merged
//       in place into running (out, lse) by log-sum-exp (the online softmax started from that state).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_avx512bf16.h"
#include "attention_fp32.h"
#include "attention_tile.h"

namespace icqs {
namespace {

constexpr float kLn2 = 0.6931471805599453f;
constexpr int kRowsPerItem = 192;  // query vectors (tokens x group heads) per work item

// Sweeps the keys for all query vectors in tiles of kNB, from the first key anyone sees to the last. A vector's
// result depends only on its query, its keys and its visible range: the keys it does not see contribute exact
// zeros, so the other vectors of the work item never change it.
template <typename T>
void sweep(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const Visible& vis) {
  int64_t first = keys.n, last = 0;  // exclusive end
  for (int r = 0; r < s.M; ++r) {
    const int64_t lo = vis.lo(r), hi = vis.hi(r, keys.n);
    if (lo < hi) first = std::min(first, lo), last = std::max(last, hi);
  }
  // tiles at fixed offsets (multiples of kNB from key 0), whichever rows share the item: a row's arithmetic
  // depends on its own keys only (the deterministic mode's batch invariance)
  for (int64_t j0 = first / kNB * kNB; j0 < last; j0 += kNB) {
    const int nb = int(std::min<int64_t>(kNB, keys.n - j0));
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (s.bf16) pack_tile_bf16(s, keys, j0, nb, row_stride, kh);
      else pack_tile(s, keys, j0, nb, row_stride, kh);
    } else {
      pack_tile(s, keys, j0, nb, row_stride, kh);
    }
#else
    pack_tile(s, keys, j0, nb, row_stride, kh);
#endif
    for (int r0 = 0; r0 < s.M; r0 += kMR) {
      int lo[kMR], hi[kMR];
      bool any = false;
      for (int i = 0; i < kMR; ++i) {
        const int r = r0 + i;
        lo[i] = hi[i] = 0;
        if (r < s.M) {
          lo[i] = int(std::clamp<int64_t>(vis.lo(r) - j0, 0, nb));
          hi[i] = int(std::clamp<int64_t>(vis.hi(r, keys.n) - j0, 0, nb));
        }
        any |= hi[i] > lo[i];
      }
      if (!any) continue;
#if defined(__AVX512BF16__)
      if (s.bf16) { tile_rows_bf16(s, r0, nb, lo, hi); continue; }
#endif
      tile_rows(s, r0, nb, lo, hi);
    }
  }
}

template <typename T>
void sweep_any(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const Visible& vis, bool direct) {
  if (direct && s.M <= kMR) {
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (s.bf16 && s.D % 32 == 0) return sweep_direct_bf16(s, keys, row_stride, kh, vis);
    }
#endif
    sweep_direct(s, keys, row_stride, kh, vis);
  } else {
    sweep(s, keys, row_stride, kh, vis);
  }
}

// Whether items of this dtype and head size use the bf16 dot-product micro-kernel.
template <typename T>
bool use_bf16(int64_t D) {
  return kBf16Dot && std::is_same_v<T, c10::BFloat16> && D % kLanes == 0 && D <= 512;
}

// Writes vector r's normalised output (fp32, D values) and natural-log lse.
void finish(const State& s, int r, float* out, float* lse) {
  const float l = V16::load(&s.l[size_t(r) * kLanes]).sum();
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int d = 0; d < s.D; ++d) out[d] = s.acc[size_t(r) * s.DP + d] * inv;
  *lse = l > 0.f ? (s.m[r] + std::log2(l)) * kLn2 : kNegInf;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "expected CPU [T, H, D] tensors");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "q, k, v must be contiguous");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == q.size(2), "k/v shapes do not match q");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(2) <= 512, "head_dim above 512 is not supported");
}

using Item = std::array<int64_t, 4>;  // (sequence or segment, first row, end row, kv head)

// Rows lo..hi-1 in blocks of at most tb, of equal sizes (a remainder of a few rows would sweep every key on its
// own), times the KV heads.
void add_items(std::vector<Item>& items, int64_t id, int64_t lo, int64_t hi, int64_t tb, int64_t Hkv) {
  if (hi <= lo) return;
  const int64_t nblk = (hi - lo + tb - 1) / tb, size = (hi - lo + nblk - 1) / nblk;
  for (int64_t r0 = lo; r0 < hi; r0 += size)
    for (int64_t kh = 0; kh < Hkv; ++kh) items.push_back({id, r0, std::min(hi, r0 + size), kh});
}

// window > 0: the new token t of sequence b (row t - cu[b] of its own) sees its own rows > t - cu[b] - window.
template <typename T>
void varlen_items(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const int64_t* cup,
                  const std::vector<Item>& items, double scale, int64_t window, at::Tensor& out, at::Tensor& lse) {
  const int64_t H = q.size(1), Hkv = k.size(1), D = q.size(2), g = H / Hkv;
  const T* qp = q.data_ptr<T>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const bool bf16 = use_bf16<T>(D);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < int64_t(items.size()); ++it) {
    const auto [b, t0, t1, kh] = items[it];
    if (cup[b + 1] - cup[b] == 1) {  // a lone token (a decode step's self part): its only key is itself, so
      const T* kr = k.data_ptr<T>() + (t0 * Hkv + kh) * D;  // out = v and lse = its score
      const T* vr = v.data_ptr<T>() + (t0 * Hkv + kh) * D;
      for (int64_t h = kh * g; h < (kh + 1) * g; ++h) {
        const T* qr = qp + (t0 * H + h) * D;
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<float>(qr[d]) * static_cast<float>(kr[d]);
        lp[t0 * H + h] = dot * float(scale);
        for (int64_t d = 0; d < D; ++d) op[(t0 * H + h) * D + d] = static_cast<float>(vr[d]);
      }
      continue;
    }
    thread_local State s;
    thread_local std::vector<int64_t> own_first, own_last;
    s.reset(int((t1 - t0) * g), int(D), bf16);
    own_last.resize(s.M);
    own_first.resize(window > 0 ? s.M : 0);
    for (int r = 0; r < s.M; ++r) {
      const int64_t t = t0 + r / g, h = kh * g + r % g;
      s.load_query(r, qp + (t * H + h) * D, float(scale));
      own_last[r] = t - cup[b];
      if (window > 0) own_first[r] = t - cup[b] - window + 1;
    }
    const Keys<T> own{k.data_ptr<T>(), v.data_ptr<T>(), nullptr, cup[b], t1 - cup[b]};
    sweep_any(s, own, Hkv * D, kh, Visible{window > 0 ? &own_first : nullptr, &own_last}, true);
    for (int r = 0; r < s.M; ++r) {
      const int64_t t = t0 + r / g, h = kh * g + r % g;
      finish(s, r, op + (t * H + h) * D, lp + t * H + h);
    }
  }
}

// One work item of a segment: rows rp[i0..i1) (query vectors of KV head kh) attend to the segment's keys,
// starting from and merged into their running (out, lse) state. first/last (optional, per row): the range of
// the segment's keys each row sees.
template <typename T>
void segment_item(const at::Tensor& q, int64_t Hkv, const int64_t* rp, int64_t i0, int64_t i1, int64_t kh,
                  const Keys<T>& keys, const int64_t* first, const int64_t* last, double scale, float* op, float* lp,
                  bool direct) {
  const int64_t H = q.size(1), D = q.size(2), g = H / Hkv;
  const T* qp = q.data_ptr<T>();
  thread_local State s;
  thread_local std::vector<int64_t> row_first, row_last;
  s.reset(int((i1 - i0) * g), int(D), use_bf16<T>(D));
  row_first.resize(first ? s.M : 0);
  row_last.resize(last ? s.M : 0);
  for (int r = 0; r < s.M; ++r) {  // start from the running state: m = lse, l = 1, acc = out
    const int64_t t = rp[i0 + r / g], h = kh * g + r % g;
    s.load_query(r, qp + (t * H + h) * D, float(scale));
    s.m[r] = lp[t * H + h] * kLog2e;
    s.l[size_t(r) * kLanes] = 1.f;
    std::copy(op + (t * H + h) * D, op + (t * H + h + 1) * D, &s.acc[size_t(r) * s.DP]);
    if (first) row_first[r] = first[i0 + r / g];
    if (last) row_last[r] = last[i0 + r / g];
  }
  sweep_any(s, keys, Hkv * D, kh, Visible{first ? &row_first : nullptr, last ? &row_last : nullptr}, direct);
  for (int r = 0; r < s.M; ++r) {
    const int64_t t = rp[i0 + r / g], h = kh * g + r % g;
    finish(s, r, op + (t * H + h) * D, lp + t * H + h);
  }
}

// Segments whose row sets are disjoint, all in one parallel loop over (segment, row block, KV head) items:
// segment i is rows rp[ro[i]..ro[i+1]) and slots sp[so[i]..so[i+1]); first/last (optional) run beside rp.
template <typename T>
void segments_items(const at::Tensor& q, const int64_t* rp, const int64_t* ro, const at::Tensor& k_cache,
                    const at::Tensor& v_cache, const int64_t* sp, const int64_t* so, int64_t nseg,
                    const int64_t* first, const int64_t* last, int64_t tb, double scale, float* op, float* lp,
                    bool direct) {
  const int64_t Hkv = k_cache.size(1);
  std::vector<Item> items;
  for (int64_t i = 0; i < nseg; ++i)
    if (so[i + 1] > so[i]) add_items(items, i, ro[i], ro[i + 1], tb, Hkv);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < int64_t(items.size()); ++it) {
    const auto [i, r0, r1, kh] = items[it];
    const Keys<T> keys{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), sp + so[i], 0, so[i + 1] - so[i]};
    segment_item<T>(q, Hkv, rp, r0, r1, kh, keys, first, last, scale, op, lp, direct);
  }
}

std::tuple<at::Tensor, at::Tensor> varlen_causal_attention(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const at::Tensor& cu_seqlens,
                                                             double scale, int64_t window) {
  check_qkv(q, k, v);
  const int64_t T = q.size(0), H = q.size(1), Hkv = k.size(1), D = q.size(2), g = H / Hkv;
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none)");
  const auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t B = cu.numel() - 1;
  const int64_t* cup = cu.data_ptr<int64_t>();
  TORCH_CHECK(B >= 0 && cup[0] == 0 && cup[B] == T && k.size(0) == T, "cu_seqlens must run from 0 to q's rows");
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(cup[b] <= cup[b + 1], "cu_seqlens must not decrease");
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / g);
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) add_items(items, b, cup[b], cup[b + 1], tb, Hkv);
  auto out = at::empty({T, H, D}, q.options().dtype(at::kFloat));
  auto lse = at::empty({T, H}, q.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "varlen_causal_attention", [&] {
    varlen_items<scalar_t>(q, k, v, cup, items, scale, window, out, lse);
  });
  return {out, lse};
}

void check_out(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat, "out and lse must be fp32");
  TORCH_CHECK(out.is_contiguous() && lse.is_contiguous() && out.sizes() == q.sizes(), "out must be like q");
}

// One int64 entry per row, or an undefined tensor.
at::Tensor per_row(const std::optional<at::Tensor>& x, int64_t rows, const char* name) {
  if (!x.has_value()) return at::Tensor();
  auto t = x->to(at::kLong).contiguous();
  TORCH_CHECK(t.numel() == rows, name, " must hold one entry per row");
  return t;
}

const int64_t* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<int64_t>() : nullptr; }

// limits (optional, [R]): the last index into `slots` each row may see (keys after it are masked);
// starts (optional, [R]): the first (keys before it are masked).
void segment_attention_merge_(const at::Tensor& q, const at::Tensor& rows, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& slots, double scale,
                              const at::Tensor& out, const at::Tensor& lse,
                              const std::optional<at::Tensor>& limits, const std::optional<at::Tensor>& starts) {
  check_qkv(q, k_cache, v_cache);
  check_out(q, out, lse);
  const int64_t g = q.size(1) / k_cache.size(1);
  const auto rw = rows.to(at::kLong).contiguous();
  const auto sl = slots.to(at::kLong).contiguous();
  const int64_t R = rw.numel();
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / g);
  const auto lm = per_row(limits, R, "limits"), st = per_row(starts, R, "starts");
  const int64_t ro[2] = {0, R}, so[2] = {0, sl.numel()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "segment_attention_merge_", [&] {
    segments_items<scalar_t>(q, rw.data_ptr<int64_t>(), ro, k_cache, v_cache, sl.data_ptr<int64_t>(), so, 1,
                             ptr_or_null(st), ptr_or_null(lm), tb, scale, out.data_ptr<float>(),
                             lse.data_ptr<float>(), /*direct=*/false);
  });
}

// Many segments in one call (a wave of the cascade): rows_cat/row_off and slots_cat/slot_off hold segment i's
// rows and slots; no two segments of one call may share a row (each row's merges stay in its caller's order).
// starts_cat (optional, beside rows_cat): the first index into its segment's slots each row may see.
void segments_attention_merge_(const at::Tensor& q, const at::Tensor& rows_cat, const at::Tensor& row_off,
                               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots_cat,
                               const at::Tensor& slot_off, double scale, const at::Tensor& out, const at::Tensor& lse,
                               const std::optional<at::Tensor>& starts_cat) {
  check_qkv(q, k_cache, v_cache);
  check_out(q, out, lse);
  const auto rw = rows_cat.to(at::kLong).contiguous(), ro = row_off.to(at::kLong).contiguous();
  const auto sl = slots_cat.to(at::kLong).contiguous(), so = slot_off.to(at::kLong).contiguous();
  const int64_t nseg = ro.numel() - 1;
  TORCH_CHECK(nseg >= 0 && so.numel() == nseg + 1, "row_off and slot_off must both hold one entry per segment + 1");
  TORCH_CHECK(ro.data_ptr<int64_t>()[nseg] == rw.numel() && so.data_ptr<int64_t>()[nseg] == sl.numel(),
              "offsets do not end at the concatenated lengths");
  const auto st = per_row(starts_cat, rw.numel(), "starts_cat");
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / (q.size(1) / k_cache.size(1)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "segments_attention_merge_", [&] {
    segments_items<scalar_t>(q, rw.data_ptr<int64_t>(), ro.data_ptr<int64_t>(), k_cache, v_cache,
                             sl.data_ptr<int64_t>(), so.data_ptr<int64_t>(), nseg, ptr_or_null(st), nullptr, tb,
                             scale, out.data_ptr<float>(), lse.data_ptr<float>(), /*direct=*/true);
  });
}

}  // namespace
}  // namespace icqs

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("varlen_causal_attention", &icqs::varlen_causal_attention);
  m.impl("segment_attention_merge_", &icqs::segment_attention_merge_);
  m.impl("segments_attention_merge_", &icqs::segments_attention_merge_);
}
