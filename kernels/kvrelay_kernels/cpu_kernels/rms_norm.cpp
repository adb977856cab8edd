// RMSNorm and the fused residual add + RMSNorm on CPU, one pass per row.
//
// The reference (kvrelay_kernels.reference.norm) is four to six tensor ops per call, each a
// pass over the row and a dispatch; a decode step calls it twice per layer, so on a small
// model the calls cost more than the arithmetic. Here one loop per row sums the squares
// and a second writes weight * x / sqrt(mean(x^2) + eps): the reference's operations in
// float32, with the sum of squares in a different order (float rounding apart, equal).
// Rows are split across ATen's intra-op threads only when there are many.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "rms_norm.h"

#include <cmath>
#include <cstdint>
#include <tuple>

namespace {

constexpr int64_t kRowsPerTask = 16;

using kvrelay_cpu::normalize_row;

void check_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "x and weight must be float32");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && weight.is_contiguous() &&
              weight.numel() == x.size(-1), "x must be contiguous, weight [x.size(-1)]");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_args(x, weight);
  const int64_t size = x.size(-1), rows = size ? x.numel() / size : 0;
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      normalize_row(xp + r * size, wp, static_cast<float>(eps), size, op + r * size);
    }
  });
  return out;
}

// (rms_norm(x + residual), x + residual), the sum written once and normalized from cache.
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  check_args(x, weight);
  TORCH_CHECK(residual.scalar_type() == at::kFloat && residual.is_contiguous() &&
              residual.sizes() == x.sizes(), "residual must be float32 shaped like x");
  const int64_t size = x.size(-1), rows = size ? x.numel() / size : 0;
  at::Tensor out = at::empty_like(x), summed = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* sp = summed.data_ptr<float>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* s = sp + r * size;
#pragma omp simd
      for (int64_t i = 0; i < size; ++i) s[i] = rp[r * size + i] + xp[r * size + i];
      normalize_row(s, wp, static_cast<float>(eps), size, op + r * size);
    }
  });
  return {out, summed};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm);
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
        "-> (Tensor, Tensor)");
  m.impl("fused_add_rms_norm", c10::DispatchKey::CPU, &fused_add_rms_norm);
}
