// Paged attention on CPU that reads K/V straight from the blocks a block table names.
//
// The PyTorch reference gathers every sequence's blocks into a padded copy and hands it to
// SDPA: at decode that copy is written and read again, tripling the KV memory traffic.
// Here one task per (sequence, KV head) walks the sequence's context tile by tile, reading
// each key and value row once for every query head of its GQA group, with an online
// (running max / running sum) softmax in float32. Tasks run on ATen's intra-op thread
// pool, so torch.set_num_threads governs them like every other CPU op.
//
// Semantics match kvrelay_kernels.reference.paged_attention: query token j of a sequence
// with q new tokens and context length L sits at position p = L - q + j and sees keys
// max(0, p - W + 1) .. p (W: sliding window, 0 for none); scores are scale * q.k, then
// c * tanh(s / c) when a softcap c > 0 is given. Nothing outside that range is read.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "attend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using kvrelay_cpu::attend::attend_task;

// Attention for every sequence with 1..max_query_len new tokens; the others are left to
// the caller (their rows of `out` are not touched).
void paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     double scale, double softcap, int64_t window, int64_t max_query_len,
                     at::Tensor out) {
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_start_loc.scalar_type() == at::kInt &&
              seq_lens.scalar_type() == at::kInt, "index tensors must be int32");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() &&
              block_tables.is_contiguous() && query_start_loc.is_contiguous() &&
              seq_lens.is_contiguous(), "caches and index tensors must be contiguous");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "head dim must be contiguous");
  TORCH_CHECK(query.scalar_type() == key_cache.scalar_type() &&
              out.scalar_type() == key_cache.scalar_type(), "one dtype for all tensors");
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_heads = query.size(1), head_size = query.size(2);
  const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t table_width = block_tables.size(1);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, query.scalar_type(),
                                  "kvrelay_paged_attention_cpu", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* k = key_cache.data_ptr<scalar_t>();
    const scalar_t* v = value_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t first, int64_t last) {
      for (int64_t task = first; task < last; ++task) {
        const int64_t seq = task / num_kv_heads, kv_head = task % num_kv_heads;
        const int64_t q_len = starts[seq + 1] - starts[seq];
        if (q_len < 1 || q_len > max_query_len) continue;
        attend_task<scalar_t>(seq, kv_head, q, query.stride(0), query.stride(1), k, v,
                              block_size, num_kv_heads, head_size, tables + seq * table_width,
                              starts[seq], q_len, lens[seq], group, static_cast<float>(scale),
                              static_cast<float>(softcap), window, o, out.stride(0),
                              out.stride(1));
      }
    });
  });
}

// How many threads one of our at::parallel_for calls really runs on: torch's thread count
// when the library was built with OpenMP, 1 when it was not (ATen's parallel_for is a
// header template that then runs serially whatever torch.set_num_threads says).
int64_t parallel_team_size() {
  const int64_t n = at::get_num_threads();
  std::vector<std::atomic<bool>> seen(static_cast<size_t>(n));
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const int64_t id = at::get_thread_num();
    if (id >= 0 && id < n) seen[static_cast<size_t>(id)].store(true);
  });
  int64_t team = 0;
  for (const auto& s : seen) team += s.load() ? 1 : 0;
  return team;
}

}  // namespace

TORCH_LIBRARY(kvrelay_cpu, m) {
  m.def("paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, float softcap, int window, "
        "int max_query_len, Tensor(a!) out) -> ()");
  m.impl("paged_attention", c10::DispatchKey::CPU, &paged_attention);
  m.def("parallel_team_size() -> int", &parallel_team_size);
}
