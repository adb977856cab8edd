// The decode step's weights and the projection that reads them (decode_step.cpp): a layer's
// four projections (q|k|v, o, gate|up, down), each a list of parts, every part a run of
// output columns kept as float32 or in quantized_weight's layout; and `project`, which computes this thread's share of a
// projection's output channels, each channel whole, so any split gives the same bits.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "quantized_dot.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvrelay_cpu::decode_step {

namespace qdot = kvrelay_cpu::qdot;

constexpr int64_t kFloatRowsPerPass = 4;

// A run of output columns [first, first + n) of a projection, from one kept matrix.
struct Part {
  int64_t bits = 32;  // 32: float32 weight [n, k]; 8 or 4: quantized_weight's layout
  at::Tensor weight, scales, mins, bias;  // mins and bias may be undefined
  int64_t first = 0, n = 0, group = 0;
};

struct Projection {
  std::vector<Part> parts;
  int64_t n = 0, k = 0;
  bool quantized = false;  // some part reads the int16 activation blocks
};

struct Layer {
  at::Tensor input_norm, post_norm, cos_sin;
  Projection proj[4];  // q|k|v, o, gate|up, down
  int64_t window = 0;
  float softcap = 0.f;
};

// The int16 blocks of one projection input, per row (int16_dot_isa.h).
using Blocks = qdot::RowBlocks;

// Output channels [lo, hi) of a float32 [n, k] matrix for m rows of x (k floats each).
inline void float_channels(const float* w, const float* x, int64_t k, int64_t m, const float* bias,
                    float* out, int64_t out_stride, int64_t lo, int64_t hi) {
  for (int64_t ch = lo; ch < hi; ++ch) {
    const float* row = w + ch * k;
    for (int64_t first = 0; first < m; first += kFloatRowsPerPass) {
      const int64_t rows = std::min(kFloatRowsPerPass, m - first);
      float acc[kFloatRowsPerPass] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + (first + r) * k;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < k; ++i) sum += row[i] * xr[i];
        acc[r] = sum;
      }
      const float b = bias ? bias[ch] : 0.f;
      for (int64_t r = 0; r < rows; ++r) out[(first + r) * out_stride + ch] = acc[r] + b;
    }
  }
}

// This thread's share [lo, hi) of n items among nt threads.
inline void share(int64_t n, int tid, int nt, int64_t& lo, int64_t& hi) {
  lo = n * tid / nt;
  hi = n * (tid + 1) / nt;
}

// out[m, projection.n] = x @ W.T (+ bias), this thread's output channels of every part.
inline void project(const Projection& p, const float* x, const Blocks& blocks, int64_t m,
             float* out, int tid, int nt) {
  for (const Part& part : p.parts) {
    int64_t lo, hi;
    share(part.n, tid, nt, lo, hi);
    if (lo == hi) continue;
    const float* bias = part.bias.defined() ? part.bias.data_ptr<float>() : nullptr;
    float* dst = out + part.first;
    if (part.bits == 32) {
      float_channels(part.weight.data_ptr<float>(), x, p.k, m, bias, dst, p.n, lo, hi);
    } else if (part.scales.scalar_type() == at::kHalf) {
      const qdot::QuantizedMatrix<c10::Half> q{
          static_cast<const uint8_t*>(part.weight.data_ptr()), part.scales.data_ptr<c10::Half>(),
          part.mins.defined() ? part.mins.data_ptr<c10::Half>() : nullptr, part.n,
          part.weight.size(1), part.scales.size(1), part.bits, part.group};
      qdot::dot_channels(q, blocks.view(), m, bias, dst, p.n, lo, hi);
    } else {
      const qdot::QuantizedMatrix<float> q{
          static_cast<const uint8_t*>(part.weight.data_ptr()), part.scales.data_ptr<float>(),
          part.mins.defined() ? part.mins.data_ptr<float>() : nullptr, part.n,
          part.weight.size(1), part.scales.size(1), part.bits, part.group};
      qdot::dot_channels(q, blocks.view(), m, bias, dst, p.n, lo, hi);
    }
  }
}

}  // namespace kvrelay_cpu::decode_step
