// Writing new K/V rows into the paged cache on CPU: one copy per token and head.
//
// The reference (kvrelay_kernels.reference.kv_store) is written so that a CUDA graph can
// capture it: no host reads, padding rows redirected with where/argmax/index, then two
// index_copy_ calls, about a dozen tensor ops per layer. On CPU nothing is captured, so
// here each token's rows are copied straight to their slot, and slot -1 (padding) is
// skipped. Unquantized caches of the keys' own dtype only (the caller checks).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

template <typename Index>
void store(const Index* slots, int64_t tokens, const at::Tensor& rows, at::Tensor& cache) {
  const int64_t heads = rows.size(1), head_size = rows.size(2);
  const int64_t bytes = head_size * rows.element_size();
  const int64_t capacity = cache.size(0) * cache.size(1);
  const char* src = static_cast<const char*>(rows.data_ptr());
  char* dst = static_cast<char*>(cache.data_ptr());
  const int64_t slot_bytes = heads * bytes;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = static_cast<int64_t>(slots[t]);
    if (slot < 0) continue;
    TORCH_CHECK(slot < capacity, "slot ", slot, " is outside the cache of ", capacity);
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(dst + slot * slot_bytes + h * bytes,
                  src + (t * rows.stride(0) + h * rows.stride(1)) * rows.element_size(), bytes);
    }
  }
}

void store_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                    at::Tensor value_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type() &&
              value.scalar_type() == value_cache.scalar_type(), "one dtype for rows and cache");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "head rows must be contiguous");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() &&
              slot_mapping.is_contiguous(), "caches and slots must be contiguous");
  const int64_t tokens = slot_mapping.numel();
  if (slot_mapping.scalar_type() == at::kLong) {
    store(slot_mapping.data_ptr<int64_t>(), tokens, key, key_cache);
    store(slot_mapping.data_ptr<int64_t>(), tokens, value, value_cache);
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::kInt, "slots must be int64 or int32");
    store(slot_mapping.data_ptr<int32_t>(), tokens, key, key_cache);
    store(slot_mapping.data_ptr<int32_t>(), tokens, value, value_cache);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("store_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) "
        "value_cache, Tensor slot_mapping) -> ()");
  m.impl("store_kv_cache", c10::DispatchKey::CPU, &store_kv_cache);
}
