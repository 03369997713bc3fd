// Native CPU attention over the paged KV cache, registered as torch ops `icqs_native::*`.
//
// Keys and values are read in place, row by row, through slot indices (the block table resolved to slots):
// no gathered copy of the cache is made. A work item is one KV head and a block of query tokens; its
// queries (tokens x the heads of the GQA group) sweep the keys in tiles of 32 with an online softmax in fp32,
// in the log2 domain (scores pre-multiplied by log2(e)). Each tile is converted to fp32 into a small buffer (K
// transposed), then a 6-query x 32-key register-blocked micro-kernel computes scores and the P.V update with
// AVX-512 FMAs (vec16.h). Work items run in parallel under OpenMP.
//
//   paged_prefill_attention: new tokens of many sequences attend causally to themselves and to their cached
//       prefix read through the block table (the cascade's self part is the same op with empty prefixes).
//   segment_attention_merge_: stacked queries of the sequences below one cached segment attend to it, merged
//       in place into running (out, lse) by log-sum-exp (the online softmax started from that state).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "vec16.h"

namespace icqs {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kRowsPerItem = 192;  // query vectors (tokens x group heads) per work item
constexpr int kMR = 6;            // query vectors computed together in the micro-kernel
constexpr int kNB = 2 * kLanes;   // keys per tile

// Keys of one work item: key j lives at token row `idx ? idx[j] : base + j` of k/v ([rows, Hkv, D]).
template <typename T>
struct Keys {
  const T* k;
  const T* v;
  const int64_t* idx;
  int64_t base;
  int64_t n;
};

// Online-softmax state of M query vectors padded to DP lanes: Q pre-scaled, running max m (log2 domain),
// running sum l, unnormalised accumulator acc; and the fp32 tile buffers.
// One per thread, reused by every work item (reset() keeps the buffers' capacity: no allocation per item, which
// dominated decode steps of many one-token sequences).
struct State {
  int M = 0, D = 0, DP = 0;
  std::vector<float> q, acc, m, l, kt, vt;
  void reset(int M_, int D_) {
    M = M_, D = D_, DP = (D_ + kLanes - 1) / kLanes * kLanes;
    const int Mp = (M + kMR - 1) / kMR * kMR;
    q.assign(size_t(Mp) * DP, 0.f);
    acc.assign(size_t(Mp) * DP, 0.f);
    m.assign(Mp, kNegInf);
    l.assign(Mp, 0.f);
    kt.resize(size_t(DP) * kNB);  // pack_tile writes every entry tile_rows reads (zeros past the tile's keys)
    if (DP == D) vt.resize(size_t(kNB) * DP);
    else vt.assign(size_t(kNB) * DP, 0.f);  // the padding columns past D stay zero
  }
  template <typename T>
  void load_query(int r, const T* src, float scale) {
    float* dst = &q[size_t(r) * DP];
    to_float(src, dst, D);
    for (int d = 0; d < D; ++d) dst[d] *= scale * kLog2e;
  }
};

// Packs keys j0..j0+nb-1 of head kh: K transposed to kt[d][j], V row-major vt[j][d], both fp32, zero padded.
template <typename T>
void pack_tile(State& s, const Keys<T>& keys, int64_t j0, int nb, int64_t row_stride, int64_t kh) {
  float row[512 + kLanes];
  if (nb < kNB) std::fill(s.kt.begin(), s.kt.end(), 0.f);
  for (int j = 0; j < kNB; ++j) {
    float* vrow = &s.vt[size_t(j) * s.DP];
    if (j >= nb) { std::fill(vrow, vrow + s.DP, 0.f); continue; }
    const int64_t tok = keys.idx ? keys.idx[j0 + j] : keys.base + j0 + j;
    const int64_t off = tok * row_stride + kh * s.D;
    to_float(keys.k + off, row, s.D);
    for (int d = 0; d < s.D; ++d) s.kt[size_t(d) * kNB + j] = row[d];
    to_float(keys.v + off, vrow, s.D);
  }
}

// One tile for query vectors r0..r0+kMR-1; cnt[i]: how many of the tile's keys vector i sees.
void tile_rows(State& s, int r0, int nb, const int* cnt) {
  V16 s0[kMR], s1[kMR];
  for (int i = 0; i < kMR; ++i) s0[i] = s1[i] = V16::zero();
  const float* q0 = &s.q[size_t(r0) * s.DP];
  for (int d = 0; d < s.D; ++d) {
    const V16 k0 = V16::load(&s.kt[size_t(d) * kNB]), k1 = V16::load(&s.kt[size_t(d) * kNB + kLanes]);
    for (int i = 0; i < kMR; ++i) {
      const V16 b = V16::set1(q0[size_t(i) * s.DP + d]);
      s0[i] = fma(b, k0, s0[i]);
      s1[i] = fma(b, k1, s1[i]);
    }
  }
  alignas(64) float p[kMR][kNB];
  alignas(64) float diff[kLanes] = {0.f};
  float tile_sum[kMR] = {0.f};
  for (int i = 0; i < kMR; ++i) {
    const int r = r0 + i;
    if (cnt[i] == 0) { std::fill(p[i], p[i] + kNB, 0.f); continue; }
    const V16 a = s0[i].keep_first(cnt[i]), b = s1[i].keep_first(cnt[i] - kLanes);
    const float mnew = std::max(s.m[r], a.max(b).max());
    const V16 pa = (a - V16::set1(mnew)).exp2(), pb = (b - V16::set1(mnew)).exp2();
    pa.store(p[i]);
    pb.store(p[i] + kLanes);
    diff[i] = s.m[r] - mnew;
    s.m[r] = mnew;
    tile_sum[i] = (pa + pb).sum();
  }
  alignas(64) float corr[kLanes];
  V16::load(diff).exp2().store(corr);
  for (int i = 0; i < kMR; ++i) s.l[r0 + i] = s.l[r0 + i] * corr[i] + tile_sum[i];
  for (int dv = 0; dv < s.DP; dv += kLanes) {
    V16 a[kMR];
    for (int i = 0; i < kMR; ++i) a[i] = V16::load(&s.acc[size_t(r0 + i) * s.DP + dv]) * V16::set1(corr[i]);
    for (int j = 0; j < nb; ++j) {
      const V16 v = V16::load(&s.vt[size_t(j) * s.DP + dv]);
      for (int i = 0; i < kMR; ++i) a[i] = fma(V16::set1(p[i][j]), v, a[i]);
    }
    for (int i = 0; i < kMR; ++i) a[i].store(&s.acc[size_t(r0 + i) * s.DP + dv]);
  }
}

// Sweeps all keys for all query vectors in tiles of kNB from key 0. limit[r] (optional): the last key index
// vector r may see (causal). A vector's result depends only on its query, its keys and its limit: the keys it
// does not see contribute exact zeros, so the other vectors of the work item never change it.
template <typename T>
void sweep(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const std::vector<int64_t>* limit) {
  const int64_t last = limit ? *std::max_element(limit->begin(), limit->end()) : keys.n;
  for (int64_t j0 = 0; j0 < keys.n; j0 += kNB) {
    const int nb = int(std::min<int64_t>(kNB, keys.n - j0));
    if (last < j0) break;  // nobody sees this tile or later ones
    pack_tile(s, keys, j0, nb, row_stride, kh);
    for (int r0 = 0; r0 < s.M; r0 += kMR) {
      int cnt[kMR];
      bool any = false;
      for (int i = 0; i < kMR; ++i) {
        const int r = r0 + i;
        int64_t c = r < s.M ? nb : 0;
        if (limit && r < s.M) c = std::min<int64_t>(c, (*limit)[r] - j0 + 1);
        cnt[i] = int(std::max<int64_t>(c, 0));
        any |= cnt[i] > 0;
      }
      if (any) tile_rows(s, r0, nb, cnt);
    }
  }
}

// The same sweep key by key, for items of few query vectors (kMR or fewer: a decode step's token): packing
// 32-key tiles to fp32 costs more than such an item's arithmetic.
template <typename T>
void sweep_direct(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const std::vector<int64_t>* limit) {
  const int64_t last = limit ? *std::max_element(limit->begin(), limit->end()) : keys.n - 1;
  float* kr = s.kt.data();  // one key and one value row in fp32, zero padded to DP
  float* vr = s.vt.data();
  std::fill(kr, kr + s.DP, 0.f);
  std::fill(vr, vr + s.DP, 0.f);
  for (int64_t j = 0; j < keys.n && j <= last; ++j) {
    const int64_t off = (keys.idx ? keys.idx[j] : keys.base + j) * row_stride + kh * s.D;
    to_float(keys.k + off, kr, s.D);
    to_float(keys.v + off, vr, s.D);
    for (int r = 0; r < s.M; ++r) {
      if (limit && j > (*limit)[r]) continue;
      const float* q = &s.q[size_t(r) * s.DP];
      V16 dot = V16::zero();
      for (int d = 0; d < s.DP; d += kLanes) dot = fma(V16::load(q + d), V16::load(kr + d), dot);
      const float score = dot.sum(), mnew = std::max(s.m[r], score);
      const float corr = std::exp2(s.m[r] - mnew), p = std::exp2(score - mnew);
      s.m[r] = mnew;
      s.l[r] = s.l[r] * corr + p;
      float* acc = &s.acc[size_t(r) * s.DP];
      for (int d = 0; d < s.DP; d += kLanes)
        fma(V16::set1(p), V16::load(vr + d), V16::load(acc + d) * V16::set1(corr)).store(acc + d);
    }
  }
}

template <typename T>
void sweep_any(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const std::vector<int64_t>* limit,
               bool direct) {
  if (direct && s.M <= kMR) sweep_direct(s, keys, row_stride, kh, limit);
  else sweep(s, keys, row_stride, kh, limit);
}

// Writes vector r's normalised output (fp32, D values) and natural-log lse.
void finish(const State& s, int r, float* out, float* lse) {
  const float inv = s.l[r] > 0.f ? 1.f / s.l[r] : 0.f;
  for (int d = 0; d < s.D; ++d) out[d] = s.acc[size_t(r) * s.DP + d] * inv;
  *lse = s.l[r] > 0.f ? (s.m[r] + std::log2(s.l[r])) * kLn2 : kNegInf;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "expected CPU [T, H, D] tensors");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "q, k, v must be contiguous");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == q.size(2), "k/v shapes do not match q");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(2) <= 512, "head_dim above 512 is not supported");
}

using Item = std::array<int64_t, 3>;  // (sequence, first token, kv head)

template <typename T>
void prefill_items(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, const int64_t* cup, const int64_t* pl, const std::vector<int64_t>& slots,
                   const std::vector<int64_t>& slot_off, const std::vector<Item>& items, int64_t tb, double scale,
                   at::Tensor& out, at::Tensor& lse) {
  const int64_t H = q.size(1), Hkv = k_new.size(1), D = q.size(2), g = H / Hkv;
  const T* qp = q.data_ptr<T>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < int64_t(items.size()); ++it) {
    const auto [b, t0, kh] = items[it];
    const int64_t t1 = std::min(cup[b + 1], t0 + tb);
    thread_local State s;
    thread_local std::vector<int64_t> limit;
    s.reset(int((t1 - t0) * g), int(D));
    limit.resize(s.M);
    for (int r = 0; r < s.M; ++r) {
      const int64_t t = t0 + r / g, h = kh * g + r % g;
      s.load_query(r, qp + (t * H + h) * D, float(scale));
      limit[r] = t - cup[b];
    }
    const Keys<T> prefix{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), slots.data() + slot_off[b], 0, pl[b]};
    sweep_any(s, prefix, Hkv * D, kh, nullptr, true);
    const Keys<T> own{k_new.data_ptr<T>(), v_new.data_ptr<T>(), nullptr, cup[b], t1 - cup[b]};
    sweep_any(s, own, Hkv * D, kh, &limit, true);
    for (int r = 0; r < s.M; ++r) {
      const int64_t t = t0 + r / g, h = kh * g + r % g;
      finish(s, r, op + (t * H + h) * D, lp + t * H + h);
    }
  }
}

// One work item of a segment: rows rp[i0..i1) (query vectors of KV head kh) attend to the segment's keys,
// starting from and merged into their running (out, lse) state.
template <typename T>
void segment_item(const at::Tensor& q, int64_t Hkv, const int64_t* rp, int64_t i0, int64_t i1, int64_t kh,
                  const Keys<T>& keys, const int64_t* lim, double scale, float* op, float* lp, bool direct) {
  const int64_t H = q.size(1), D = q.size(2), g = H / Hkv;
  const T* qp = q.data_ptr<T>();
  thread_local State s;
  thread_local std::vector<int64_t> limit;
  s.reset(int((i1 - i0) * g), int(D));
  limit.resize(lim ? s.M : 0);
  for (int r = 0; r < s.M; ++r) {  // start from the running state: m = lse, l = 1, acc = out
    const int64_t t = rp[i0 + r / g], h = kh * g + r % g;
    s.load_query(r, qp + (t * H + h) * D, float(scale));
    s.m[r] = lp[t * H + h] * kLog2e;
    s.l[r] = 1.f;
    std::copy(op + (t * H + h) * D, op + (t * H + h + 1) * D, &s.acc[size_t(r) * s.DP]);
    if (lim) limit[r] = lim[i0 + r / g];
  }
  sweep_any(s, keys, Hkv * D, kh, lim ? &limit : nullptr, direct);
  for (int r = 0; r < s.M; ++r) {
    const int64_t t = rp[i0 + r / g], h = kh * g + r % g;
    finish(s, r, op + (t * H + h) * D, lp + t * H + h);
  }
}

// Segments whose row sets are disjoint, all in one parallel loop over (segment, row block, KV head) items:
// segment i is rows rp[ro[i]..ro[i+1]) and slots sp[so[i]..so[i+1]).
template <typename T>
void segments_items(const at::Tensor& q, const int64_t* rp, const int64_t* ro, const at::Tensor& k_cache,
                    const at::Tensor& v_cache, const int64_t* sp, const int64_t* so, int64_t nseg,
                    const int64_t* lim, int64_t tb, double scale, float* op, float* lp, bool direct) {
  const int64_t Hkv = k_cache.size(1);
  std::vector<Item> items;  // (segment, first row, kv head)
  for (int64_t i = 0; i < nseg; ++i)
    if (so[i + 1] > so[i])
      for (int64_t r0 = ro[i]; r0 < ro[i + 1]; r0 += tb)
        for (int64_t kh = 0; kh < Hkv; ++kh) items.push_back({i, r0, kh});
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < int64_t(items.size()); ++it) {
    const auto [i, r0, kh] = items[it];
    const Keys<T> keys{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), sp + so[i], 0, so[i + 1] - so[i]};
    segment_item<T>(q, Hkv, rp, r0, std::min(ro[i + 1], r0 + tb), kh, keys, lim, scale, op, lp, direct);
  }
}

std::tuple<at::Tensor, at::Tensor> paged_prefill_attention(
    const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& cu_seqlens,
    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_table,
    const at::Tensor& prefix_lens, int64_t page_size, double scale) {
  check_qkv(q, k_new, v_new);
  check_qkv(q, k_cache, v_cache);
  const int64_t T = q.size(0), H = q.size(1), Hkv = k_new.size(1), D = q.size(2), g = H / Hkv;
  TORCH_CHECK(k_cache.size(1) == Hkv, "cache and new keys have different KV heads");
  const auto cu = cu_seqlens.to(at::kLong).contiguous();
  const auto plen = prefix_lens.to(at::kLong).contiguous();
  const auto bt = block_table.to(at::kLong).contiguous();
  const int64_t B = cu.numel() - 1;
  TORCH_CHECK(plen.numel() == B && bt.dim() == 2 && bt.size(0) == B, "block_table/prefix_lens do not match cu_seqlens");
  TORCH_CHECK(page_size >= 1, "page_size must be positive");
  const int64_t* cup = cu.data_ptr<int64_t>();
  const int64_t* pl = plen.data_ptr<int64_t>();
  // the prefix of every sequence resolved to slots, once
  std::vector<int64_t> slot_off(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) slot_off[b + 1] = slot_off[b] + pl[b];
  std::vector<int64_t> slots(slot_off[B]);
  const int64_t* btp = bt.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(pl[b] <= bt.size(1) * page_size, "prefix longer than its block table");
    for (int64_t j = 0; j < pl[b]; ++j)
      slots[slot_off[b] + j] = btp[b * bt.size(1) + j / page_size] * page_size + j % page_size;
  }
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / g);
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = cup[b]; t0 < cup[b + 1]; t0 += tb)
      for (int64_t kh = 0; kh < Hkv; ++kh) items.push_back({b, t0, kh});
  auto out = at::empty({T, H, D}, q.options().dtype(at::kFloat));
  auto lse = at::empty({T, H}, q.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_prefill_attention", [&] {
    prefill_items<scalar_t>(q, k_new, v_new, k_cache, v_cache, cup, pl, slots, slot_off, items, tb, scale, out, lse);
  });
  return {out, lse};
}

// limits (optional, [R]): the last index into `slots` each row may see (keys after it are masked).
void segment_attention_merge_(const at::Tensor& q, const at::Tensor& rows, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& slots, double scale,
                              const at::Tensor& out, const at::Tensor& lse,
                              const std::optional<at::Tensor>& limits) {
  check_qkv(q, k_cache, v_cache);
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat, "out and lse must be fp32");
  TORCH_CHECK(out.is_contiguous() && lse.is_contiguous() && out.sizes() == q.sizes(), "out must be like q");
  const int64_t g = q.size(1) / k_cache.size(1);
  const auto rw = rows.to(at::kLong).contiguous();
  const auto sl = slots.to(at::kLong).contiguous();
  const int64_t R = rw.numel();
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / g);
  at::Tensor lm;
  if (limits.has_value()) {
    lm = limits->to(at::kLong).contiguous();
    TORCH_CHECK(lm.numel() == R, "limits must hold one entry per row");
  }
  const int64_t ro[2] = {0, R}, so[2] = {0, sl.numel()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "segment_attention_merge_", [&] {
    segments_items<scalar_t>(q, rw.data_ptr<int64_t>(), ro, k_cache, v_cache, sl.data_ptr<int64_t>(), so, 1,
                             lm.defined() ? lm.data_ptr<int64_t>() : nullptr, tb, scale, out.data_ptr<float>(),
                             lse.data_ptr<float>(), /*direct=*/false);
  });
}

// Many segments in one call (a wave of the cascade): rows_cat/row_off and slots_cat/slot_off hold segment i's
// rows and slots; no two segments of one call may share a row (each row's merges stay in its caller's order).
void segments_attention_merge_(const at::Tensor& q, const at::Tensor& rows_cat, const at::Tensor& row_off,
                               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots_cat,
                               const at::Tensor& slot_off, double scale, const at::Tensor& out, const at::Tensor& lse) {
  check_qkv(q, k_cache, v_cache);
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat, "out and lse must be fp32");
  TORCH_CHECK(out.is_contiguous() && lse.is_contiguous() && out.sizes() == q.sizes(), "out must be like q");
  const auto rw = rows_cat.to(at::kLong).contiguous(), ro = row_off.to(at::kLong).contiguous();
  const auto sl = slots_cat.to(at::kLong).contiguous(), so = slot_off.to(at::kLong).contiguous();
  const int64_t nseg = ro.numel() - 1;
  TORCH_CHECK(nseg >= 0 && so.numel() == nseg + 1, "row_off and slot_off must both hold one entry per segment + 1");
  TORCH_CHECK(ro.data_ptr<int64_t>()[nseg] == rw.numel() && so.data_ptr<int64_t>()[nseg] == sl.numel(),
              "offsets do not end at the concatenated lengths");
  const int64_t tb = std::max<int64_t>(1, kRowsPerItem / (q.size(1) / k_cache.size(1)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "segments_attention_merge_", [&] {
    segments_items<scalar_t>(q, rw.data_ptr<int64_t>(), ro.data_ptr<int64_t>(), k_cache, v_cache,
                             sl.data_ptr<int64_t>(), so.data_ptr<int64_t>(), nseg, nullptr, tb, scale,
                             out.data_ptr<float>(), lse.data_ptr<float>(), /*direct=*/true);
  });
}

}  // namespace
}  // namespace icqs

TORCH_LIBRARY(icqs_native, m) {
  m.def("paged_prefill_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor cu_seqlens, Tensor k_cache, "
        "Tensor v_cache, Tensor block_table, Tensor prefix_lens, int page_size, float scale) -> (Tensor, Tensor)");
  m.def("segment_attention_merge_(Tensor q, Tensor rows, Tensor k_cache, Tensor v_cache, Tensor slots, "
        "float scale, Tensor(a!) out, Tensor(b!) lse, Tensor? limits=None) -> ()");
  m.def("segments_attention_merge_(Tensor q, Tensor rows_cat, Tensor row_off, Tensor k_cache, Tensor v_cache, "
        "Tensor slots_cat, Tensor slot_off, float scale, Tensor(a!) out, Tensor(b!) lse) -> ()");
}

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("paged_prefill_attention", &icqs::paged_prefill_attention);
  m.impl("segment_attention_merge_", &icqs::segment_attention_merge_);
  m.impl("segments_attention_merge_", &icqs::segments_attention_merge_);
}
