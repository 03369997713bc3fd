// Linear layers for AVX2 CPUs, the torch ops `icqs_native::linear_panels` and (the LM head fused
// with the log-softmax of each row's target, below) `icqs_native::target_logprobs`.
// linear_panels:
// y[M, N] = x[M, K] . W[N, K]^T (+ bias), with W packed once at load into panels of kPanel output columns,
// [P, K, kPanel] (P = ceil(N / kPanel), the last panel zero-padded; kernels/linear.py packs it with torch).
// fp32 or bf16 (x, W and the bias in one dtype); bf16 panels are widened to fp32 a panel at a time into a
// buffer in L2 (x a block of rows at a time) and every product is summed in fp32, the output rounded to bf16
// once as the tile is stored: on a CPU without avx512_bf16, torch's bf16 GEMM is emulated, far below the fp32
// rate (benchmarks/RESULTS.md).
//
// The micro-kernel keeps a 4-row x 24-column tile of y in 12 AVX2 registers and runs over K: per k, three
// loads of the panel's row and four broadcasts of x feed 12 FMAs, so it is bound by the FMA unit. A panel is
// used by every row of a row block while it sits in L2 (against oneDNN's packed kernel, what torch runs
// otherwise: benchmarks/RESULTS.md). Each output is one chain of FMAs over k = 0 .. K-1, whatever the row count, the
// row's place or the thread count, so a row's result does not depend on the other rows of the call (the
// engine's deterministic mode relies on it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
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
// the next panel's loads overlap this one's first tile).
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

#if defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kVocabChunk = 4096;  // vocabulary rows per work item, fixed (the merge order does not move)
constexpr int64_t kLogitBlock = 256;   // logits of a row gathered before they are folded into its log-sum-exp
constexpr int64_t kWideRows = 6;       // vocabulary rows widened to fp32 at a time (L1-resident)

// The sums of the 8 lanes of each of a0 .. a7, lane i of the result a_i's: every accumulator through the same
// tree, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), whatever it holds.
inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// logits of MR rows of h x 3 rows of w (fp32, Kp a multiple of 8, zero padded): each one FMA chain per lane over
// k, then hsum8x8 (the same tree for every logit); o[3 i + j] is row i's logit of w row j.
template <int MR>
inline void dot_rows(const float* h, int64_t Kp, const float* w0, float* o) {
  const float* w1 = w0 + Kp;
  const float* w2 = w1 + Kp;
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z, c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z;
  for (int64_t k = 0; k < Kp; k += 8) {
    const __m256 b0 = _mm256_loadu_ps(w0 + k), b1 = _mm256_loadu_ps(w1 + k), b2 = _mm256_loadu_ps(w2 + k);
    __m256 a = _mm256_loadu_ps(h + k);
    c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01), c02 = _mm256_fmadd_ps(a, b2, c02);
    if constexpr (MR > 1) {
      a = _mm256_loadu_ps(h + Kp + k);
      c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11), c12 = _mm256_fmadd_ps(a, b2, c12);
    }
    if constexpr (MR > 2) {
      a = _mm256_loadu_ps(h + 2 * Kp + k);
      c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21), c22 = _mm256_fmadd_ps(a, b2, c22);
    }
    if constexpr (MR > 3) {
      a = _mm256_loadu_ps(h + 3 * Kp + k);
      c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31), c32 = _mm256_fmadd_ps(a, b2, c32);
    }
  }
  _mm256_storeu_ps(o, hsum8x8(c00, c01, c02, c10, c11, c12, c20, c21));
  if constexpr (MR > 2) _mm256_storeu_ps(o + 8, hsum8x8(c22, c30, c31, c32, z, z, z, z));
}

// One row's log-sum-exp over a vocabulary range so far: the largest logit m and sum exp(logit - m).
struct Lse {
  float m = kNegInf, s = 0.f;
  // folds in n logits in a fixed order (sums of 2^((l - m) log2 e))
  void add(const float* l, int64_t n) {
    V16 vm = V16::set1(kNegInf);
    for (int64_t j = 0; j < n; j += kLanes) {
      const int c = int(std::min<int64_t>(kLanes, n - j));
      vm = vm.max(load_as_float(l + j, c).keep_first(c));
    }
    const float mnew = std::max(m, vm.max());
    s = (m == kNegInf ? 0.f : s * std::exp2((m - mnew) * kLog2e)) + sum_exp(l, n, mnew);
    m = mnew;
  }
};

// h [N, Kp] fp32 against vocabulary rows [v0, v1) of w (T = fp32 or bf16, [V, K]): the logits of every row, a
// block of kLogitBlock at a time in lg ([N, kLogitBlock]), folded into st[r]; the target's logit into tgt[r].
template <typename T>
void head_chunk(const float* h, int64_t N, int64_t K, int64_t Kp, const T* w, int64_t v0, int64_t v1,
                const int64_t* targets, Lse* st, float* tgt, float* lg, float* wide) {
  for (int64_t b0 = v0; b0 < v1; b0 += kLogitBlock) {
    const int64_t nb = std::min(kLogitBlock, v1 - b0);
    for (int64_t s0 = 0; s0 < nb; s0 += kWideRows) {
      const int64_t ns = std::min(kWideRows, nb - s0);
      const float* rows = wide;  // kWideRows rows Kp apart; fp32 rows of a whole Kp are read in place
      if constexpr (std::is_same_v<T, float>) {
        if (K == Kp && ns == kWideRows) rows = w + (b0 + s0) * K;
      }
      for (int64_t j = 0; rows == wide && j < kWideRows; ++j) {  // rows past the range: zeros, never read back
        float* dst = wide + j * Kp;
        if (j < ns) to_float(w + (b0 + s0 + j) * K, dst, int(K));
        else std::fill(dst, dst + K, 0.f);
      }
      for (int64_t r = 0; r < N; r += 4) {
        const int64_t mr = std::min<int64_t>(4, N - r);
        for (int64_t j = 0; j < ns; j += 3) {
          alignas(32) float o[16];
          const float* w0 = rows + j * Kp;
          switch (mr) {
            case 4: dot_rows<4>(h + r * Kp, Kp, w0, o); break;
            case 3: dot_rows<3>(h + r * Kp, Kp, w0, o); break;
            case 2: dot_rows<2>(h + r * Kp, Kp, w0, o); break;
            default: dot_rows<1>(h + r * Kp, Kp, w0, o); break;
          }
          for (int64_t i = 0; i < mr; ++i) {
            float* dst = lg + (r + i) * kLogitBlock + s0 + j;
            for (int64_t jj = 0; jj < std::min<int64_t>(3, ns - j); ++jj) dst[jj] = o[3 * i + jj];
          }
        }
      }
    }
    for (int64_t r = 0; r < N; ++r) {
      const float* l = lg + r * kLogitBlock;
      st[r].add(l, nb);
      if (targets[r] >= b0 && targets[r] < b0 + nb) tgt[r] = l[targets[r] - b0];
    }
  }
}
#endif

// The LM head fused with the log-softmax of one target per row: the logits hidden [N, K] . weight [V, K]^T in
// fp32, logprob[r] = logit[r, t_r] - log sum_v exp(logit[r, v]) and greedy[r] = (logit[r, t_r] is the largest),
// without a [N x V] tensor: work items are fixed vocabulary chunks of kVocabChunk rows, each widening its weight
// rows to fp32 a few at a time and leaving a (max, sum) per row, merged in chunk order. Each logit is a fixed
// sequence of FMAs and sums over k, whatever the row count, the row's place or the thread count, and every
// log-sum-exp runs in a fixed order: a row's result does not depend on the other rows or the threads (the
// deterministic mode relies on it). fp32 or bf16 (hidden and weight in one dtype). The contract of
// kernels/logprob.py's target_logprobs_ref without its top-k (kernels/native_ops.py).
std::tuple<at::Tensor, at::Tensor> target_logprobs(const at::Tensor& hidden, const at::Tensor& weight,
                                                   const at::Tensor& targets) {
#if defined(__AVX2__) && defined(__FMA__)
  const auto dtype = weight.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && hidden.scalar_type() == dtype,
              "target_logprobs: hidden and weight must be both float32 or both bfloat16");
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "target_logprobs: hidden [N, K] and weight [V, K]");
  const int64_t N = hidden.size(0), K = hidden.size(1), V = weight.size(0), Kp = (K + 7) / 8 * 8;
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == N && targets.scalar_type() == at::kLong,
              "target_logprobs: targets must be [N] int64");
  TORCH_CHECK(V > 0, "target_logprobs: an empty vocabulary");
  const at::Tensor tc = targets.contiguous();
  const int64_t* tp = tc.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(tp[r] >= 0 && tp[r] < V, "target_logprobs: target ", tp[r], " outside the vocabulary of ", V);
  at::Tensor logprob = at::empty({N}, hidden.options().dtype(at::kFloat));
  at::Tensor greedy = at::empty({N}, hidden.options().dtype(at::kBool));
  if (N == 0) return {logprob, greedy};
  at::Tensor hf = at::zeros({N, Kp}, hidden.options().dtype(at::kFloat));  // exact for bf16, zero padded
  hf.narrow(1, 0, K).copy_(hidden);
  const at::Tensor wc = weight.contiguous();
  const int64_t C = (V + kVocabChunk - 1) / kVocabChunk;
  std::vector<Lse> part(size_t(C) * N);
  std::vector<float> tgt(N);
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> lg(size_t(N) * kLogitBlock), wide(size_t(kWideRows) * Kp, 0.f);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t v0 = c * kVocabChunk, v1 = std::min(V, v0 + kVocabChunk);
      Lse* st = &part[size_t(c) * N];
      if (dtype == at::kBFloat16)
        head_chunk(hf.data_ptr<float>(), N, K, Kp, wc.data_ptr<c10::BFloat16>(), v0, v1, tp, st, tgt.data(),
                   lg.data(), wide.data());
      else
        head_chunk(hf.data_ptr<float>(), N, K, Kp, wc.data_ptr<float>(), v0, v1, tp, st, tgt.data(), lg.data(),
                   wide.data());
    }
  });
  float* lp = logprob.data_ptr<float>();
  bool* gr = greedy.data_ptr<bool>();
  for (int64_t r = 0; r < N; ++r) {
    float m = kNegInf, s = 0.f;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, part[size_t(c) * N + r].m);
    for (int64_t c = 0; c < C; ++c) {
      const Lse& e = part[size_t(c) * N + r];
      s += e.s * std::exp2((e.m - m) * kLog2e);
    }
    lp[r] = tgt[r] - m - std::log(s);
    gr[r] = tgt[r] >= m;
  }
  return {logprob, greedy};
#else
  TORCH_CHECK(false, "target_logprobs: this build has no AVX2 + FMA");
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

TORCH_LIBRARY_IMPL(icqs_native, CPU, m) {
  m.impl("linear_panels", &icqs::linear_panels);
  m.impl("target_logprobs", &icqs::target_logprobs);
}

// simd() has no tensor argument: its kernel serves every dispatch key
TORCH_LIBRARY_IMPL(icqs_native, CompositeImplicitAutograd, m) { m.impl("simd", &icqs::simd); }
