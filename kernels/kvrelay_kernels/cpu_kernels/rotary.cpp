// Rotary position embedding on CPU, in place, for float32 query and key rows.
//
// The reference (kvrelay_kernels.reference.rotary) gathers the cos/sin rows, splits and
// concatenates the halves and writes the result back: about twenty tensor ops per layer.
// Here each token's heads are rotated where they lie (rows may be strided, as slices of
// the fused QKV output are), reading cos and sin from the model's table by position.
// Pairing as the reference: NeoX style pairs feature i with i + rot_dim / 2, GPT-J style
// pairs adjacent features; only the first rot_dim features of a head rotate.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "rotary.h"

#include <cstdint>

namespace {

using kvrelay_cpu::rotate_heads;

template <typename Index>
void rotate(const Index* positions, int64_t tokens, float* x, int64_t row_stride, int64_t heads,
            int64_t head_size, const float* table, int64_t table_rows, int64_t rot_dim,
            bool neox) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(positions[t] >= 0 && static_cast<int64_t>(positions[t]) < table_rows,
                "position ", static_cast<int64_t>(positions[t]), " is outside the table of ",
                table_rows, " positions");
  }
  at::parallel_for(0, tokens, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* cos = table + static_cast<int64_t>(positions[t]) * rot_dim;
      rotate_heads(x + t * row_stride, heads, head_size, cos, half, neox);
    }
  });
}

void rotary_one(const at::Tensor& positions, at::Tensor& x, const at::Tensor& table,
                int64_t head_size, bool neox) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "query/key must be float32 [tokens, heads * head_size], rows may be strided");
  const int64_t tokens = x.size(0), heads = x.size(1) / head_size, rot_dim = table.size(1);
  if (positions.scalar_type() == at::kLong) {
    rotate(positions.data_ptr<int64_t>(), tokens, x.data_ptr<float>(), x.stride(0), heads,
           head_size, table.data_ptr<float>(), table.size(0), rot_dim, neox);
  } else {
    rotate(positions.data_ptr<int32_t>(), tokens, x.data_ptr<float>(), x.stride(0), heads,
           head_size, table.data_ptr<float>(), table.size(0), rot_dim, neox);
  }
}

void rotary_embedding(const at::Tensor& positions, at::Tensor query, at::Tensor key,
                      const at::Tensor& cos_sin_cache, int64_t head_size, bool is_neox) {
  TORCH_CHECK(cos_sin_cache.scalar_type() == at::kFloat && cos_sin_cache.is_contiguous() &&
              cos_sin_cache.dim() == 2, "cos_sin_cache must be contiguous float32 2-D");
  TORCH_CHECK(positions.is_contiguous() && (positions.scalar_type() == at::kLong ||
                                            positions.scalar_type() == at::kInt),
              "positions must be contiguous int64 or int32");
  TORCH_CHECK(cos_sin_cache.size(1) <= head_size && cos_sin_cache.size(1) % 2 == 0,
              "rotary dim must be even and at most head_size");
  rotary_one(positions, query, cos_sin_cache, head_size, is_neox);
  rotary_one(positions, key, cos_sin_cache, head_size, is_neox);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, "
        "Tensor cos_sin_cache, int head_size, bool is_neox) -> ()");
  m.impl("rotary_embedding", c10::DispatchKey::CPU, &rotary_embedding);
}
