// Rotating one token's heads in place, shared by the per-op kernel (rotary.cpp) and the
// whole-step decode (decode_step.cpp) so that both give the same bits. ``cos`` is the
// token's row of the table (rot_dim / 2 cosines, then as many sines).
#pragma once

#include <cstdint>

namespace kvrelay_cpu {

inline void rotate_heads(float* row, int64_t heads, int64_t head_size, const float* cos,
                         int64_t half, bool neox) {
  const float* sin = cos + half;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = row + h * head_size;
    if (neox) {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i] + a * sin[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos[i] - b * sin[i];
        v[2 * i + 1] = b * cos[i] + a * sin[i];
      }
    }
  }
}

}  // namespace kvrelay_cpu
