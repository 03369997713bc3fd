// The state the attention's micro-kernels share (attention.cpp drives them; each ISA's kernels in their own
// header):
//   attention_fp32.h        fp32 FMAs on 16-lane vectors (vec16.h: AVX-512, or AVX2 in two halves): the tiled
//                           kernel (pack_tile + tile_rows), the direct one for items of few query vectors
//                           (sweep_direct), and the online-softmax update of a tile both tiled kernels share;
//   attention_avx512bf16.h  bf16 dot products with fp32 accumulation (vdpbf16ps), where the compiler targets
//                           AVX512_BF16: the same two kernels for bf16 queries and keys.
// A work item's query vectors (tokens x the heads of a GQA group) keep their online-softmax state in a State,
// sweep the keys of a Keys in tiles of kNB and see, each, a range of them (Visible).
// These headers are included by attention.cpp alone: one translation unit, so that the micro-kernels inline into
// the tile loop (attention.cpp's sweep), which they cannot across translation units.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec16.h"

namespace icqs {
namespace {

#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

constexpr int kMR = 6;           // query vectors computed together in the micro-kernel
constexpr int kNB = 2 * kLanes;  // keys per tile

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

}  // namespace
}  // namespace icqs
