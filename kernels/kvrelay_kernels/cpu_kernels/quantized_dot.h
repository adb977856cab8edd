// The integer dot products of the quantized linear kernels, shared by the per-op kernel
// (quantized_linear.cpp) and the whole-step decode (decode_step.cpp), so both compute every
// output channel with the same instructions in the same order: bit for bit the same
// result, whichever door a product comes through. quantized_linear.cpp says why the
// activations are int16 blocks and how the layouts are read.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

// out[r] = sum over the row of w * x for R activation rows (int8 weights). R is a
// template argument so that the accumulators stay in registers.
template <int R>
void int8_row(const int8_t* w, const float* scales, const Activations& a, int64_t first,
              float* out) {
  const int64_t blocks = a.k / kBlock;
  Accumulator acc[R];
  for (int r = 0; r < R; ++r) acc[r] = zero_accumulator();
  for (int64_t b = 0; b < blocks; ++b) {
    const Weights16 wv = widen_int8(w + b * kBlock);
    for (int r = 0; r < R; ++r) {
      const int64_t row = first + r;
      acc[r] = block_fma(wv, a.q + row * a.k + b * kBlock, scales[b] * a.d[row * blocks + b],
                         acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = accumulator_sum(acc[r]);
}

// int8 weights in groups of 16 (GGUF's Q6_K): two scales per activation block.
template <int R>
void int8_row_halves(const int8_t* w, const float* half_scales, const Activations& a,
                     int64_t first, float* out) {
  const int64_t blocks = a.k / kBlock;
  Accumulator acc[R];
  for (int r = 0; r < R; ++r) acc[r] = zero_accumulator();
  for (int64_t b = 0; b < blocks; ++b) {
    const Weights16 wv = widen_int8(w + b * kBlock);
    for (int r = 0; r < R; ++r) {
      const int64_t row = first + r;
      const float d = a.d[row * blocks + b];
      acc[r] = block_fma_halves(wv, a.q + row * a.k + b * kBlock, half_scales[2 * b] * d,
                                half_scales[2 * b + 1] * d, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = accumulator_sum(acc[r]);
}

// Adds sum over blocks of min * sum(x) to R outputs (int8 weights with minimums).
template <int R>
void add_min_terms(const float* mins, const Activations& a, int64_t first, float* out) {
  const int64_t blocks = a.k / kBlock;
  for (int r = 0; r < R; ++r) {
    const float* sums = a.sums + (first + r) * blocks;
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t b = 0; b < blocks; ++b) total += mins[b] * sums[b];
    out[r] += total;
  }
}

// The same for int4 weights with minimums (the row-halves nibble packing).
template <int R>
void int4_row(const uint8_t* w, const float* scales, const float* mins, const Activations& a,
              int64_t first, float* out) {
  const int64_t blocks = a.k / kBlock, half_blocks = blocks / 2;
  float min_terms[R];
  for (int r = 0; r < R; ++r) min_terms[r] = 0.f;
  for (int r = 0; r < R; ++r) {
    const float* sums = a.sums + (first + r) * blocks;
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t b = 0; b < blocks; ++b) total += mins[b] * sums[b];
    min_terms[r] = total;
  }
  Accumulator acc[R], acc_high[R];  // two chains, so one fma need not wait for the other
  for (int r = 0; r < R; ++r) acc[r] = acc_high[r] = zero_accumulator();
  for (int64_t c = 0; c < half_blocks; ++c) {
    Weights16 low, high;
    widen_nibbles(w + c * kBlock, low, high);
    const int64_t bh = c + half_blocks;
    for (int r = 0; r < R; ++r) {
      const int64_t row = first + r;
      const int16_t* xq = a.q + row * a.k;
      const float* d = a.d + row * blocks;
      acc[r] = block_fma(low, xq + c * kBlock, scales[c] * d[c], acc[r]);
      acc_high[r] = block_fma(high, xq + bh * kBlock, scales[bh] * d[bh], acc_high[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    out[r] = accumulator_sum(acc[r]) + accumulator_sum(acc_high[r]) + min_terms[r];
  }
}

// Calls f with std::integral_constant<int, rows> (1 to kRowsPerPass).
template <typename F>
void dot_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// Few activation rows against weights in blocks of 32 (groups of 32: GGUF's Q4_0, Q4_1,
// Q8_0 and the K-quants' sub-blocks), decode's case. For each row the per-block products
// of weight and activation scales are computed eight at a time before the dot products,
// and with minimums sum(min * sum(x)) too, so the inner loop does nothing per block but
// the integer dot products (the weights widened once for up to four rows) and one
// multiply-add per row; each row's two accumulators share one final sum.
#if defined(__AVX2__) && defined(__F16C__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// comb[b] = scale[b] * d[b]; returns sum over b of min[b] * sums[b] (0 without minimums).
template <typename S>
inline float one_row_scales(const S* scales, const S* mins, const float* d, const float* sums,
                            int64_t blocks, float* comb) {
  __m256 terms = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    _mm256_storeu_ps(comb + b, _mm256_mul_ps(load8(scales + b), _mm256_loadu_ps(d + b)));
    if (mins) terms = _mm256_fmadd_ps(load8(mins + b), _mm256_loadu_ps(sums + b), terms);
  }
  float tail = 0.f;
  for (; b < blocks; ++b) {
    comb[b] = to_float(scales[b]) * d[b];
    if (mins) tail = std::fma(to_float(mins[b]), sums[b], tail);
  }
  return mins ? sum8(terms) + tail : 0.f;
}

// R activation rows (row stride k) against one weight row; comb is [R][blocks].
template <int R>
inline void int4_block_rows(const uint8_t* w, const float* comb, const int16_t* x, int64_t k,
                            int64_t blocks, float* out) {
  const int64_t half = blocks / 2;
  Accumulator acc[R], acc_high[R];
  for (int r = 0; r < R; ++r) acc[r] = acc_high[r] = zero_accumulator();
  for (int64_t c = 0; c < half; ++c) {
    Weights16 low, high;
    widen_nibbles(w + c * kBlock, low, high);
    for (int r = 0; r < R; ++r) {
      const int16_t* xr = x + r * k;
      const float* cr = comb + r * blocks;
      acc[r] = block_fma(low, xr + c * kBlock, cr[c], acc[r]);
      acc_high[r] = block_fma(high, xr + (c + half) * kBlock, cr[c + half], acc_high[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = accumulator_sum(accumulator_add(acc[r], acc_high[r]));
}

template <int R>
inline void int8_block_rows(const int8_t* w, const float* comb, const int16_t* x, int64_t k,
                            int64_t blocks, float* out) {
  Accumulator acc[R], acc_odd[R];  // two chains, so one fma need not wait for the other
  for (int r = 0; r < R; ++r) acc[r] = acc_odd[r] = zero_accumulator();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const Weights16 even = widen_int8(w + b * kBlock), odd = widen_int8(w + (b + 1) * kBlock);
    for (int r = 0; r < R; ++r) {
      const int16_t* xr = x + r * k;
      const float* cr = comb + r * blocks;
      acc[r] = block_fma(even, xr + b * kBlock, cr[b], acc[r]);
      acc_odd[r] = block_fma(odd, xr + (b + 1) * kBlock, cr[b + 1], acc_odd[r]);
    }
  }
  if (b < blocks) {
    const Weights16 last = widen_int8(w + b * kBlock);
    for (int r = 0; r < R; ++r) {
      acc[r] = block_fma(last, x + r * k + b * kBlock, comb[r * blocks + b], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = accumulator_sum(accumulator_add(acc[r], acc_odd[r]));
}
#define KVRELAY_ONE_ROW_BLOCKS 1
#endif

// One quantized matrix as the loops read it (kvrelay_kernels.quantized_weight's layout).
template <typename S>
struct QuantizedMatrix {
  const uint8_t* w;  // [n, packed] bytes
  const S* scales;   // [n, groups]
  const S* mins;     // [n, groups] or nullptr
  int64_t n, packed, groups, bits, group;
};

// Output channels [lo, hi) of x @ W.T (+ bias) for the m activation rows of ``a``, written
// to out[row * out_stride + channel]. Each channel is computed whole by the caller's thread,
// up to kRowsPerPass rows per pass over its weight row, so splitting the channels among
// threads any way gives the same bits.
template <typename S>
void dot_channels(const QuantizedMatrix<S>& q, const Activations& a, int64_t m,
                  const float* bias, float* out, int64_t out_stride, int64_t lo, int64_t hi) {
  float values[kRowsPerPass];
#ifdef KVRELAY_ONE_ROW_BLOCKS
  if (q.group == kBlock) {
    const int64_t blocks = a.k / kBlock;
    float comb[kRowsPerPass * kMaxBlocks], min_terms[kRowsPerPass];
    for (int64_t ch = lo; ch < hi; ++ch) {
      const uint8_t* row = q.w + ch * q.packed;
      const S* mins = q.mins ? q.mins + ch * q.groups : nullptr;
      for (int64_t first = 0; first < m; first += kRowsPerPass) {
        const int64_t rows = std::min(kRowsPerPass, m - first);
        for (int64_t r = 0; r < rows; ++r) {
          min_terms[r] = one_row_scales(q.scales + ch * q.groups, mins,
                                        a.d + (first + r) * blocks,
                                        a.sums + (first + r) * blocks, blocks,
                                        comb + r * blocks);
        }
        const int16_t* x = a.q + first * a.k;
        dot_rows(rows, [&](auto r) {
          if (q.bits == 8) {
            int8_block_rows<decltype(r)::value>(reinterpret_cast<const int8_t*>(row), comb, x,
                                                a.k, blocks, values);
          } else {
            int4_block_rows<decltype(r)::value>(row, comb, x, a.k, blocks, values);
          }
        });
        const float b = bias ? bias[ch] : 0.f;
        for (int64_t r = 0; r < rows; ++r) {
          out[(first + r) * out_stride + ch] = values[r] + min_terms[r] + b;
        }
      }
    }
    return;
  }
#endif
  // Groups of 16 keep one scale per half block: per_group 1 copies them as they are.
  const bool halves = q.group < kBlock;
  const int64_t per_group = halves ? 1 : q.group / kBlock;
  float block_scales[2 * kMaxBlocks], block_mins[kMaxBlocks];
  for (int64_t ch = lo; ch < hi; ++ch) {
    const uint8_t* row = q.w + ch * q.packed;
    expand_per_block(q.scales + ch * q.groups, q.groups, per_group, block_scales);
    if (q.mins) expand_per_block(q.mins + ch * q.groups, q.groups, per_group, block_mins);
    for (int64_t first = 0; first < m; first += kRowsPerPass) {
      const int64_t rows = std::min(kRowsPerPass, m - first);
      if (q.bits == 8 && halves) {
        dot_rows(rows, [&](auto r) {
          int8_row_halves<decltype(r)::value>(reinterpret_cast<const int8_t*>(row),
                                              block_scales, a, first, values);
        });
      } else if (q.bits == 8) {
        dot_rows(rows, [&](auto r) {
          int8_row<decltype(r)::value>(reinterpret_cast<const int8_t*>(row), block_scales,
                                       a, first, values);
          if (q.mins) add_min_terms<decltype(r)::value>(block_mins, a, first, values);
        });
      } else {
        dot_rows(rows, [&](auto r) {
          int4_row<decltype(r)::value>(row, block_scales, block_mins, a, first, values);
        });
      }
      const float b = bias ? bias[ch] : 0.f;
      for (int64_t r = 0; r < rows; ++r) out[(first + r) * out_stride + ch] = values[r] + b;
    }
  }
}

}  // namespace kvrelay_cpu::qdot
