// The integer primitives of the quantized dot products, one version per instruction-set
// level: int16 activation blocks (quantize_row), weights widened to int16 (widen_int8,
// widen_nibbles) and one block's integer dot product folded into a float accumulator
// (block_fma), with AVX-512 VNNI, AVX2 or plain C++. quantized_dot.h builds the row and
// channel loops on them; quantized_linear.cpp says why the activations are int16.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace kvrelay_cpu::qdot {

constexpr int64_t kBlock = 32;       // activation block: one scale per 32 inputs
constexpr int64_t kRowsPerPass = 4;  // activation rows sharing one pass over a weight row
constexpr int64_t kMaxBlocks = 1024;  // K up to 32768 inputs per row
constexpr float kLevels = 32767.f;    // int16 activation steps on each side of zero

inline float to_float(float s) { return s; }
inline float to_float(c10::Half s) {
#if defined(__F16C__)
  return _cvtsh_ss(s.x);
#else
  return static_cast<float>(s);
#endif
}

// One float per activation block from a row's per-group scales (or minimums): the inner
// loops then index blocks directly, with no division and no float16 conversion.
template <typename S>
void expand_per_block(const S* per_group, int64_t groups, int64_t blocks_per_group,
                      float* per_block) {
  int64_t g = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<S, c10::Half>) {
    if (blocks_per_group == 1) {  // GGUF's blocks: a plain conversion, eight at a time
      for (; g + 8 <= groups; g += 8) {
        const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(per_group + g));
        _mm256_storeu_ps(per_block + g, _mm256_cvtph_ps(half));
      }
    }
  }
#endif
  for (; g < groups; ++g) {
    const float value = to_float(per_group[g]);
    for (int64_t j = 0; j < blocks_per_group; ++j) per_block[g * blocks_per_group + j] = value;
  }
}

// Quantizes one row of K floats to int16 in blocks of 32: q = round(x * (1 / d)),
// d = amax / 32767 (ties to even). Stores d and the exact float sum of the block.
inline void quantize_row(const float* x, int64_t k, int16_t* q, float* d, float* sums) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f, sum = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : sum)
    for (int64_t i = 0; i < kBlock; ++i) {
      amax = std::max(amax, std::fabs(xb[i]));
      sum += xb[i];
    }
    const float scale = amax / kLevels;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    for (int64_t i = 0; i < kBlock; ++i) {
      q[b * kBlock + i] = static_cast<int16_t>(std::nearbyint(xb[i] * inv));
    }
    d[b] = scale;
    sums[b] = sum;
  }
}

// 32 weights widened to int16, one block's dot product with 32 int16 activations, and a
// float accumulator: one 512-bit register each with AVX-512, two 256-bit halves with AVX2.
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
using Weights16 = __m512i;
using Accumulator = __m512;
inline Accumulator zero_accumulator() { return _mm512_setzero_ps(); }
inline Weights16 widen_int8(const int8_t* w) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
}
inline void widen_nibbles(const uint8_t* w, Weights16& low, Weights16& high) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  low = _mm512_cvtepu8_epi16(_mm256_and_si256(packed, mask));
  high = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(packed, 4), mask));
}
inline Accumulator block_fma(Weights16 w, const int16_t* x, float scale, Accumulator acc) {
  const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(scale), acc);
}
// The same with one scale for inputs 0..15 and another for 16..31 (groups of 16): lane i of
// the dot product holds inputs 2i and 2i + 1, so lanes 0-7 are the first half.
inline Accumulator block_fma_halves(Weights16 w, const int16_t* x, float scale_low,
                                    float scale_high, Accumulator acc) {
  const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x));
  const __m512 scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(scale_low),
                                            _mm512_set1_ps(scale_high));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
}
inline float accumulator_sum(Accumulator acc) { return _mm512_reduce_add_ps(acc); }
inline Accumulator accumulator_add(Accumulator a, Accumulator b) { return _mm512_add_ps(a, b); }
#elif defined(__AVX2__)
struct Weights16 {
  __m256i first, second;
};
using Accumulator = __m256;
inline Accumulator zero_accumulator() { return _mm256_setzero_ps(); }
inline Weights16 widen_int8(const int8_t* w) {
  const __m128i* p = reinterpret_cast<const __m128i*>(w);
  return {_mm256_cvtepi8_epi16(_mm_loadu_si128(p)), _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1))};
}
inline void widen_nibbles(const uint8_t* w, Weights16& low, Weights16& high) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i l = _mm256_and_si256(packed, mask);
  const __m256i h = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
  low = {_mm256_cvtepu8_epi16(_mm256_castsi256_si128(l)),
         _mm256_cvtepu8_epi16(_mm256_extracti128_si256(l, 1))};
  high = {_mm256_cvtepu8_epi16(_mm256_castsi256_si128(h)),
          _mm256_cvtepu8_epi16(_mm256_extracti128_si256(h, 1))};
}
inline Accumulator block_fma(const Weights16& w, const int16_t* x, float scale,
                             Accumulator acc) {
  const __m256i* xv = reinterpret_cast<const __m256i*>(x);
  const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(w.first, _mm256_loadu_si256(xv)),
                                       _mm256_madd_epi16(w.second, _mm256_loadu_si256(xv + 1)));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale), acc);
}
// Groups of 16: the first register holds inputs 0..15, the second 16..31.
inline Accumulator block_fma_halves(const Weights16& w, const int16_t* x, float scale_low,
                                    float scale_high, Accumulator acc) {
  const __m256i* xv = reinterpret_cast<const __m256i*>(x);
  const __m256i low = _mm256_madd_epi16(w.first, _mm256_loadu_si256(xv));
  const __m256i high = _mm256_madd_epi16(w.second, _mm256_loadu_si256(xv + 1));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(low), _mm256_set1_ps(scale_low), acc);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(high), _mm256_set1_ps(scale_high), acc);
}
inline Accumulator accumulator_add(Accumulator a, Accumulator b) { return _mm256_add_ps(a, b); }
inline float accumulator_sum(Accumulator v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
struct Weights16 {
  int16_t v[kBlock];
};
using Accumulator = float;
inline Accumulator zero_accumulator() { return 0.f; }
inline Weights16 widen_int8(const int8_t* w) {
  Weights16 out;
  for (int64_t i = 0; i < kBlock; ++i) out.v[i] = w[i];
  return out;
}
inline void widen_nibbles(const uint8_t* w, Weights16& low, Weights16& high) {
  for (int64_t i = 0; i < kBlock; ++i) {
    low.v[i] = w[i] & 15;
    high.v[i] = w[i] >> 4;
  }
}
inline Accumulator block_fma(const Weights16& w, const int16_t* x, float scale,
                             Accumulator acc) {
  int32_t dot = 0;
  for (int64_t i = 0; i < kBlock; ++i) dot += int32_t(w.v[i]) * int32_t(x[i]);
  return acc + float(dot) * scale;
}
inline Accumulator block_fma_halves(const Weights16& w, const int16_t* x, float scale_low,
                                    float scale_high, Accumulator acc) {
  int32_t low = 0, high = 0;
  for (int64_t i = 0; i < kBlock / 2; ++i) low += int32_t(w.v[i]) * int32_t(x[i]);
  for (int64_t i = kBlock / 2; i < kBlock; ++i) high += int32_t(w.v[i]) * int32_t(x[i]);
  return acc + float(low) * scale_low + float(high) * scale_high;
}
inline float accumulator_sum(Accumulator acc) { return acc; }
inline Accumulator accumulator_add(Accumulator a, Accumulator b) { return a + b; }
#endif

struct Activations {
  const int16_t* q;   // [M, K]
  const float* d;     // [M, K/32]
  const float* sums;  // [M, K/32]
  int64_t k;
};

// The int16 blocks of up to `rows` rows of `width` floats, owned: what every kernel that
// reads Activations quantizes its input into (the dot products, the GEMM, the decode step).
struct RowBlocks {
  std::vector<int16_t> q;
  std::vector<float> d, sums;
  int64_t k = 0;
  void resize(int64_t rows, int64_t width) {
    k = width;
    q.resize(static_cast<size_t>(rows * width));
    d.resize(static_cast<size_t>(rows * width / kBlock));
    sums.resize(static_cast<size_t>(rows * width / kBlock));
  }
  // Row `row` from its k floats at x.
  void quantize(const float* x, int64_t row) {
    const int64_t blocks = k / kBlock;
    quantize_row(x, k, q.data() + row * k, d.data() + row * blocks, sums.data() + row * blocks);
  }
  Activations view() const { return {q.data(), d.data(), sums.data(), k}; }
};

}  // namespace kvrelay_cpu::qdot
