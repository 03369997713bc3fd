// 16 fp32 lanes: one AVX-512 register when the compiler targets AVX-512, a plain array otherwise (the loops of
// the fallback are left to the auto-vectoriser). Everything the attention kernels need, and nothing more.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace icqs {

constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
    __m512 p = _mm512_set1_ps(1.f / 5040);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 720));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return {_mm512_scalef_ps(p, n)};
  }
};
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }

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

}  // namespace icqs
