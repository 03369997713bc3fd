// The attention's fp32 micro-kernels (attention_tile.h): scores and P.V by fp32 FMAs on 16-lane vectors
// (vec16.h), K and V converted to fp32 as they are packed. Included by attention.cpp alone.
#pragma once

#include "attention_tile.h"

namespace icqs {
namespace {

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

// The online-softmax update of one tile for query vectors r0..r0+kMR-1 from their scores (log2 domain, keys
// 0..15 in s0, 16..31 in s1): vector i sees the tile's keys [lo[i], hi[i]). Writes p (fp32, zero where not
// seen) and the rescaling factors corr of the accumulators; updates m and l.
void softmax_tile(State& s, int r0, const V16* s0, const V16* s1, const int* lo, const int* hi,
                  float (*p)[kNB], float* corr) {
  alignas(64) float diff[kLanes] = {0.f};
  V16 tile_sum[kMR];
  for (int i = 0; i < kMR; ++i) {
    const int r = r0 + i;
    tile_sum[i] = V16::zero();
    if (hi[i] <= lo[i]) { std::fill(p[i], p[i] + kNB, 0.f); continue; }
    // a half of the tile the row does not see costs nothing (short segments, causal and window edges)
    const bool in_a = lo[i] < kLanes, in_b = hi[i] > kLanes;
    const bool whole = lo[i] == 0 && hi[i] == kNB;  // the common case: no lane to mask
    const V16 a = whole ? s0[i] : s0[i].keep_range(lo[i], hi[i]);
    const V16 b = whole ? s1[i] : s1[i].keep_range(lo[i] - kLanes, hi[i] - kLanes);
    const float mnew = std::max(s.m[r], in_a && in_b ? a.max(b).max() : in_a ? a.max() : b.max());
    const V16 pa = in_a ? (a - V16::set1(mnew)).exp2() : V16::zero();
    const V16 pb = in_b ? (b - V16::set1(mnew)).exp2() : V16::zero();
    pa.store(p[i]);
    pb.store(p[i] + kLanes);
    diff[i] = s.m[r] - mnew;
    s.m[r] = mnew;
    tile_sum[i] = pa + pb;  // summed across lanes only at the end
  }
  alignas(64) float c[kLanes];
  V16::load(diff).exp2().store(c);
  for (int i = 0; i < kMR; ++i) {
    corr[i] = c[i];
    float* l = &s.l[size_t(r0 + i) * kLanes];
    fma(V16::load(l), V16::set1(c[i]), tile_sum[i]).store(l);
  }
}

// One fp32 tile for query vectors r0..r0+kMR-1.
void tile_rows(State& s, int r0, int nb, const int* lo, const int* hi) {
  V16 s0[kMR], s1[kMR];
  for (int i = 0; i < kMR; ++i) s0[i] = s1[i] = V16::zero();
  const float* q0 = &s.q[size_t(r0) * s.DP];
#if defined(ICQS_VEC16_AVX2)
  // AVX2 has 16 vector registers: the 6 x 32 scores (24 of them) would spill, so one half of the tile at a time
  // (each score sums over d in the same order either way)
  for (int half = 0; half < 2; ++half) {
    V16* acc = half ? s1 : s0;
    for (int d = 0; d < s.D; ++d) {
      const V16 k = V16::load(&s.kt[size_t(d) * kNB + half * kLanes]);
      for (int i = 0; i < kMR; ++i) acc[i] = fma(V16::set1(q0[size_t(i) * s.DP + d]), k, acc[i]);
    }
  }
#else
  for (int d = 0; d < s.D; ++d) {
    const V16 k0 = V16::load(&s.kt[size_t(d) * kNB]), k1 = V16::load(&s.kt[size_t(d) * kNB + kLanes]);
    for (int i = 0; i < kMR; ++i) {
      const V16 b = V16::set1(q0[size_t(i) * s.DP + d]);
      s0[i] = fma(b, k0, s0[i]);
      s1[i] = fma(b, k1, s1[i]);
    }
  }
#endif
  alignas(64) float p[kMR][kNB];
  float corr[kMR];
  softmax_tile(s, r0, s0, s1, lo, hi, p, corr);
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

// The sweep for items of few query vectors (kMR or fewer: a decode step's token), in blocks of kLanes keys
// converted to fp32 row by row: packing 32-key tiles costs more than such an item's arithmetic. Each score is
// a dot product; the block's softmax update is vectorised over its keys.
template <typename T>
void sweep_direct(State& s, const Keys<T>& keys, int64_t row_stride, int64_t kh, const Visible& vis) {
  alignas(64) float qbuf[kMR][512 + kLanes];
  const float* qs[kMR];
  int64_t lo[kMR], hi[kMR], first = keys.n, last = 0;
  for (int r = 0; r < s.M; ++r) {
    qs[r] = s.query_f32(r, qbuf[r]);
    lo[r] = vis.lo(r), hi[r] = vis.hi(r, keys.n);
    if (lo[r] < hi[r]) first = std::min(first, lo[r]), last = std::max(last, hi[r]);
  }
  for (int64_t j0 = first / kLanes * kLanes; j0 < last; j0 += kLanes) {  // blocks at fixed offsets
    const int nb = int(std::min<int64_t>(kLanes, last - j0));
    for (int j = 0; j < nb; ++j) {  // K and V rows in fp32, zero padded to DP
      const int64_t off = (keys.idx ? keys.idx[j0 + j] : keys.base + j0 + j) * row_stride + kh * s.D;
      float* kr = &s.kt[size_t(j) * s.DP];
      float* vr = &s.vt[size_t(j) * s.DP];
      to_float(keys.k + off, kr, s.D);
      to_float(keys.v + off, vr, s.D);
      std::fill(kr + s.D, kr + s.DP, 0.f);
      std::fill(vr + s.D, vr + s.DP, 0.f);
    }
    for (int r = 0; r < s.M; ++r) {
      const int a = int(std::clamp<int64_t>(lo[r] - j0, 0, nb)), b = int(std::clamp<int64_t>(hi[r] - j0, 0, nb));
      if (a >= b) continue;
      alignas(64) float score[kLanes];
      for (int j = a; j < b; ++j) {
        const float* kr = &s.kt[size_t(j) * s.DP];
        V16 dot = V16::zero();
        for (int d = 0; d < s.DP; d += kLanes) dot = fma(V16::load(qs[r] + d), V16::load(kr + d), dot);
        score[j] = dot.sum();
      }
      const V16 sc = V16::load(score).keep_range(a, b);
      const float mnew = std::max(s.m[r], sc.max());
      const float corr = std::exp2(s.m[r] - mnew);
      alignas(64) float p[kLanes];
      const V16 pv = (sc - V16::set1(mnew)).exp2();
      pv.store(p);
      s.m[r] = mnew;
      float* l = &s.l[size_t(r) * kLanes];
      fma(V16::load(l), V16::set1(corr), pv).store(l);
      float* acc = &s.acc[size_t(r) * s.DP];
      for (int d = 0; d < s.DP; d += kLanes) {
        V16 x = V16::load(acc + d) * V16::set1(corr);
        for (int j = a; j < b; ++j) x = fma(V16::set1(p[j]), V16::load(&s.vt[size_t(j) * s.DP + d]), x);
        x.store(acc + d);
      }
    }
  }
}

}  // namespace
}  // namespace icqs
