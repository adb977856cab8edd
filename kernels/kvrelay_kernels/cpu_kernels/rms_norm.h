// One row of RMSNorm, shared by the per-op kernel (rms_norm.cpp) and the whole-step decode
// (decode_step.cpp) so that both give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvrelay_cpu {

inline void normalize_row(const float* x, const float* weight, float eps, int64_t size,
                          float* out) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < size; ++i) squares += x[i] * x[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(size) + eps);
#pragma omp simd
  for (int64_t i = 0; i < size; ++i) out[i] = weight[i] * (x[i] * inv);
}

}  // namespace kvrelay_cpu
