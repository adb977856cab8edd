// The integer dot products of the quantized linear kernels, shared by the per-op kernel
// (quantized_linear.cpp) and the whole-step decode (decode_step.cpp), so both compute every
// output channel with the same instructions in the same order: bit for bit the same
// result, whichever door a product comes through. quantized_linear.cpp says why the
// activations are int16 blocks and how the layouts are read.
#pragma once

#include "int16_dot_isa.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvrelay_cpu::qdot {

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
