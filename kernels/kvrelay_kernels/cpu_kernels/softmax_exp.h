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

#include "float_vec.h"

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

#ifdef KVRELAY_FLOAT_VEC
// exp_nonpositive, a vector of lanes at a time.
inline fvec::Vec exp_nonpositive(fvec::Vec x) {
  using namespace fvec;
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
#ifdef KVRELAY_FLOAT_VEC
  fvec::Vec total = fvec::zero();
  for (; t + fvec::kWidth <= n; t += fvec::kWidth) {
    const fvec::Vec e = exp_nonpositive(fvec::sub(fvec::load(s + t), fvec::splat(shift)));
    fvec::store(s + t, e);
    total = fvec::add(total, e);
  }
  sum = fvec::sum(total);
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
