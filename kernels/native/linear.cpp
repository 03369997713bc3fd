// Linear layers for AVX2 CPUs, registered as the torch op `icqs_native::linear_panels`:
// y[M, N] = x[M, K] . W[N, K]^T (+ bias), with W packed once at load into panels of kPanel output columns,
// [P, K, kPanel] (P = ceil(N / kPanel), the last panel zero-padded; kernels/linear.py packs it with torch).
// fp32 or bf16 (x, W and the bias in one dtype); bf16 panels are widened to fp32 a panel at a time into a
// buffer in L2 (x a block of rows at a time) and every product is summed in fp32, the output rounded to bf16
// once as the tile is stored: on a CPU without avx512_bf16, torch's bf16 GEMM is emulated and ran at ~1/7 of
// the fp32 rate (benchmarks/RESULTS.md).
//
// The micro-kernel keeps a 4-row x 24-column tile of y in 12 AVX2 registers and runs over K: per k, three
// loads of the panel's row and four broadcasts of x feed 12 FMAs, so it is bound by the FMA unit. A panel is
// used by every row of a row block while it sits in L2. On an AVX2 EPYC a decode step's 32 rows took 4-25% less
// time than with oneDNN's packed kernel (what torch runs otherwise), 1024-row chunks between 15% less and 2%
// more (benchmarks/RESULTS.md). Each output is one chain of FMAs over k = 0 .. K-1, whatever the row count, the
// row's place or the thread count, so a row's result does not depend on the other rows of the call (the
// engine's deterministic mode relies on it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "vec16.h"

namespace icqs {
namespace {

constexpr int64_t kPanel = 24;     // output columns per panel: three 8-lane registers
constexpr int64_t kRowBlock = 256;  // rows of x per pass over the panels (a block of x stays in L2 / L3)

#if defined(__AVX2__) && defined(__FMA__)
// y[0 .. MR)[0 .. 24) = x[0 .. MR) . panel (+ bias), x rows `ldx` apart, y rows `ldy` apart; `next` (optional):
// a panel to prefetch meanwhile, `next_step` bytes per k (a decode step reads every weight from memory once:
// prefetching the next panel while this one's first tile runs took a DRAM-resident MLP weight from 37-39 to
// 40-41 GFLOP/s).
// y is fp32 or bf16 (each output rounded once, from the register).
// The accumulators are named variables: an array of them is spilled to the stack on every iteration by GCC.
inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline void store8(c10::BFloat16* y, __m256 v) { store_bf16x8(v, y); }

template <int MR, typename TY>
inline void tile(const float* x, int64_t ldx, const float* panel, int64_t K, const float* bias, TY* y,
                 int64_t ldy, const char* next, int64_t next_step) {
  const __m256 z0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  const __m256 z1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
  const __m256 z2 = bias ? _mm256_loadu_ps(bias + 16) : _mm256_setzero_ps();
  __m256 c00 = z0, c01 = z1, c02 = z2, c10 = z0, c11 = z1, c12 = z2;
  __m256 c20 = z0, c21 = z1, c22 = z2, c30 = z0, c31 = z1, c32 = z2;
  const float* x0 = x;
  const float* x1 = x + (MR > 1 ? ldx : 0);
  const float* x2 = x + (MR > 2 ? 2 * ldx : 0);
  const float* x3 = x + (MR > 3 ? 3 * ldx : 0);
  for (int64_t k = 0; k < K; ++k, panel += kPanel) {
    if (next) _mm_prefetch(next + k * next_step, _MM_HINT_T0);
    const __m256 b0 = _mm256_loadu_ps(panel), b1 = _mm256_loadu_ps(panel + 8), b2 = _mm256_loadu_ps(panel + 16);
    __m256 a = _mm256_broadcast_ss(x0 + k);
    c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01), c02 = _mm256_fmadd_ps(a, b2, c02);
    if constexpr (MR > 1) {
      a = _mm256_broadcast_ss(x1 + k);
      c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11), c12 = _mm256_fmadd_ps(a, b2, c12);
    }
    if constexpr (MR > 2) {
      a = _mm256_broadcast_ss(x2 + k);
      c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21), c22 = _mm256_fmadd_ps(a, b2, c22);
    }
    if constexpr (MR > 3) {
      a = _mm256_broadcast_ss(x3 + k);
      c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31), c32 = _mm256_fmadd_ps(a, b2, c32);
    }
  }
  store8(y, c00), store8(y + 8, c01), store8(y + 16, c02);
  if constexpr (MR > 1) y += ldy, store8(y, c10), store8(y + 8, c11), store8(y + 16, c12);
  if constexpr (MR > 2) y += ldy, store8(y, c20), store8(y + 8, c21), store8(y + 16, c22);
  if constexpr (MR > 3) y += ldy, store8(y, c30), store8(y + 8, c31), store8(y + 16, c32);
}

// Rows [r0, r1) of y against panel p: whole 4-row tiles, then the rest; a partial last panel through a buffer.
// The first tile prefetches `next` (the panel this thread runs after p, or null; `next_step` bytes per k).
// x holds rows r0 .. r1 - 1 (row r at x + (r - r0) * K).
template <typename TY>
void panel_rows(const float* x, int64_t K, const float* panel, const float* bias, TY* y, int64_t N, int64_t p,
                int64_t r0, int64_t r1, const char* next, int64_t next_step) {
  const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
  alignas(32) TY buf[4 * kPanel];
  const auto run = [&](auto mr, int64_t r) {
    constexpr int MR = decltype(mr)::value;
    const char* pf = r == r0 ? next : nullptr;
    const float* xr = x + (r - r0) * K;
    if (width == kPanel) return tile<MR>(xr, K, panel, K, bias, y + r * N + n0, N, pf, next_step);
    tile<MR>(xr, K, panel, K, bias, buf, kPanel, pf, next_step);
    for (int i = 0; i < MR; ++i) std::memcpy(y + (r + i) * N + n0, buf + i * kPanel, width * sizeof(TY));
  };
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) run(std::integral_constant<int, 4>{}, r);
  switch (r1 - r) {
    case 3: run(std::integral_constant<int, 3>{}, r); break;
    case 2: run(std::integral_constant<int, 2>{}, r); break;
    case 1: run(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}
#endif

at::Tensor linear_panels(const at::Tensor& x, const at::Tensor& panels, int64_t n,
                         const std::optional<at::Tensor>& bias) {
#if defined(__AVX2__) && defined(__FMA__)
  const auto dtype = panels.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && x.scalar_type() == dtype,
              "linear_panels: x and panels must be both float32 or both bfloat16");
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == kPanel && panels.is_contiguous(),
              "linear_panels: panels must be a contiguous [P, K, ", kPanel, "] tensor");
  const int64_t K = panels.size(1), P = panels.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "linear_panels: x must be [M, ", K, "]");
  TORCH_CHECK(n > (P - 1) * kPanel && n <= P * kPanel, "linear_panels: ", n, " output features do not fit ", P,
              " panels");
  const bool bf16 = dtype == at::kBFloat16;
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0);
  at::Tensor y = at::empty({M, n}, xc.options());  // in the input's dtype: bf16 outputs are rounded in the tile
  if (M == 0 || n == 0) return y;
  std::vector<float> bias_pad;  // fp32, zero-padded to whole panels
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == dtype && bias->dim() == 1 && bias->size(0) == n,
                "linear_panels: bias must be [", n, "] in the panels' dtype");
    const at::Tensor b = bias->to(at::kFloat).contiguous();
    bias_pad.assign(P * kPanel, 0.f);
    std::memcpy(bias_pad.data(), b.data_ptr<float>(), n * sizeof(float));
  }
  const char* wp = static_cast<const char*>(panels.data_ptr());
  const int64_t panel_bytes = K * kPanel * panels.element_size(), step = kPanel * panels.element_size();
  // bf16: a block of x widened to fp32 (exact) once, read by every thread's panels
  std::vector<float> xwide(bf16 ? std::min(M, kRowBlock) * K : 0);
  const auto run = [&](auto* yp) {
    for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) {
      const int64_t r1 = std::min(M, r0 + kRowBlock);
      const float* xp = xwide.data();
      if (bf16) {
        const auto* src = xc.data_ptr<c10::BFloat16>();
        at::parallel_for(r0, r1, 16, [&](int64_t a, int64_t b) {
          to_float(src + a * K, xwide.data() + (a - r0) * K, int((b - a) * K));
        });
      } else {
        xp = xc.data_ptr<float>() + r0 * K;
      }
      at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
        std::vector<float> wide(bf16 ? K * kPanel : 0);  // this thread's panel in fp32
        for (int64_t p = p0; p < p1; ++p) {
          const char* src = wp + p * panel_bytes;
          if (bf16)  // exact: a bf16 is the high half of an fp32
            to_float(reinterpret_cast<const c10::BFloat16*>(src), wide.data(), int(K * kPanel));
          panel_rows(xp, K, bf16 ? wide.data() : reinterpret_cast<const float*>(src),
                     bias_pad.empty() ? nullptr : bias_pad.data() + p * kPanel, yp, n, p, r0, r1,
                     p + 1 < p1 ? src + panel_bytes : nullptr, step);
        }
      });
    }
  };
  if (bf16) run(y.data_ptr<c10::BFloat16>());
  else run(y.data_ptr<float>());
  return y;
#else
  TORCH_CHECK(false, "linear_panels: this build has no AVX2 + FMA");
#endif
}

// The widest vector instruction set this build was compiled for ("avx512bf16", "avx512", "avx2" or "none"):
// kernels/linear.py packs weights for linear_panels only in an AVX2 build, where it was measured.
std::string simd() {
#if defined(__AVX512BF16__)
  return "avx512bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "none";
#endif
}

}  // namespace
}  // namespace icqs

TORCH_LIBRARY_FRAGMENT(icqs_native, m) {
  m.def("linear_panels(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor");
  m.def("simd() -> str", &icqs::simd);
}

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("linear_panels", &icqs::linear_panels);
}
