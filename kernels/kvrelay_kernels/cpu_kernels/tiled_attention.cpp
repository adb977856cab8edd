// Paged attention on CPU for queries of any length, read in tiles straight from the blocks.
//
// The decode kernel (paged_attention.cpp) walks the context once per query token: right
// for one token, wasteful for a prompt chunk, whose tokens would each re-read every key.
// Here one task owns (sequence, KV head, tile of up to kQueryTile query tokens): its rows
// are those tokens times the query heads of the KV head's group, and it walks the visible
// context kKeyTile keys at a time. Each key tile is copied once from its scattered blocks
// into a small float32 buffer that stays in cache, then serves every row of the task with
// two matrix products (scores = Q K^T, acc += P V), with an online softmax between them:
// in the BLAS sgemm torch links (each worker with a one-thread MKL team; blocked loops where
// the BLAS cannot be told so and several workers share the call, or there is no sgemm). So
// K/V bytes are read once per query tile, never gathered whole. Measured on one thread of
// the 2-core dev VM (SmolLM2 shapes, 512-token chunk, benchmarks/cpu_attention.py): sgemm
// 2-3x faster than the blocked loops kept as the fallback (6.6 vs 17.6 ms at no context,
// 157 vs 413 ms at 6k); query tiles of 16-64 and key tiles of 64-256 within noise of
// 32 x 128.
//
// Semantics match kvrelay_kernels.reference.paged_attention: query token j of a sequence
// with q new tokens and context length L sits at position p = L - q + j and sees keys
// max(0, p - W + 1) .. p (W: sliding window, 0 for none); scores are scale * q.k, then
// c * tanh(s / c) when a softcap c > 0 is given. A task reads keys from its first token's
// window start to its last token's position, nothing outside (freed blocks stay unread).
//
// Tasks differ in cost (a chunk's last tile sees more keys than its first), so they are
// sorted longest first and handed out through an atomic counter on ATen's thread pool.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "softmax_exp.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kQueryTile = 32;  // query tokens per task
constexpr int64_t kKeyTile = 128;   // keys per matrix product
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float load(float x) { return x; }
inline float load(c10::Half x) { return static_cast<float>(x); }
inline float load(c10::BFloat16 x) { return static_cast<float>(x); }

// The Fortran BLAS sgemm that torch's CPU build links (MKL on x86-64), found at load time;
// ATen's own cpublas::gemm wraps it but is not exported to extensions. Declared weak so
// the library still loads against a torch without it; then blocked loops run instead.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) __attribute__((weak));

// Whether sgemm_ (when present) serves the tile products; off only to test and measure
// the fallback loops in a process that has it.
std::atomic<bool> use_blas{true};

// MKL's per-thread team size (returns the previous one; 0 = the global setting). Inside
// our workers MKL would otherwise size its team by torch's thread count and oversubscribe
// the cores, so each worker asks for a team of one while it runs. Weak, like sgemm_:
// another BLAS (OpenBLAS on aarch64) has no such call, and there sgemm serves one-worker
// calls only. (MKL's C name; the lower-case symbol is the Fortran one, taking a pointer.)
extern "C" int MKL_Set_Num_Threads_Local(int nt) __attribute__((weak));

// Set per worker: whether sgemm may serve this worker (alone in the call, or with MKL's
// team set to one thread for it).
thread_local bool blas_allowed = true;

inline bool blas_on() {
  return sgemm_ != nullptr && use_blas.load(std::memory_order_relaxed) && blas_allowed;
}

// For the lifetime of one worker of a call: sgemm on, with a one-thread MKL team when the
// call has several workers and MKL can be told so; otherwise sgemm off for shared calls.
class WorkerBlas {
 public:
  explicit WorkerBlas(bool shared)
      : restore_(shared && MKL_Set_Num_Threads_Local != nullptr) {
    if (restore_) previous_ = MKL_Set_Num_Threads_Local(1);
    blas_allowed = !shared || restore_;
  }
  ~WorkerBlas() {
    if (restore_) MKL_Set_Num_Threads_Local(previous_);
  }
  WorkerBlas(const WorkerBlas&) = delete;
  WorkerBlas& operator=(const WorkerBlas&) = delete;

 private:
  bool restore_;
  int previous_ = 0;
};

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// scores[rows, n] = alpha * q[rows, d] keys[n, d]^T, all row-major and dense.
inline void tile_scores(const float* q, const float* keys, float* scores, int64_t rows,
                        int64_t n, int64_t d, float alpha) {
  if (blas_on()) {  // column-major view: scores^T = keys q^T
    const int m_ = static_cast<int>(n), n_ = static_cast<int>(rows), k_ = static_cast<int>(d);
    const float beta = 0.f;
    sgemm_("T", "N", &m_, &n_, &k_, &alpha, keys, &k_, q, &k_, &beta, scores, &m_);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < n; ++t) scores[r * n + t] = alpha * dot(q + r * d, keys + t * d, d);
  }
}

// acc[rows, d] += probs[rows, n] values[n, d], all row-major and dense.
inline void tile_accumulate(const float* probs, const float* values, float* acc, int64_t rows,
                            int64_t n, int64_t d) {
  if (blas_on()) {  // column-major view: acc^T += values^T probs^T
    const int m_ = static_cast<int>(d), n_ = static_cast<int>(rows), k_ = static_cast<int>(n);
    const float one = 1.f;
    sgemm_("N", "N", &m_, &n_, &k_, &one, values, &m_, probs, &k_, &one, acc, &m_);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict a = acc + r * d;
    for (int64_t t = 0; t < n; ++t) {
      const float p = probs[r * n + t];
      const float* __restrict v = values + t * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) a[i] += p * v[i];
    }
  }
}

struct Task {
  int64_t seq;
  int64_t kv_head;
  int64_t first;  // first query token of the tile, within the sequence's new tokens
  int64_t count;  // query tokens in the tile
  int64_t cost;   // rows x visible keys, for ordering
};

struct Shape {
  int64_t group, head_size, block_size, num_kv_heads, table_width;
  int64_t q_stride_token, q_stride_head, o_stride_token, o_stride_head;
  float scale, softcap;
  int64_t window;
};

// Per-thread scratch, sized once per call.
struct Scratch {
  std::vector<float> q, acc, keys, values, scores, row_max, row_sum;
  explicit Scratch(const Shape& s)
      : q(kQueryTile * s.group * s.head_size), acc(q.size()),
        keys(kKeyTile * s.head_size), values(keys.size()),
        scores(kQueryTile * s.group * kKeyTile), row_max(kQueryTile * s.group),
        row_sum(row_max.size()) {}
};

// Copies keys [t0, t0 + n) of one KV head from their blocks into a dense float tile.
template <typename T>
void load_tile(const T* cache, const int32_t* table, int64_t t0, int64_t n, int64_t kv_head,
               const Shape& s, float* dst) {
  const int64_t token_stride = s.num_kv_heads * s.head_size;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = t0 + t;
    const int64_t slot = static_cast<int64_t>(table[pos / s.block_size]) * s.block_size +
                         pos % s.block_size;
    const T* src = cache + slot * token_stride + kv_head * s.head_size;
    float* out = dst + t * s.head_size;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out, src, s.head_size * sizeof(float));
    } else {
#pragma omp simd
      for (int64_t d = 0; d < s.head_size; ++d) out[d] = load(src[d]);
    }
  }
}

// Softcap, mask and online-softmax update of one row's scores for keys [t0, t0 + n);
// returns the factor the row's accumulator must be scaled by.
inline float softmax_row(float* s, int64_t n, int64_t t0, int64_t lo, int64_t hi,
                         float softcap, float& running_max, float& running_sum) {
  if (softcap > 0.f) {
    for (int64_t t = 0; t < n; ++t) s[t] = softcap * std::tanh(s[t] / softcap);
  }
  // Visible keys are lo..hi (absolute positions); mask the rest of the tile.
  const int64_t vis_begin = std::clamp<int64_t>(lo - t0, 0, n);
  const int64_t vis_end = std::clamp<int64_t>(hi + 1 - t0, 0, n);
  for (int64_t t = 0; t < vis_begin; ++t) s[t] = kNegInf;
  for (int64_t t = vis_end; t < n; ++t) s[t] = kNegInf;
  const float new_max = kvrelay_cpu::row_max(s, vis_begin, vis_end, running_max);
  if (new_max == kNegInf) {  // nothing visible yet: the row contributes nothing
    std::fill(s, s + n, 0.f);
    return 1.f;
  }
  const float correction = kvrelay_cpu::exp_nonpositive(running_max - new_max);
  const float sum = kvrelay_cpu::exp_shifted_sum(s, n, new_max);
  running_max = new_max;
  running_sum = running_sum * correction + sum;
  return correction;
}

template <typename T>
void attend_tile(const Task& task, const T* query, const T* key_cache, const T* value_cache,
                 const int32_t* tables, const int32_t* starts, const int32_t* lens,
                 const Shape& s, Scratch& w, T* out) {
  const int64_t g = s.group, d = s.head_size, rows = task.count * g;
  const int64_t q_len = starts[task.seq + 1] - starts[task.seq];
  const int64_t first_pos = lens[task.seq] - q_len + task.first;  // first token's position
  const int64_t last_pos = first_pos + task.count - 1;
  const int64_t begin = s.window > 0 ? std::max<int64_t>(0, first_pos - s.window + 1) : 0;
  const int64_t end = last_pos + 1;
  const int32_t* table = tables + task.seq * s.table_width;
  const int64_t q_row0 = starts[task.seq] + task.first;
  // Rows are (token, head of the group), token-major.
  for (int64_t t = 0; t < task.count; ++t) {
    for (int64_t h = 0; h < g; ++h) {
      const T* src = query + (q_row0 + t) * s.q_stride_token +
                     (task.kv_head * g + h) * s.q_stride_head;
      float* dst = w.q.data() + (t * g + h) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = load(src[i]);
    }
  }
  std::fill(w.acc.begin(), w.acc.begin() + rows * d, 0.f);
  std::fill(w.row_max.begin(), w.row_max.begin() + rows, kNegInf);
  std::fill(w.row_sum.begin(), w.row_sum.begin() + rows, 0.f);
  for (int64_t t0 = begin; t0 < end; t0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, end - t0);
    load_tile(key_cache, table, t0, n, task.kv_head, s, w.keys.data());
    load_tile(value_cache, table, t0, n, task.kv_head, s, w.values.data());
    tile_scores(w.q.data(), w.keys.data(), w.scores.data(), rows, n, d, s.scale);
    for (int64_t t = 0; t < task.count; ++t) {
      const int64_t pos = first_pos + t;
      const int64_t lo = s.window > 0 ? pos - s.window + 1 : 0;
      for (int64_t h = 0; h < g; ++h) {
        const int64_t r = t * g + h;
        const float correction = softmax_row(w.scores.data() + r * n, n, t0, lo, pos,
                                             s.softcap, w.row_max[r], w.row_sum[r]);
        if (correction != 1.f) {
          float* a = w.acc.data() + r * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) a[i] *= correction;
        }
      }
    }
    tile_accumulate(w.scores.data(), w.values.data(), w.acc.data(), rows, n, d);
  }
  for (int64_t t = 0; t < task.count; ++t) {
    for (int64_t h = 0; h < g; ++h) {
      const int64_t r = t * g + h;
      T* dst = out + (q_row0 + t) * s.o_stride_token + (task.kv_head * g + h) * s.o_stride_head;
      const float inv = 1.f / w.row_sum[r];
      const float* a = w.acc.data() + r * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(a[i] * inv);
    }
  }
}

// Attention for every sequence with at least min_query_len new tokens; the others' rows
// of `out` are not touched.
void paged_attention_tiled(const at::Tensor& query, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                           double scale, double softcap, int64_t window,
                           int64_t min_query_len, at::Tensor out) {
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_start_loc.scalar_type() == at::kInt &&
              seq_lens.scalar_type() == at::kInt, "index tensors must be int32");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() &&
              block_tables.is_contiguous() && query_start_loc.is_contiguous() &&
              seq_lens.is_contiguous(), "caches and index tensors must be contiguous");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "head dim must be contiguous");
  TORCH_CHECK(query.scalar_type() == key_cache.scalar_type() &&
              out.scalar_type() == key_cache.scalar_type(), "one dtype for all tensors");
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_heads = query.size(1);
  Shape shape{num_heads / key_cache.size(2), query.size(2), key_cache.size(1),
              key_cache.size(2), block_tables.size(1), query.stride(0), query.stride(1),
              out.stride(0), out.stride(1), static_cast<float>(scale),
              static_cast<float>(softcap), window};
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  std::vector<Task> tasks;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t q_len = starts[seq + 1] - starts[seq];
    if (q_len < std::max<int64_t>(1, min_query_len)) continue;
    for (int64_t first = 0; first < q_len; first += kQueryTile) {
      const int64_t count = std::min(kQueryTile, q_len - first);
      const int64_t last_pos = lens[seq] - q_len + first + count - 1;
      const int64_t keys = window > 0 ? std::min<int64_t>(last_pos + 1, window + count)
                                      : last_pos + 1;
      for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
        tasks.push_back({seq, h, first, count, count * keys});
      }
    }
  }
  if (tasks.empty()) return;
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), tasks.size());
  std::atomic<int64_t> next{0};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, query.scalar_type(),
                                  "kvrelay_paged_attention_tiled_cpu", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* k = key_cache.data_ptr<scalar_t>();
    const scalar_t* v = value_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, workers, 1, [&](int64_t lo, int64_t hi) {
      WorkerBlas blas(workers > 1);
      Scratch scratch(shape);
      for (int64_t worker = lo; worker < hi; ++worker) {
        for (int64_t i = next++; i < static_cast<int64_t>(tasks.size()); i = next++) {
          attend_tile<scalar_t>(tasks[i], q, k, v, tables, starts, lens, shape, scratch, o);
        }
      }
    });
  });
}

// Turns the sgemm path on or off; returns whether it runs now (false without sgemm_).
bool tiled_attention_use_blas(bool enable) {
  use_blas.store(enable);
  return sgemm_ != nullptr && enable;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("paged_attention_tiled(Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, "
        "float softcap, int window, int min_query_len, Tensor(a!) out) -> ()");
  m.impl("paged_attention_tiled", c10::DispatchKey::CPU, &paged_attention_tiled);
  m.def("tiled_attention_use_blas(bool enable) -> bool", &tiled_attention_use_blas);
}
