// One (sequence, KV head) task of paged attention, shared by the per-op kernel
// (paged_attention.cpp, which says how it reads the cache) and the whole-step decode
// (decode_step.cpp), so both give the same bits.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kvrelay_cpu::attend {

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

// A query-key score. GCC leaves the simd-reduction loop scalar here (a chain of 64
// dependent adds per score, most of a decode step's attention time), so head sizes that
// are a multiple of 16 take two 8-wide FMA chains.
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  if (n % 16 == 0) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      even = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), even);
      odd = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), odd);
    }
    const __m256 v = _mm256_add_ps(even, odd);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
#endif
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

}  // namespace kvrelay_cpu::attend
