// FP8 (float8_e4m3fn) weights times float32 activations on CPU, the weight kept as stored.
//
// Weight-only: the activations stay float32 (more accurate than the checkpoint's own
// activation quantization, which the GPU's FP8 matmuls apply). Each weight byte is
// converted to float inside the loop that uses it, never into a float copy of the matrix:
//
// - few rows (decode): each task walks a range of output channels; for up to four
//   activation rows at a time it converts 8 (AVX2) or 16 (AVX-512) weights to float32 and
//   accumulates their products, one sum per group of inputs times the group's scale;
// - more rows: a tile of output channels is dequantized into a cache-sized float32 buffer
//   and the float GEMM multiplies the whole batch by it (as dequantized_linear.cpp does for
//   the integer layouts); from 64 rows on the whole matrix, once, and one GEMM.
//
// The conversion is exact and needs no table on the SIMD paths: a byte s eeee mmm becomes
// the float16 s 0eeee mmm0000000, which is 2^-8 times the FP8 value (float16's exponent
// bias is 8 more than e4m3's, and its subnormals line up with e4m3's), and the CPU's
// float16 conversion (F16C, vcvtph2ps) makes floats of those, subnormals included, at
// full speed; the sums are multiplied by 256, exactly. Three integer operations per 16
// weights, where building float32 bits directly took about ten and a fix-up for the
// subnormals. The two NaN encodings (never written by a quantizer, which clamps to
// +-448) read as +-480 there; the scalar path reads a 256-entry table and gives NaN.
//
// The ISA is chosen at run time from the CPU's features (AVX-512F, AVX2 + FMA, scalar), so
// one build serves any x86-64 CPU (the SIMD paths need F16C, as every AVX2 CPU has);
// `isa` forces one (tests run every path this CPU has).
// Scales: float32 [N, ceil(K / group)], the last group of a row may be partial: K for one
// scale per channel, 128 for FP8_BLOCK's 128x128 blocks (kvrelay_kernels.fp8_weight).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVRELAY_FP8_X86 1
#endif

namespace {

constexpr int64_t kRowsPerPass = 4;         // activation rows sharing one pass over a row
constexpr int64_t kDotMaxRows = 8;          // up to here the dot products, then the tiles
constexpr int64_t kTileFloats = 64 * 1024;  // 256 KiB of float32 weights per tile
constexpr int64_t kWholeMatrixRows = 64;    // from here on: one GEMM over the whole matrix

float fp8_value(int byte) {
  const int exponent = (byte >> 3) & 15, mantissa = byte & 7;
  float v;
  if (exponent == 15 && mantissa == 7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(float(mantissa), -9);
  } else {
    v = std::ldexp(1.f + float(mantissa) / 8.f, exponent - 7);
  }
  return (byte & 0x80) ? -v : v;
}

struct Table {
  float value[256];
  Table() {
    for (int i = 0; i < 256; ++i) value[i] = fp8_value(i);
  }
};
const Table kTable;

// out[r] = sum over i < len of x[r * ldx + i] * fp8(w[i]), for r < rows (at most 4).
using DotFn = void (*)(const uint8_t* w, const float* x, int64_t ldx, int64_t len, int rows,
                       float* out);
// out[i] = fp8(w[i]) * scale for i < len: the reference's float(q) * scale, one rounding.
using DequantizeFn = void (*)(const uint8_t* w, int64_t len, float scale, float* out);

template <int R>
void dot_scalar_rows(const uint8_t* w, const float* x, int64_t ldx, int64_t len, float* out) {
  float acc[R] = {};
  for (int64_t i = 0; i < len; ++i) {
    const float wv = kTable.value[w[i]];
    for (int r = 0; r < R; ++r) acc[r] += x[r * ldx + i] * wv;
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

void dot_scalar(const uint8_t* w, const float* x, int64_t ldx, int64_t len, int rows,
                float* out) {
  switch (rows) {
    case 1: dot_scalar_rows<1>(w, x, ldx, len, out); break;
    case 2: dot_scalar_rows<2>(w, x, ldx, len, out); break;
    case 3: dot_scalar_rows<3>(w, x, ldx, len, out); break;
    default: dot_scalar_rows<4>(w, x, ldx, len, out); break;
  }
}

void dequantize_scalar(const uint8_t* w, int64_t len, float scale, float* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = kTable.value[w[i]] * scale;
}

#if defined(KVRELAY_FP8_X86)
#define KVRELAY_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVRELAY_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

// The SIMD paths read each FP8 value as 2^-8 times itself, and multiply the sums by 256
// (exact: a power of two), so the float results are those of the exact values.
constexpr float kUnscale = 256.f;
constexpr float kPrescale = 1.f / 256.f;

// 16 bytes s eeee mmm -> 16 float16 bit patterns s 0eeee mmm0000000, each 2^-8 times the
// FP8 value: float16's 5-bit exponent (bias 15) holds e4m3's 4-bit one (bias 7) shifted
// by 8, and its subnormals are e4m3's subnormals.
KVRELAY_AVX2 inline __m256i fp8x16_as_half(const uint8_t* w) {
  const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_or_si256(
      _mm256_and_si256(_mm256_slli_epi16(u, 7), _mm256_set1_epi16(0x3F80)),
      _mm256_and_si256(_mm256_slli_epi16(u, 8), _mm256_set1_epi16(static_cast<int16_t>(0x8000))));
}

// 8 bytes -> 8 floats, each 2^-8 times the FP8 value (F16C converts float16 exactly,
// subnormals included, at full speed).
KVRELAY_AVX2 inline __m256 fp8x8_avx2(const uint8_t* w) {
  const __m128i u = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
  const __m128i h = _mm_or_si128(
      _mm_and_si128(_mm_slli_epi16(u, 7), _mm_set1_epi16(0x3F80)),
      _mm_and_si128(_mm_slli_epi16(u, 8), _mm_set1_epi16(static_cast<int16_t>(0x8000))));
  return _mm256_cvtph_ps(h);
}

KVRELAY_AVX2 inline float sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
KVRELAY_AVX2 void dot_avx2_rows(const uint8_t* w, const float* x, int64_t ldx, int64_t len,
                                float* out) {
  __m256 acc[R], acc2[R];  // two chains, so one fma need not wait for the other
  for (int r = 0; r < R; ++r) acc[r] = acc2[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m256i h = fp8x16_as_half(w + i);
    const __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    const __m256 w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i), w0, acc[r]);
      acc2[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i + 8), w1, acc2[r]);
    }
  }
  for (; i + 8 <= len; i += 8) {
    const __m256 w0 = fp8x8_avx2(w + i);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i), w0, acc[r]);
    }
  }
  float tail[R] = {};
  for (; i < len; ++i) {
    const float wv = kTable.value[w[i]] * kPrescale;
    for (int r = 0; r < R; ++r) tail[r] += x[r * ldx + i] * wv;
  }
  for (int r = 0; r < R; ++r) {
    out[r] = (sum_avx2(_mm256_add_ps(acc[r], acc2[r])) + tail[r]) * kUnscale;
  }
}

KVRELAY_AVX2 void dot_avx2(const uint8_t* w, const float* x, int64_t ldx, int64_t len,
                           int rows, float* out) {
  switch (rows) {
    case 1: dot_avx2_rows<1>(w, x, ldx, len, out); break;
    case 2: dot_avx2_rows<2>(w, x, ldx, len, out); break;
    case 3: dot_avx2_rows<3>(w, x, ldx, len, out); break;
    default: dot_avx2_rows<4>(w, x, ldx, len, out); break;
  }
}

KVRELAY_AVX2 void dequantize_avx2(const uint8_t* w, int64_t len, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale * kUnscale);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(fp8x8_avx2(w + i), s));
  for (; i < len; ++i) out[i] = kTable.value[w[i]] * scale;
}

KVRELAY_AVX512 inline __m512 fp8x16_avx512(const uint8_t* w) {
  return _mm512_cvtph_ps(fp8x16_as_half(w));
}

template <int R>
KVRELAY_AVX512 void dot_avx512_rows(const uint8_t* w, const float* x, int64_t ldx,
                                    int64_t len, float* out) {
  __m512 acc[R], acc2[R];
  for (int r = 0; r < R; ++r) acc[r] = acc2[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m512 w0 = fp8x16_avx512(w + i), w1 = fp8x16_avx512(w + i + 16);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + i), w0, acc[r]);
      acc2[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + i + 16), w1, acc2[r]);
    }
  }
  for (; i + 16 <= len; i += 16) {
    const __m512 w0 = fp8x16_avx512(w + i);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + i), w0, acc[r]);
    }
  }
  float tail[R] = {};
  for (; i < len; ++i) {
    const float wv = kTable.value[w[i]] * kPrescale;
    for (int r = 0; r < R; ++r) tail[r] += x[r * ldx + i] * wv;
  }
  for (int r = 0; r < R; ++r) {
    out[r] = (_mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r])) + tail[r]) * kUnscale;
  }
}

KVRELAY_AVX512 void dot_avx512(const uint8_t* w, const float* x, int64_t ldx, int64_t len,
                               int rows, float* out) {
  switch (rows) {
    case 1: dot_avx512_rows<1>(w, x, ldx, len, out); break;
    case 2: dot_avx512_rows<2>(w, x, ldx, len, out); break;
    case 3: dot_avx512_rows<3>(w, x, ldx, len, out); break;
    default: dot_avx512_rows<4>(w, x, ldx, len, out); break;
  }
}

KVRELAY_AVX512 void dequantize_avx512(const uint8_t* w, int64_t len, float scale, float* out) {
  const __m512 s = _mm512_set1_ps(scale * kUnscale);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_mul_ps(fp8x16_avx512(w + i), s));
  }
  for (; i < len; ++i) out[i] = kTable.value[w[i]] * scale;
}
#endif

struct Isa {
  const char* name;
  DotFn dot;
  DequantizeFn dequantize;
};

// The paths this CPU runs, best first.
std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
#if defined(KVRELAY_FP8_X86)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f")) {
    isas.push_back({"avx512", dot_avx512, dequantize_avx512});
  }
  if (avx2) {
    isas.push_back({"avx2", dot_avx2, dequantize_avx2});
  }
#endif
  isas.push_back({"scalar", dot_scalar, dequantize_scalar});
  return isas;
}

const std::vector<Isa>& isas() {
  static const std::vector<Isa> found = available_isas();
  return found;
}

const Isa& choose_isa(const std::string& name) {
  if (name == "auto") return isas().front();
  for (const Isa& isa : isas()) {
    if (name == isa.name) return isa;
  }
  TORCH_CHECK(false, "fp8_linear: ISA '", name, "' is not available on this CPU");
}

// Channels [first, last) of the float32 weight into `tile` ([last - first, K]).
void dequantize_channels(const Isa& isa, const uint8_t* w, const float* scales, int64_t k,
                         int64_t group, int64_t first, int64_t last, float* tile) {
  const int64_t groups = (k + group - 1) / group;
  for (int64_t ch = first; ch < last; ++ch) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t start = g * group, len = std::min(group, k - start);
      isa.dequantize(w + ch * k + start, len, scales[ch * groups + g],
                     tile + (ch - first) * k + start);
    }
  }
}

at::Tensor dot_products(const Isa& isa, const at::Tensor& x, const uint8_t* w,
                        const float* scales, int64_t group, const float* bias, int64_t n) {
  const int64_t m = x.size(0), k = x.size(1), groups = (k + group - 1) / group;
  at::Tensor out = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Enough channels per task that a task streams a few KiB of weights.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const uint8_t* row = w + ch * k;
      const float* s = scales + ch * groups;
      for (int64_t first = 0; first < m; first += kRowsPerPass) {
        const int rows = static_cast<int>(std::min(kRowsPerPass, m - first));
        float total[kRowsPerPass] = {}, part[kRowsPerPass];
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t start = g * group, len = std::min(group, k - start);
          isa.dot(row + start, xp + first * k + start, k, len, rows, part);
          for (int r = 0; r < rows; ++r) total[r] += part[r] * s[g];
        }
        const float b = bias ? bias[ch] : 0.f;
        for (int r = 0; r < rows; ++r) op[(first + r) * n + ch] = total[r] + b;
      }
    }
  });
  return out;
}

at::Tensor dequantized_tiles(const Isa& isa, const at::Tensor& x, const uint8_t* w,
                             const float* scales, int64_t group, int64_t n) {
  const int64_t m = x.size(0), k = x.size(1);
  if (m >= kWholeMatrixRows) {
    at::Tensor dense = at::empty({n, k}, x.options());
    float* dp = dense.data_ptr<float>();
    at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
      dequantize_channels(isa, w, scales, k, group, lo, hi, dp + lo * k);
    });
    return at::mm(x, dense.t());
  }
  at::Tensor out = at::empty({m, n}, x.options());
  const int64_t tile = std::max<int64_t>(8, kTileFloats / std::max<int64_t>(k, 1));
  const int64_t tiles = (n + tile - 1) / tile;
  at::parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // see dequantized_linear.cpp
    at::Tensor buffer = at::empty({tile, k}, x.options());
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t first = t * tile, last = std::min(n, first + tile), width = last - first;
      dequantize_channels(isa, w, scales, k, group, first, last, buffer.data_ptr<float>());
      at::Tensor part = out.narrow(1, first, width);
      at::mm_out(part, x, buffer.narrow(0, 0, width).t());
    }
  });
  return out;
}

// y = x @ (fp8(weight) * scales).T (+ bias): x float32 [M, K], weight float8_e4m3fn (or its
// bytes as uint8) [N, K], scales float32 [N, ceil(K / group_size)], bias float32 [N].
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                      int64_t group_size, const c10::optional<at::Tensor>& bias,
                      const std::string& isa_name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(weight.scalar_type() == at::ScalarType::Float8_e4m3fn ||
                  weight.scalar_type() == at::kByte,
              "weight must be float8_e4m3fn (or its bytes as uint8)");
  const int64_t k = x.size(1), n = weight.size(0);
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == k,
              "weight must be a contiguous [N, K] tensor matching x's K");
  TORCH_CHECK(group_size > 0, "group_size must be positive");
  const int64_t groups = (k + group_size - 1) / group_size;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.dim() == 2 && scales.size(0) == n && scales.size(1) == groups,
              "scales must be contiguous float32 [N, ceil(K / group_size)]");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n &&
                        bias->is_contiguous()), "bias must be float32 [N]");
  const Isa& isa = choose_isa(isa_name);
  const uint8_t* w = static_cast<const uint8_t*>(weight.data_ptr());
  const float* s = scales.data_ptr<float>();
  if (x.size(0) <= kDotMaxRows) {
    return dot_products(isa, x, w, s, group_size, bias ? bias->data_ptr<float>() : nullptr, n);
  }
  at::Tensor out = dequantized_tiles(isa, x, w, s, group_size, n);
  if (bias) out.add_(*bias);
  return out;
}

// The paths this CPU runs, best first (the first is what "auto" takes).
std::vector<std::string> fp8_linear_isas() {
  std::vector<std::string> names;
  for (const Isa& isa : isas()) names.emplace_back(isa.name);
  return names;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("fp8_linear(Tensor x, Tensor weight, Tensor scales, int group_size, Tensor? bias, "
        "str isa) -> Tensor");
  m.impl("fp8_linear", c10::DispatchKey::CPU, &fp8_linear);
  m.def("fp8_linear_isas() -> str[]", &fp8_linear_isas);
}
