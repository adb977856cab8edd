// float32 vector operations at the build's instruction-set level, for the kernels that
// vectorise by hand (the integer GEMM's block epilogue, the softmax exponentials).
//
// One set of names over AVX-512 (16 lanes) or AVX2 with FMA (8 lanes), so a kernel's
// vector loop is written once; KVRELAY_FLOAT_VEC is defined only where one of them is
// built, and code without it keeps its scalar form.

#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <cstdint>

#if defined(__AVX512F__)
#define KVRELAY_FLOAT_VEC 1
namespace kvrelay_cpu::fvec {
using Vec = __m512;
using VecInt = __m512i;
constexpr int64_t kWidth = 16;
inline Vec splat(float v) { return _mm512_set1_ps(v); }
inline Vec zero() { return _mm512_setzero_ps(); }
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
inline Vec from_int32(VecInt v) { return _mm512_cvtepi32_ps(v); }
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
}  // namespace kvrelay_cpu::fvec
#elif defined(__AVX2__) && defined(__FMA__)
#define KVRELAY_FLOAT_VEC 1
namespace kvrelay_cpu::fvec {
using Vec = __m256;
using VecInt = __m256i;
constexpr int64_t kWidth = 8;
inline Vec splat(float v) { return _mm256_set1_ps(v); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline Vec floor(Vec v) { return _mm256_floor_ps(v); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec from_int32(VecInt v) { return _mm256_cvtepi32_ps(v); }
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
}  // namespace kvrelay_cpu::fvec
#endif
