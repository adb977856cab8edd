// exp(x - shift) over a row of attention scores, and its sum: the online softmax's inner
// loop, vectorised by hand.
//
// GCC left this loop scalar even under `omp simd`, and with SmolLM2's shapes it and the
// row maximum took most of a prompt's tiled attention beside the two sgemm products per
// tile (perf, one thread); by hand, a 512-token chunk's attention takes 4.7-5.8 ms, not 8.2
// (benchmarks/cpu_attention.py, AVX-512).
// The vector code is the scalar polynomial lane for lane, with the same fused
// multiply-adds; only the order of the row sum differs.

#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvrelay_cpu {

// exp(x) for x <= 0 (std::exp does not vectorise without -ffast-math): x = n ln2 + r with
// |r| <= ln2 / 2, exp(r) by the classic Cephes expf polynomial (about 1 ulp), 2^n built in
// the exponent bits. Below -87 the result is 0 (exp(-inf) included).
inline float exp_nonpositive(float x) {
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(std::max(n, -126.f)) + 127) << 23;
  return x < -87.f ? 0.f : p * __builtin_bit_cast(float, bits);
}

// The few vector operations the polynomial needs, per instruction-set level.
#if defined(__AVX512F__)
#define KVRELAY_SOFTMAX_VECTOR 1
namespace softmax_vec {
using Vec = __m512;
constexpr int64_t kWidth = 16;
inline Vec splat(float v) { return _mm512_set1_ps(v); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
inline Vec floor(Vec v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
// 2^n for whole n in [-126, 127]
inline Vec exp2_whole(Vec n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
// v where x >= limit, else 0
inline Vec zero_below(Vec x, float limit, Vec v) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, splat(limit), _CMP_NLT_UQ), v);
}
inline float sum(Vec v) { return _mm512_reduce_add_ps(v); }
}  // namespace softmax_vec
#elif defined(__AVX2__) && defined(__FMA__)
#define KVRELAY_SOFTMAX_VECTOR 1
namespace softmax_vec {
using Vec = __m256;
constexpr int64_t kWidth = 8;
inline Vec splat(float v) { return _mm256_set1_ps(v); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline Vec floor(Vec v) { return _mm256_floor_ps(v); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec exp2_whole(Vec n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline Vec zero_below(Vec x, float limit, Vec v) {
  return _mm256_and_ps(_mm256_cmp_ps(x, splat(limit), _CMP_NLT_UQ), v);
}
inline float sum(Vec v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float total = 0.f;
  for (float lane : lanes) total += lane;
  return total;
}
}  // namespace softmax_vec
#endif

#ifdef KVRELAY_SOFTMAX_VECTOR
// exp_nonpositive, a vector of lanes at a time.
inline softmax_vec::Vec exp_nonpositive(softmax_vec::Vec x) {
  using namespace softmax_vec;
  const Vec n = floor(fmadd(x, splat(1.44269504088896341f), splat(0.5f)));
  const Vec r = fmadd(n, splat(2.12194440e-4f), fnmadd(n, splat(0.693359375f), x));
  Vec p = splat(1.9875691500e-4f);
  p = fmadd(p, r, splat(1.3981999507e-3f));
  p = fmadd(p, r, splat(8.3334519073e-3f));
  p = fmadd(p, r, splat(4.1665795894e-2f));
  p = fmadd(p, r, splat(1.6666665459e-1f));
  p = fmadd(p, r, splat(5.0000001201e-1f));
  p = add(fmadd(mul(p, r), r, r), splat(1.f));
  return zero_below(x, -87.f, mul(p, exp2_whole(max(n, splat(-126.f)))));
}
#endif

// s[t] = exp(s[t] - shift) for t < n (every s[t] - shift <= 0); returns their sum.
inline float exp_shifted_sum(float* s, int64_t n, float shift) {
  int64_t t = 0;
  float sum = 0.f;
#ifdef KVRELAY_SOFTMAX_VECTOR
  using softmax_vec::kWidth;
  softmax_vec::Vec total = softmax_vec::splat(0.f);
  for (; t + kWidth <= n; t += kWidth) {
    const softmax_vec::Vec e = exp_nonpositive(
        softmax_vec::sub(softmax_vec::load(s + t), softmax_vec::splat(shift)));
    softmax_vec::store(s + t, e);
    total = softmax_vec::add(total, e);
  }
  sum = softmax_vec::sum(total);
#endif
  for (; t < n; ++t) {
    s[t] = exp_nonpositive(s[t] - shift);
    sum += s[t];
  }
  return sum;
}

// The largest of init and s[begin, end).
inline float row_max(const float* s, int64_t begin, int64_t end, float init) {
  float best = init;
#pragma omp simd reduction(max : best)
  for (int64_t t = begin; t < end; ++t) best = std::max(best, s[t]);
  return best;
}

}  // namespace kvrelay_cpu
