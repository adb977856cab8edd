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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kTile = 128;  // keys scored before one softmax rescale
constexpr int64_t kPrefetch = 8;  // tokens ahead whose rows are requested early

inline float load(float x) { return x; }
inline float load(c10::Half x) { return static_cast<float>(x); }
inline float load(c10::BFloat16 x) { return static_cast<float>(x); }

// Copies one row to float32 (a no-op pointer for float inputs).
template <typename T>
inline const float* as_float(const T* row, float* buffer, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = load(row[i]);
  return buffer;
}
template <>
inline const float* as_float<float>(const float* row, float*, int64_t) { return row; }

// Asks for a row a few tokens ahead: rows sit in blocks scattered over the cache, so the
// hardware prefetcher loses the stream at every block boundary.
template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) {
    __builtin_prefetch(p + off, 0, 1);
  }
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float* __restrict y, float a, const float* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

template <typename T>
void attend_task(int64_t seq, int64_t kv_head, const T* query, int64_t q_stride_token,
                 int64_t q_stride_head, const T* key_cache, const T* value_cache,
                 int64_t block_size, int64_t num_kv_heads, int64_t head_size,
                 const int32_t* block_table, int64_t q_start, int64_t q_len, int64_t seq_len,
                 int64_t group, float scale, float softcap, int64_t window, T* out,
                 int64_t o_stride_token, int64_t o_stride_head) {
  std::vector<float> q(group * head_size), acc(group * head_size);
  std::vector<float> scores(group * kTile), row(2 * head_size);
  std::vector<float> running_max(group), running_sum(group);
  const int64_t token_stride = num_kv_heads * head_size;
  auto row_of = [&](const T* cache, int64_t pos) {
    const int64_t slot = static_cast<int64_t>(block_table[pos / block_size]) * block_size +
                         pos % block_size;
    return cache + slot * token_stride + kv_head * head_size;
  };
  for (int64_t j = 0; j < q_len; ++j) {
    const int64_t end = seq_len - q_len + j + 1;  // keys [begin, end) are visible
    const int64_t begin = window > 0 ? std::max<int64_t>(0, end - window) : 0;
    for (int64_t i = 0; i < group; ++i) {
      const T* src = query + (q_start + j) * q_stride_token + (kv_head * group + i) * q_stride_head;
      for (int64_t d = 0; d < head_size; ++d) q[i * head_size + d] = load(src[d]);
      running_max[i] = -std::numeric_limits<float>::infinity();
      running_sum[i] = 0.f;
    }
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t t0 = begin; t0 < end; t0 += kTile) {
      const int64_t n = std::min(kTile, end - t0);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = t0 + t;
        if (pos + kPrefetch < end) prefetch_row(row_of(key_cache, pos + kPrefetch), head_size);
        if (t < kPrefetch) prefetch_row(row_of(value_cache, t0 + t), head_size);
        const float* k = as_float(row_of(key_cache, pos), row.data(), head_size);
        for (int64_t i = 0; i < group; ++i) {
          float s = scale * dot(q.data() + i * head_size, k, head_size);
          if (softcap > 0.f) s = softcap * std::tanh(s / softcap);
          scores[i * kTile + t] = s;
        }
      }
      for (int64_t i = 0; i < group; ++i) {
        float* s = scores.data() + i * kTile;
        const float tile_max = *std::max_element(s, s + n);
        const float new_max = std::max(running_max[i], tile_max);
        const float correction = std::exp(running_max[i] - new_max);
        running_max[i] = new_max;
        float tile_sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          s[t] = std::exp(s[t] - new_max);
          tile_sum += s[t];
        }
        running_sum[i] = running_sum[i] * correction + tile_sum;
        if (correction != 1.f) {
          float* a = acc.data() + i * head_size;
          for (int64_t d = 0; d < head_size; ++d) a[d] *= correction;
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = t0 + t;
        if (t + kPrefetch < n) prefetch_row(row_of(value_cache, pos + kPrefetch), head_size);
        const float* v = as_float(row_of(value_cache, pos), row.data() + head_size, head_size);
        for (int64_t i = 0; i < group; ++i) {
          axpy(acc.data() + i * head_size, scores[i * kTile + t], v, head_size);
        }
      }
    }
    for (int64_t i = 0; i < group; ++i) {
      T* dst = out + (q_start + j) * o_stride_token + (kv_head * group + i) * o_stride_head;
      const float inv = 1.f / running_sum[i];
      for (int64_t d = 0; d < head_size; ++d) dst[d] = static_cast<T>(acc[i * head_size + d] * inv);
    }
  }
}

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
