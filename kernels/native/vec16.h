// 16 fp32 lanes: one AVX-512 register when the compiler targets AVX-512, two AVX2 registers when it targets
// AVX2 + FMA (lanes 0-7 and 8-15; horizontal sums in the same tree as AVX-512's), a plain array otherwise (the
// loops of the fallback are left to the auto-vectoriser). Everything the native kernels need, and nothing more.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace icqs {

constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;  // e^x = 2^(x log2 e): the vector exp is exp2
// e^f = sum f^k / k! for k = 7 down to 0, in Horner's order (2^x = 2^n e^(f ln 2) in the vector forms below)
constexpr int kExp2Terms = 8;
constexpr float kExp2Taylor[kExp2Terms] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};

#if defined(__AVX512F__)

struct V16 {
  __m512 v;
  static V16 zero() { return {_mm512_setzero_ps()}; }
  static V16 set1(float x) { return {_mm512_set1_ps(x)}; }
  static V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  V16 operator*(V16 o) const { return {_mm512_mul_ps(v, o.v)}; }
  V16 operator-(V16 o) const { return {_mm512_sub_ps(v, o.v)}; }
  V16 operator+(V16 o) const { return {_mm512_add_ps(v, o.v)}; }
  V16 operator/(V16 o) const { return {_mm512_div_ps(v, o.v)}; }
  V16 max(V16 o) const { return {_mm512_max_ps(v, o.v)}; }
  float max() const { return _mm512_reduce_max_ps(v); }
  float sum() const { return _mm512_reduce_add_ps(v); }
  // lanes >= count become -inf (count <= 0: all of them)
  V16 keep_first(int count) const {
    const __mmask16 m = count >= kLanes ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1u);
    return {_mm512_mask_blend_ps(m, _mm512_set1_ps(kNegInf), v)};
  }
  // lanes outside [lo, hi) become -inf
  V16 keep_range(int lo, int hi) const {
    const auto bits = [](int c) { return c >= kLanes ? 0xFFFFu : c <= 0 ? 0u : (1u << c) - 1u; };
    return {_mm512_mask_blend_ps(__mmask16(bits(hi) & ~bits(lo)), _mm512_set1_ps(kNegInf), v)};
  }
  // 2^x: x = n + f with n = round(x), |f| <= 1/2, Taylor series of 2^f to degree 7 (error < 1e-8 relative);
  // x is clamped at -160 so that -inf gives exactly 0 through scalef's underflow.
  V16 exp2() const {
    const __m512 x = _mm512_max_ps(v, _mm512_set1_ps(-160.f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(0.6931471805599453f));
    __m512 p = _mm512_set1_ps(kExp2Taylor[0]);
    for (int i = 1; i < kExp2Terms; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Taylor[i]));
    return {_mm512_scalef_ps(p, n)};
  }
};
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }

#elif defined(__AVX2__) && defined(__FMA__)
#define ICQS_VEC16_AVX2 1

// lane i of an 8-lane half: -1 (all bits) where lo <= base + i < hi, else 0
inline __m256 lanes_in(int base, int lo, int hi) {
  const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(base));
  const __m256i below_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx);
  const __m256i below_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx);
  return _mm256_castsi256_ps(_mm256_andnot_si256(below_lo, below_hi));
}

// 8 lanes -> one float, in the order of _mm512_reduce_*_ps once its two halves are combined: (i, i+4), (i, i+2),
// (i, i+1)
template <typename Op>
inline float reduce8(__m256 x, Op op) {
  __m128 r = op(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  r = op(r, _mm_movehl_ps(r, r));
  r = op(r, _mm_shuffle_ps(r, r, 1));
  return _mm_cvtss_f32(r);
}

struct V16 {
  __m256 lo, hi;
  static V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V16 set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  void store(float* p) const { _mm256_storeu_ps(p, lo); _mm256_storeu_ps(p + 8, hi); }
  V16 operator*(V16 o) const { return {_mm256_mul_ps(lo, o.lo), _mm256_mul_ps(hi, o.hi)}; }
  V16 operator-(V16 o) const { return {_mm256_sub_ps(lo, o.lo), _mm256_sub_ps(hi, o.hi)}; }
  V16 operator+(V16 o) const { return {_mm256_add_ps(lo, o.lo), _mm256_add_ps(hi, o.hi)}; }
  V16 operator/(V16 o) const { return {_mm256_div_ps(lo, o.lo), _mm256_div_ps(hi, o.hi)}; }
  V16 max(V16 o) const { return {_mm256_max_ps(lo, o.lo), _mm256_max_ps(hi, o.hi)}; }
  float max() const { return reduce8(_mm256_max_ps(lo, hi), [](__m128 a, __m128 b) { return _mm_max_ps(a, b); }); }
  float sum() const { return reduce8(_mm256_add_ps(lo, hi), [](__m128 a, __m128 b) { return _mm_add_ps(a, b); }); }
  // lanes >= count become -inf (count <= 0: all of them)
  V16 keep_first(int count) const { return keep_range(0, count); }
  // lanes outside [lo, hi) become -inf
  V16 keep_range(int first, int end) const {
    const __m256 inf = _mm256_set1_ps(kNegInf);
    return {_mm256_blendv_ps(inf, lo, lanes_in(0, first, end)), _mm256_blendv_ps(inf, hi, lanes_in(8, first, end))};
  }
  // 2^x as the AVX-512 form computes it (the same polynomial); 2^n is built from n's exponent bits, n clamped to
  // [-127, 128] so that x <= -127 (-inf included, clamped to -160) gives exactly 0 and x >= 128 gives inf.
  __attribute__((always_inline)) V16 exp2() const { return {exp2_8(lo), exp2_8(hi)}; }

 private:
  __attribute__((always_inline)) static __m256 exp2_8(__m256 v) {
    const __m256 x = _mm256_max_ps(v, _mm256_set1_ps(-160.f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_mul_ps(_mm256_sub_ps(x, n), _mm256_set1_ps(0.6931471805599453f));
    __m256 p = _mm256_set1_ps(kExp2Taylor[0]);
    for (int i = 1; i < kExp2Terms; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Taylor[i]));
    const __m256 e = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-127.f)), _mm256_set1_ps(128.f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(e), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
};
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }

#else

struct V16 {
  float v[kLanes];
  static V16 zero() { return set1(0.f); }
  static V16 set1(float x) { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = x; return r; }
  static V16 load(const float* p) { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = p[i]; return r; }
  void store(float* p) const { for (int i = 0; i < kLanes; ++i) p[i] = v[i]; }
  V16 operator*(V16 o) const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = v[i] * o.v[i]; return r; }
  V16 operator-(V16 o) const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = v[i] - o.v[i]; return r; }
  V16 operator+(V16 o) const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = v[i] + o.v[i]; return r; }
  V16 operator/(V16 o) const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = v[i] / o.v[i]; return r; }
  V16 max(V16 o) const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = v[i] > o.v[i] ? v[i] : o.v[i]; return r; }
  float max() const { float m = v[0]; for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m; return m; }
  float sum() const { float s = 0.f; for (int i = 0; i < kLanes; ++i) s += v[i]; return s; }
  V16 keep_first(int count) const { V16 r = *this; for (int i = count < 0 ? 0 : count; i < kLanes; ++i) r.v[i] = kNegInf; return r; }
  V16 keep_range(int lo, int hi) const { V16 r = *this; for (int i = 0; i < kLanes; ++i) if (i < lo || i >= hi) r.v[i] = kNegInf; return r; }
  V16 exp2() const { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = std::exp2(v[i]); return r; }
};
inline V16 fma(V16 a, V16 b, V16 c) {
  V16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}

#endif

// n elements of T -> fp32
template <typename T>
inline void to_float(const T* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#if defined(__AVX512F__)
template <>
inline void to_float<c10::BFloat16>(const c10::BFloat16* src, float* dst, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
#endif

// n <= 16 elements of T as 16 fp32 lanes (the rest 0), and back; round_as<T>: fp32 lanes rounded to T's precision
// (what storing them in T and reading them back gives).
template <typename T>
inline V16 load_as_float(const T* src, int n) {
  alignas(64) float buf[kLanes] = {0.f};
  to_float(src, buf, n);
  return V16::load(buf);
}

template <typename T>
inline void store_as(V16 x, T* dst, int n) {
  alignas(64) float buf[kLanes];
  x.store(buf);
  for (int i = 0; i < n; ++i) dst[i] = static_cast<T>(buf[i]);
}

template <typename T>
inline V16 round_as(V16 x) {
  alignas(64) float buf[kLanes];
  x.store(buf);
  for (int i = 0; i < kLanes; ++i) buf[i] = static_cast<float>(static_cast<T>(buf[i]));
  return V16::load(buf);
}

template <>
inline V16 round_as<float>(V16 x) { return x; }

#if defined(__AVX2__) && defined(__FMA__)
// 8-lane helpers, also used by the AVX2 linear of an AVX-512 build (linear.cpp).
// 8 bf16 -> 8 fp32 (the bits shifted into the upper half)
inline __m256 bf16x8_to_float(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// round to nearest even at bf16 precision; NaNs pass through (as the AVX-512 form)
inline __m256 round_bf16_8(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(int(0xFFFF0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// 8 fp32 -> 8 bf16 (rounded to nearest even) at dst
inline void store_bf16x8(__m256 x, c10::BFloat16* dst) {
  const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(round_bf16_8(x)), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                   _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
}
#endif

#if defined(ICQS_VEC16_AVX2)

template <>
inline void to_float<c10::BFloat16>(const c10::BFloat16* src, float* dst, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, bf16x8_to_float(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <>
inline V16 round_as<c10::BFloat16>(V16 x) { return {round_bf16_8(x.lo), round_bf16_8(x.hi)}; }

template <>
inline V16 load_as_float<float>(const float* src, int n) {
  if (n >= kLanes) return V16::load(src);
  const __m256i lo = _mm256_castps_si256(lanes_in(0, 0, n)), hi = _mm256_castps_si256(lanes_in(8, 0, n));
  return {_mm256_maskload_ps(src, lo), _mm256_maskload_ps(src + 8, hi)};
}

template <>
inline void store_as<float>(V16 x, float* dst, int n) {
  if (n >= kLanes) return x.store(dst);
  _mm256_maskstore_ps(dst, _mm256_castps_si256(lanes_in(0, 0, n)), x.lo);
  _mm256_maskstore_ps(dst + 8, _mm256_castps_si256(lanes_in(8, 0, n)), x.hi);
}

template <>
inline V16 load_as_float<c10::BFloat16>(const c10::BFloat16* src, int n) {
  alignas(32) c10::BFloat16 buf[kLanes];
  const c10::BFloat16* p = src;
  if (n < kLanes) {
    for (int i = 0; i < kLanes; ++i) buf[i] = i < n ? src[i] : c10::BFloat16(0.f);
    p = buf;
  }
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {bf16x8_to_float(_mm256_castsi256_si128(h)), bf16x8_to_float(_mm256_extracti128_si256(h, 1))};
}

template <>
inline void store_as<c10::BFloat16>(V16 x, c10::BFloat16* dst, int n) {
  const V16 r = round_as<c10::BFloat16>(x);
  // the upper 16 bits of each lane, packed in order (packus works within 128-bit halves: permute them back)
  const __m256i lo = _mm256_srli_epi32(_mm256_castps_si256(r.lo), 16);
  const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(r.hi), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
  if (n >= kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
    return;
  }
  alignas(32) c10::BFloat16 buf[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(buf), packed);
  for (int i = 0; i < n; ++i) dst[i] = buf[i];
}
#endif

#if defined(__AVX512F__)
// round to nearest even at bf16 precision; NaNs pass through
template <>
inline V16 round_as<c10::BFloat16>(V16 x) {
  const __m512i b = _mm512_castps_si512(x.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(int(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
  return {_mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), x.v)};
}

template <>
inline V16 load_as_float<float>(const float* src, int n) {
  return {_mm512_maskz_loadu_ps(n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u), src)};
}

template <>
inline void store_as<float>(V16 x, float* dst, int n) {
  _mm512_mask_storeu_ps(dst, n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u), x.v);
}

template <>
inline V16 load_as_float<c10::BFloat16>(const c10::BFloat16* src, int n) {
  const __mmask16 m = n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  const __m256i h = _mm256_maskz_loadu_epi16(m, src);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}

template <>
inline void store_as<c10::BFloat16>(V16 x, c10::BFloat16* dst, int n) {
  const __mmask16 m = n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_as<c10::BFloat16>(x).v), 16);
  _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(bits));
}
#endif

// sum over i < n of e^(x[i] - m) (m >= every x[i]), in 16 fp32 lanes in a fixed order, summed across lanes last
template <typename T>
inline float sum_exp(const T* x, int64_t n, float m) {
  const V16 vmax = V16::set1(m), l2e = V16::set1(kLog2e);
  V16 sum = V16::zero();
  for (int64_t j = 0; j < n; j += kLanes) {
    const int c = int(std::min<int64_t>(kLanes, n - j));
    sum = sum + ((load_as_float(x + j, c) - vmax) * l2e).keep_first(c).exp2();
  }
  return sum.sum();
}

}  // namespace icqs
