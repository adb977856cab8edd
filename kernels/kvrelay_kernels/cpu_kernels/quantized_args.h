// The checks both quantized linear kernels make of their arguments: float32 activations
// [M, K] and a weight in kvrelay_kernels.quantized_weight's layout (int8 [N, K] or int4
// [N, K/2], scales and minimums [N, K / group_size] in float32 or float16: minimums always
// for int4, optional for int8; an optional float32 bias [N]). Each kernel adds what its
// own loops need.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvrelay_cpu {

inline void check_quantized_linear_args(const at::Tensor& x, const at::Tensor& qweight,
                                        const at::Tensor& scales,
                                        const c10::optional<at::Tensor>& mins, int64_t bits,
                                        int64_t group_size,
                                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  const int64_t k = x.size(1), n = qweight.size(0);
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() &&
              qweight.size(1) == (bits == 8 ? k : k / 2), "qweight does not match x's K");
  TORCH_CHECK(group_size > 0 && k % group_size == 0, "group_size must divide K");
  TORCH_CHECK(scales.dim() == 2 && scales.is_contiguous() && scales.size(0) == n &&
              scales.size(1) == k / group_size, "scales must be [N, K / group_size]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf,
              "scales must be float32 or float16");
  TORCH_CHECK(bits == 8 || mins.has_value(), "int4 needs mins");
  TORCH_CHECK(!mins || (mins->is_contiguous() && mins->scalar_type() == scales.scalar_type() &&
                        mins->sizes() == scales.sizes()),
              "mins must be shaped and typed like scales");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n &&
                        bias->is_contiguous()), "bias must be float32 [N]");
}

}  // namespace kvrelay_cpu
