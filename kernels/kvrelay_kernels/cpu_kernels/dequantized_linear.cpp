// Quantized linear layers for many rows on CPU: dequantize a tile of output channels into
// cache, multiply it with the float GEMM.
//
// With many activation rows (prompt chunks, large decode batches) each weight is used
// many times, so the product is compute-bound and the float GEMM's blocked kernels win
// over integer dot products done row by row (quantized_linear.cpp). Up to 64 rows the
// packed weights are read once from memory: each task dequantizes a tile of about
// 256 KiB of float32 weights (a few dozen output channels), which stays in its core's
// cache while the float GEMM multiplies the whole batch by it, then moves to the next
// tile. From 64 rows on, GEMMs that narrow lose to one GEMM over the whole matrix on all
// threads (1.1-1.4x float32's time against 1.0-1.1x at 128-512 rows, measured on
// SmolLM2's shapes), so the whole matrix is dequantized first. Tasks run
// on ATen's intra-op threads; the GEMM inside a task runs on that thread alone. A pool
// thread does not carry the caller's InferenceMode, so each task dispatches its GEMM
// below autograd (as a kernel's own calls should be): otherwise writing into an
// inference-mode output from the second thread is refused.
//
// Dequantization computes q * s (+ m) in float32 per group, the operations of the
// PyTorch reference (kvrelay_kernels.reference.quantized_matmul.dequantize_weight); int8
// takes minimums too where given (GGUF's Q5_1, Q5_K) and any group size (Q6_K's 16).
// int4 needs each group inside one half of the row (K/2 a multiple of the group size),
// which keeps the loops simple and vectorizable; other layouts are refused.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "quantized_args.h"

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kTileFloats = 64 * 1024;  // 256 KiB of float32 weights per tile
constexpr int64_t kWholeMatrixRows = 64;     // from here on: one GEMM over the whole matrix

inline float as_float(float v) { return v; }
inline float as_float(c10::Half v) { return static_cast<float>(v); }

// Channels [first, last) of W as float32 rows into `tile` ([last - first, K]).
template <typename S>
void dequantize_channels(const uint8_t* qweight, const S* scales, const S* mins, int64_t bits,
                         int64_t k, int64_t group, int64_t first, int64_t last, float* tile) {
  const int64_t groups = k / group, packed = bits == 8 ? k : k / 2, half = k / 2;
  for (int64_t ch = first; ch < last; ++ch) {
    const uint8_t* row = qweight + ch * packed;
    float* out = tile + (ch - first) * k;
    const S* s = scales + ch * groups;
    const S* m = mins ? mins + ch * groups : nullptr;
    if (bits == 8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(row);
      if (m == nullptr) {
        for (int64_t g = 0; g < groups; ++g) {
          const float scale = as_float(s[g]);
          for (int64_t i = g * group; i < (g + 1) * group; ++i) out[i] = float(q[i]) * scale;
        }
        continue;
      }
      for (int64_t g = 0; g < groups; ++g) {  // int8 with minimums (GGUF's Q5_1, Q5_K)
        const float scale = as_float(s[g]), minimum = as_float(m[g]);
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          out[i] = float(q[i]) * scale + minimum;
        }
      }
      continue;
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = as_float(s[g]), minimum = as_float(m[g]);
      const int64_t start = g * group;
      if (start < half) {  // low nibbles of bytes start..start+group
        for (int64_t i = 0; i < group; ++i) {
          out[start + i] = float(row[start + i] & 15) * scale + minimum;
        }
      } else {  // high nibbles of bytes start-half..
        for (int64_t i = 0; i < group; ++i) {
          out[start + i] = float(row[start - half + i] >> 4) * scale + minimum;
        }
      }
    }
  }
}

// y = x @ W.T (+ bias) for float32 x [M, K]; W in kvrelay_kernels.quantized_weight's layout.
at::Tensor dequantized_linear(const at::Tensor& x, const at::Tensor& qweight,
                              const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                              int64_t bits, int64_t group_size,
                              const c10::optional<at::Tensor>& bias) {
  kvrelay_cpu::check_quantized_linear_args(x, qweight, scales, mins, bits, group_size, bias);
  const int64_t m = x.size(0), k = x.size(1), n = qweight.size(0);
  TORCH_CHECK(bits == 8 || (k % 2 == 0 && (k / 2) % group_size == 0),
              "int4 needs K/2 a multiple of group_size");
  const uint8_t* w = static_cast<const uint8_t*>(qweight.data_ptr());
  auto dequantize = [&](int64_t first, int64_t last, float* into) {
    if (scales.scalar_type() == at::kHalf) {
      dequantize_channels<c10::Half>(w, scales.data_ptr<c10::Half>(),
                                     mins ? mins->data_ptr<c10::Half>() : nullptr, bits, k,
                                     group_size, first, last, into);
    } else {
      dequantize_channels<float>(w, scales.data_ptr<float>(),
                                 mins ? mins->data_ptr<float>() : nullptr, bits, k,
                                 group_size, first, last, into);
    }
  };
  at::Tensor out;
  if (m >= kWholeMatrixRows) {
    // Enough rows that one GEMM over the whole matrix, on all threads, beats per-tile
    // GEMMs of a few dozen channels each; the float matrix is written once and read once.
    at::Tensor dense = at::empty({n, k}, x.options());
    float* dp = dense.data_ptr<float>();
    at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) { dequantize(lo, hi, dp + lo * k); });
    out = at::mm(x, dense.t());
  } else {
    out = at::empty({m, n}, x.options());
    const int64_t tile = std::max<int64_t>(8, kTileFloats / std::max<int64_t>(k, 1));
    const int64_t tiles = (n + tile - 1) / tile;
    at::parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::Tensor buffer = at::empty({tile, k}, x.options());
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t first = t * tile, last = std::min(n, first + tile), width = last - first;
        dequantize(first, last, buffer.data_ptr<float>());
        at::Tensor part = out.narrow(1, first, width);
        at::mm_out(part, x, buffer.narrow(0, 0, width).t());
      }
    });
  }
  if (bias) out.add_(*bias);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("dequantized_linear(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int bits, "
        "int group_size, Tensor? bias) -> Tensor");
  m.impl("dequantized_linear", c10::DispatchKey::CPU, &dequantized_linear);
}
