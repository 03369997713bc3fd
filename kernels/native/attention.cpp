// Native CPU attention over the paged KV cache, registered as torch ops `icqs_native::*`.
//
// Keys and values are read in place, row by row (through slot indices for the cache): no gathered copy of the
// cache is made. A work item is one KV head and a block of query tokens; its
// queries (tokens x the heads of the GQA group) sweep the keys in tiles of 32 with an online softmax in fp32,
// in the log2 domain. Each tile is packed into a small buffer (K transposed), then a 6-query x 32-key
// register-blocked micro-kernel computes the scores and the P.V update:
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
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "vec16.h"

namespace icqs {
namespace {

#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

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

// Online-softmax state of M query vectors padded to DP lanes: running max m (log2 domain), running sum l,
// unnormalised accumulator acc; the queries (fp32 pre-scaled, or bf16 pairs with the scale applied to the
// scores) and the tile buffers. One per thread, reused by every work item (reset() keeps the buffers' capacity:
// no allocation per item, which dominated decode steps of many one-token sequences).
struct State {
  int M = 0, D = 0, DP = 0, DH = 0;
  bool bf16 = false;   // the bf16 dot-product micro-kernel
  float qscale = 1.f;  // scale * log2(e), applied to bf16 scores
  std::vector<float> q, acc, m, l, kt, vt;  // l: per vector kLanes partial sums (summed by finish)
  std::vector<uint32_t> qb, kb, vb;  // bf16 pairs: queries [M][DH], K [DH][kNB], V [kNB / 2][D]
  void reset(int M_, int D_, bool bf16_) {
    M = M_, D = D_, DP = (D_ + kLanes - 1) / kLanes * kLanes, DH = D_ / 2, bf16 = bf16_;
    const int Mp = (M + kMR - 1) / kMR * kMR;
    acc.assign(size_t(Mp) * DP, 0.f);
    m.assign(Mp, kNegInf);
    l.assign(size_t(Mp) * kLanes, 0.f);
    if (bf16) {
      qb.assign(size_t(Mp) * DH, 0u);
      kb.resize(size_t(DH) * kNB);
      vb.resize(size_t(kNB / 2) * D);
    } else {
      q.assign(size_t(Mp) * DP, 0.f);
    }
    // the fp32 tiles also serve the key-by-key sweep of small items
    kt.resize(size_t(DP) * kNB);  // pack_tile writes every entry tile_rows reads (zeros past the tile's keys)
    if (DP == D) vt.resize(size_t(kNB) * DP);
    else vt.assign(size_t(kNB) * DP, 0.f);  // the padding columns past D stay zero
  }
  template <typename T>
  void load_query(int r, const T* src, float scale) {
    qscale = scale * kLog2e;
    if (bf16) {
      std::memcpy(&qb[size_t(r) * DH], src, size_t(D) * sizeof(T));
      return;
    }
    float* dst = &q[size_t(r) * DP];
    to_float(src, dst, D);
    for (int d = 0; d < D; ++d) dst[d] *= qscale;
  }
  // query vector r as fp32 pre-scaled (the key-by-key sweep), into buf [DP]
  const float* query_f32(int r, float* buf) const {
    if (!bf16) return &q[size_t(r) * DP];
    std::fill(buf, buf + DP, 0.f);
    to_float(reinterpret_cast<const c10::BFloat16*>(&qb[size_t(r) * DH]), buf, D);
    for (int d = 0; d < D; ++d) buf[d] *= qscale;
    return buf;
  }
};

// Per query vector r, the keys it sees: [first[r], last[r]] (absent: from 0 / to the end).
struct Visible {
  const std::vector<int64_t>* first = nullptr;
  const std::vector<int64_t>* last = nullptr;
  int64_t lo(int r) const { return first ? std::max<int64_t>((*first)[r], 0) : 0; }
  int64_t hi(int r, int64_t n) const { return last ? std::min<int64_t>((*last)[r] + 1, n) : n; }  // exclusive
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

#if defined(__AVX512BF16__)
// The K and V rows of keys j0..j0+n-1 of head kh (bf16), pointers to a zero row past the nb real ones.
void key_rows(const Keys<c10::BFloat16>& keys, int64_t j0, int nb, int n, int64_t row_stride, int64_t kh, int D,
              const c10::BFloat16** krow, const c10::BFloat16** vrow) {
  alignas(64) static const c10::BFloat16 zeros[512] = {};
  for (int j = 0; j < n; ++j) {
    if (j >= nb) { krow[j] = vrow[j] = zeros; continue; }
    const int64_t off = (keys.idx ? keys.idx[j0 + j] : keys.base + j0 + j) * row_stride + kh * D;
    krow[j] = keys.k + off;
    vrow[j] = keys.v + off;
  }
}

// V rows in pairs of keys: vb[jp][d] holds dimension d of keys (2jp, 2jp+1), for the bf16 P.V dot products.
void interleave_pairs(const c10::BFloat16* const* vrow, int npairs, int D, uint32_t* vb) {
  // out[2i] = a[i], out[2i + 1] = b[i]: dimension i of two keys side by side
  const __m512i interleave = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                              39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (int jp = 0; jp < npairs; ++jp)
    for (int d = 0; d < D; d += kLanes) {
      const __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow[2 * jp] + d)));
      const __m512i b = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow[2 * jp + 1] + d)));
      _mm512_storeu_si512(vb + size_t(jp) * D + d, _mm512_permutex2var_epi16(a, interleave, b));
    }
}

// Packs keys j0..j0+nb-1 of head kh for the bf16 micro-kernel (zero padded): kb[dp][j] holds key j's
// dimensions (2dp, 2dp+1); V in pairs of keys (interleave_pairs).
void pack_tile_bf16(State& s, const Keys<c10::BFloat16>& keys, int64_t j0, int nb, int64_t row_stride,
                    int64_t kh) {
  const c10::BFloat16* krow[kNB];
  const c10::BFloat16* vrow[kNB];
  key_rows(keys, j0, nb, kNB, row_stride, kh, s.D, krow, vrow);
  for (int j = 0; j < kNB; ++j) {
    uint32_t pairs[256];
    std::memcpy(pairs, krow[j], size_t(s.D) * sizeof(c10::BFloat16));
    for (int dp = 0; dp < s.DH; ++dp) s.kb[size_t(dp) * kNB + j] = pairs[dp];
  }
  interleave_pairs(vrow, kNB / 2, s.D, s.vb.data());
}

// One bf16 tile for query vectors r0..r0+kMR-1: scores and P.V by bf16 dot products, fp32 accumulation.
void tile_rows_bf16(State& s, int r0, int nb, const int* lo, const int* hi) {
  const uint32_t* q0 = &s.qb[size_t(r0) * s.DH];
  V16 s0[kMR], s1[kMR];
  {
    __m512 a0[kMR], a1[kMR];
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    if (nb > kLanes) {
      for (int dp = 0; dp < s.DH; ++dp) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(&s.kb[size_t(dp) * kNB]);
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(&s.kb[size_t(dp) * kNB + kLanes]);
#pragma GCC unroll 8
        for (int i = 0; i < kMR; ++i) {
          const __m512bh b = (__m512bh)_mm512_set1_epi32(int(q0[size_t(i) * s.DH + dp]));
          a0[i] = _mm512_dpbf16_ps(a0[i], b, k0);
          a1[i] = _mm512_dpbf16_ps(a1[i], b, k1);
        }
      }
    } else {  // the tile's second half is padding
      for (int dp = 0; dp < s.DH; ++dp) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(&s.kb[size_t(dp) * kNB]);
#pragma GCC unroll 8
        for (int i = 0; i < kMR; ++i)
          a0[i] = _mm512_dpbf16_ps(a0[i], (__m512bh)_mm512_set1_epi32(int(q0[size_t(i) * s.DH + dp])), k0);
      }
    }
    const __m512 scale = _mm512_set1_ps(s.qscale);
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) s0[i] = V16{_mm512_mul_ps(a0[i], scale)}, s1[i] = V16{_mm512_mul_ps(a1[i], scale)};
  }
  alignas(64) float p[kMR][kNB];
  float corr[kMR];
  softmax_tile(s, r0, s0, s1, lo, hi, p, corr);
  alignas(64) uint32_t pp[kMR][kNB / 2];  // p rounded to bf16, as pairs of keys
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i)
    _mm512_storeu_si512(pp[i], (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p[i] + kLanes), _mm512_loadu_ps(p[i])));
  const int npairs = (nb + 1) / 2;
  int dv = 0;
  for (; dv + 2 * kLanes <= s.D; dv += 2 * kLanes) {  // two vectors of dimensions per pass: half the broadcasts
    __m512 a[kMR], b[kMR];
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      const __m512 c = _mm512_set1_ps(corr[i]);
      a[i] = _mm512_mul_ps(_mm512_loadu_ps(&s.acc[size_t(r0 + i) * s.DP + dv]), c);
      b[i] = _mm512_mul_ps(_mm512_loadu_ps(&s.acc[size_t(r0 + i) * s.DP + dv + kLanes]), c);
    }
    for (int jp = 0; jp < npairs; ++jp) {
      const __m512bh v0 = (__m512bh)_mm512_loadu_si512(&s.vb[size_t(jp) * s.D + dv]);
      const __m512bh v1 = (__m512bh)_mm512_loadu_si512(&s.vb[size_t(jp) * s.D + dv + kLanes]);
#pragma GCC unroll 8
      for (int i = 0; i < kMR; ++i) {
        const __m512bh w = (__m512bh)_mm512_set1_epi32(int(pp[i][jp]));
        a[i] = _mm512_dpbf16_ps(a[i], w, v0);
        b[i] = _mm512_dpbf16_ps(b[i], w, v1);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      _mm512_storeu_ps(&s.acc[size_t(r0 + i) * s.DP + dv], a[i]);
      _mm512_storeu_ps(&s.acc[size_t(r0 + i) * s.DP + dv + kLanes], b[i]);
    }
  }
  for (; dv < s.D; dv += kLanes) {
    __m512 a[kMR];
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i)
      a[i] = _mm512_mul_ps(_mm512_loadu_ps(&s.acc[size_t(r0 + i) * s.DP + dv]), _mm512_set1_ps(corr[i]));
    for (int jp = 0; jp < npairs; ++jp) {
      const __m512bh v = (__m512bh)_mm512_loadu_si512(&s.vb[size_t(jp) * s.D + dv]);
#pragma GCC unroll 8
      for (int i = 0; i < kMR; ++i) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)_mm512_set1_epi32(int(pp[i][jp])), v);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) _mm512_storeu_ps(&s.acc[size_t(r0 + i) * s.DP + dv], a[i]);
  }
}
#endif

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

#if defined(__AVX512BF16__)
// The sums of 16 vectors' lanes, as one vector: lane j = sum of x[j]'s lanes (45 adds and shuffles instead of
// 16 horizontal reductions).
inline __m512 transpose_sum16(const __m512* x) {
  __m512 a[8], b[4];
  for (int j = 0; j < 8; ++j)  // per 128-bit block: partials of keys 2j (elements 0, 2) and 2j + 1 (1, 3)
    a[j] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * j], x[2 * j + 1]), _mm512_unpackhi_ps(x[2 * j], x[2 * j + 1]));
  for (int j = 0; j < 4; ++j) {  // per 128-bit block: partials of keys 4j .. 4j + 3
    const __m512d lo = _mm512_castps_pd(a[2 * j]), hi = _mm512_castps_pd(a[2 * j + 1]);
    b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)), _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
  }
  // block i of the result: the four blocks of b[i] summed
  const __m512 c01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c01, c23, 0x88), _mm512_shuffle_f32x4(c01, c23, 0xDD));
}

// acc[0 .. NV * 16) = acc * corr + sum over key pairs jp in [jp0, jp1) of p(pair jp) . V(pair jp), with vb's
// rows of pairs `stride` apart.
template <int NV>
inline void pv_pairs(float* acc, const uint32_t* vb, int64_t stride, const uint32_t* pp, int jp0, int jp1,
                     float corr) {
  __m512 x[NV];
#pragma GCC unroll 16
  for (int c = 0; c < NV; ++c) x[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + c * kLanes), _mm512_set1_ps(corr));
  for (int jp = jp0; jp < jp1; ++jp) {
    const __m512bh w = (__m512bh)_mm512_set1_epi32(int(pp[jp]));
#pragma GCC unroll 16
    for (int c = 0; c < NV; ++c)
      x[c] = _mm512_dpbf16_ps(x[c], w, (__m512bh)_mm512_loadu_si512(vb + size_t(jp) * stride + c * kLanes));
  }
#pragma GCC unroll 16
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + c * kLanes, x[c]);
}

// sweep_direct for bf16 queries and keys (head_dim a multiple of 32): scores by bf16 dot products straight
// from the cache rows, reduced 16 keys at a time; V interleaved in pairs of keys once per block and P.V by bf16
// dot products (P rounded to bf16, as in the tiles).
void sweep_direct_bf16(State& s, const Keys<c10::BFloat16>& keys, int64_t row_stride, int64_t kh,
                       const Visible& vis) {
  int64_t lo[kMR], hi[kMR], first = keys.n, last = 0;
  for (int r = 0; r < s.M; ++r) {
    lo[r] = vis.lo(r), hi[r] = vis.hi(r, keys.n);
    if (lo[r] < hi[r]) first = std::min(first, lo[r]), last = std::max(last, hi[r]);
  }
  const int nc = s.D / 32;  // 32-value chunks of a row
  const int D = s.D;
  uint32_t* vb = s.vb.data();
  const c10::BFloat16* krow[kLanes];
  const c10::BFloat16* vrow[kLanes];
  for (int64_t j0 = first / kLanes * kLanes; j0 < last; j0 += kLanes) {  // blocks at fixed offsets
    const int nb = int(std::min<int64_t>(kLanes, last - j0));
    key_rows(keys, j0, nb, kLanes, row_stride, kh, D, krow, vrow);
    interleave_pairs(vrow, (nb + 1) / 2, D, vb);
    for (int r = 0; r < s.M; ++r) {
      const int a = int(std::clamp<int64_t>(lo[r] - j0, 0, nb)), b = int(std::clamp<int64_t>(hi[r] - j0, 0, nb));
      if (a >= b) continue;
      const uint32_t* q = &s.qb[size_t(r) * s.DH];
      __m512 dots[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        __m512 acc = _mm512_setzero_ps();
        if (j >= a && j < b)
          for (int c = 0; c < nc; ++c)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + c * kLanes),
                                   (__m512bh)_mm512_loadu_si512(krow[j] + c * 32));
        dots[j] = acc;
      }
      const V16 sc = (V16{transpose_sum16(dots)} * V16::set1(s.qscale)).keep_range(a, b);
      const float mnew = std::max(s.m[r], sc.max());
      const float corr = std::exp2(s.m[r] - mnew);
      const V16 pv = (sc - V16::set1(mnew)).exp2();
      s.m[r] = mnew;
      float* l = &s.l[size_t(r) * kLanes];
      fma(V16::load(l), V16::set1(corr), pv).store(l);
      alignas(64) uint32_t pp[kLanes];  // p in bf16, pairs of keys (the upper half is zero)
      _mm512_storeu_si512(pp, (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), pv.v));
      float* accp = &s.acc[size_t(r) * s.DP];
      int d0 = 0;  // 4 (then 2) vectors of dimensions at a time, accumulators in registers
      for (; d0 + 4 * kLanes <= D; d0 += 4 * kLanes) pv_pairs<4>(accp + d0, vb + d0, D, pp, a / 2, (b + 1) / 2, corr);
      for (; d0 < D; d0 += 2 * kLanes) pv_pairs<2>(accp + d0, vb + d0, D, pp, a / 2, (b + 1) / 2, corr);
    }
  }
}
#endif

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

TORCH_LIBRARY(icqs_native, m) {
  m.def("varlen_causal_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, int window=0) "
        "-> (Tensor, Tensor)");
  m.def("segment_attention_merge_(Tensor q, Tensor rows, Tensor k_cache, Tensor v_cache, Tensor slots, "
        "float scale, Tensor(a!) out, Tensor(b!) lse, Tensor? limits=None, Tensor? starts=None) -> ()");
  m.def("segments_attention_merge_(Tensor q, Tensor rows_cat, Tensor row_off, Tensor k_cache, Tensor v_cache, "
        "Tensor slots_cat, Tensor slot_off, float scale, Tensor(a!) out, Tensor(b!) lse, Tensor? starts_cat=None) "
        "-> ()");
}

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("varlen_causal_attention", &icqs::varlen_causal_attention);
  m.impl("segment_attention_merge_", &icqs::segment_attention_merge_);
  m.impl("segments_attention_merge_", &icqs::segments_attention_merge_);
}
