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

#if defined(__AVX512F__)
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  const __m512i exponent = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(_mm512_max_ps(n, _mm512_set1_ps(-126.f))),
                       _mm512_set1_epi32(127)), 23);
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);
  return _mm512_maskz_mul_ps(kept, p, _mm512_castsi512_ps(exponent));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                   _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.f));
  const __m256i exponent = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.f))),
                       _mm256_set1_epi32(127)), 23);
  const __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_NLT_UQ);
  return _mm256_and_ps(kept, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}
#endif

// s[t] = exp(s[t] - shift) for t < n (every s[t] - shift <= 0); returns their sum.
inline float exp_shifted_sum(float* s, int64_t n, float shift) {
  int64_t t = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 total = _mm512_setzero_ps();
  for (; t + 16 <= n; t += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), _mm512_set1_ps(shift)));
    _mm512_storeu_ps(s + t, e);
    total = _mm512_add_ps(total, e);
  }
  sum = _mm512_reduce_add_ps(total);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 total = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(shift)));
    _mm256_storeu_ps(s + t, e);
    total = _mm256_add_ps(total, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  for (float lane : lanes) sum += lane;
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
