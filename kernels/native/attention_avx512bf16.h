// The attention's bf16 micro-kernels (attention_tile.h), for a CPU with AVX512_BF16: scores and P.V by bf16
// dot products with fp32 accumulation (vdpbf16ps), K packed as pairs of dimensions, V as pairs of keys, P
// rounded to bf16 for P.V as the torch reference does. Empty unless the compiler targets AVX512_BF16. Included by
// attention.cpp alone, after attention_fp32.h (softmax_tile).
#pragma once

#include "attention_fp32.h"

#if defined(__AVX512BF16__)
namespace icqs {
namespace {

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

}  // namespace
}  // namespace icqs
#endif
