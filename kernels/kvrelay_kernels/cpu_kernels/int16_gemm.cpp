// Quantized linear layers for many rows (prompts, large decode batches) as an integer GEMM.
//
// With many rows the product is compute-bound, and a float GEMM (what
// dequantized_linear.cpp feeds) does 16 multiply-adds per cycle and core at best. The
// same products on int16 do twice that: AVX-512 VNNI's vpdpwssd, or AVX2's vpmaddwd with
// an add, multiply 32 pairs of int16 per instruction. So the activations are quantized to
// int16 in blocks of 32 (as the integer dot-product kernel does, int16_dot_isa.h) and the
// weights are repacked once, at first use, for a register-blocked GEMM:
//
// - each 32-bit lane of an accumulator is one output channel, holding two consecutive
//   inputs (vpdpwssd multiplies pairs): the packed weights are [N/L][K/2][L][2] int8
//   (L lanes: 16 with AVX-512, 8 with AVX2), the widening to int16 done at load;
// - an activation pair is broadcast to every lane, so one instruction advances L channels
//   of one row by two inputs, with no horizontal sums;
// - a block of 32 inputs ends with one conversion and one multiply-add per accumulator by
//   the channel's block scale times the row's (the scales packed [N/L][K/32][L] float32),
//   and with minimums (Q4_1, Q5_1, K-quants) a second by minimum times the row's exact
//   block sum, as the dot-product kernel computes them.
//
// A tile of rows x channel groups stays in registers for a whole row; each thread takes
// whole channel groups of a panel of rows, so the split does not change any result.
// Weights in groups that are not whole blocks of 32 (GGUF's Q6_K) are not taken.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "float_vec.h"
#include "int16_dot_isa.h"
#include "quantized_args.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

namespace qdot = kvrelay_cpu::qdot;
using qdot::kBlock;

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KVRELAY_INT16_GEMM 1
constexpr int64_t kLanes = 16;
constexpr int kRowTile = 4, kGroupTile = 2;  // 8 int32 + 8 float accumulators of 32
using VecI = __m512i;
inline VecI widen(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline VecI broadcast_pair(const int16_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return _mm512_set1_epi32(v);
}
inline VecI dot_pairs(VecI acc, VecI w, VecI x) { return _mm512_dpwssd_epi32(acc, w, x); }
inline VecI zero_int() { return _mm512_setzero_si512(); }
#elif defined(__AVX2__) && defined(__FMA__)
#define KVRELAY_INT16_GEMM 1
constexpr int64_t kLanes = 8;
constexpr int kRowTile = 3, kGroupTile = 2;  // 6 + 6 accumulators of AVX2's 16 registers
using VecI = __m256i;
inline VecI widen(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VecI broadcast_pair(const int16_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return _mm256_set1_epi32(v);
}
inline VecI dot_pairs(VecI acc, VecI w, VecI x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
}
inline VecI zero_int() { return _mm256_setzero_si256(); }
#else
constexpr int64_t kLanes = 0;  // no integer GEMM at this level: the dequantizing tiles serve
#endif

constexpr int64_t kRowPanel = 64;  // rows per task: a panel's int16 rows stay in L2

int64_t lanes() { return kLanes; }

// The weight's packed copy: values [G, K * L] int8, block scales (and minimums) [G, B * L]
// float32, G = ceil(N / L) channel groups, B = K / 32 blocks (channels past N are zero).
template <typename S>
void pack_channels(const uint8_t* w, const S* scales, const S* mins, int64_t bits, int64_t k,
                   int64_t group, int64_t first, int64_t last, int8_t* values,
                   float* block_scales, float* block_mins) {
  const int64_t packed = bits == 8 ? k : k / 2, groups = k / group, blocks = k / kBlock;
  for (int64_t ch = first; ch < last; ++ch) {
    const uint8_t* row = w + ch * packed;
    const int64_t g = ch / kLanes, lane = ch % kLanes;
    int8_t* dst = values + g * k * kLanes;
    for (int64_t i = 0; i < k; ++i) {
      int8_t q;
      if (bits == 8) {
        q = static_cast<int8_t>(row[i]);
      } else {
        q = static_cast<int8_t>(i < k / 2 ? row[i] & 15 : row[i - k / 2] >> 4);
      }
      dst[((i / 2) * kLanes + lane) * 2 + i % 2] = q;
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t source = ch * groups + b * kBlock / group;
      block_scales[(g * blocks + b) * kLanes + lane] = qdot::to_float(scales[source]);
      if (mins) block_mins[(g * blocks + b) * kLanes + lane] = qdot::to_float(mins[source]);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int16_gemm(
    const at::Tensor& qweight, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
    int64_t bits, int64_t group_size, int64_t in_features) {
  TORCH_CHECK(kLanes > 0, "no integer GEMM at this instruction-set level");
  const int64_t k = in_features, n = qweight.size(0);
  const at::Tensor probe = at::empty({1, k}, qweight.options().dtype(at::kFloat));
  kvrelay_cpu::check_quantized_linear_args(probe, qweight, scales, mins, bits, group_size,
                                           c10::nullopt);
  TORCH_CHECK(group_size % kBlock == 0 && k % kBlock == 0 && (bits == 8 || (k / 2) % kBlock == 0),
              "the integer GEMM needs groups of whole 32-input blocks");
  const int64_t groups = (n + kLanes - 1) / kLanes, blocks = k / kBlock;
  const auto f32 = qweight.options().dtype(at::kFloat);
  at::Tensor values = at::zeros({groups, k * kLanes}, qweight.options().dtype(at::kChar));
  at::Tensor block_scales = at::zeros({groups, blocks * kLanes}, f32);
  at::Tensor block_mins = mins ? at::zeros({groups, blocks * kLanes}, f32) : at::empty({0}, f32);
  const uint8_t* w = static_cast<const uint8_t*>(qweight.data_ptr());
  at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
    if (scales.scalar_type() == at::kHalf) {
      pack_channels<c10::Half>(w, scales.data_ptr<c10::Half>(),
                               mins ? mins->data_ptr<c10::Half>() : nullptr, bits, k,
                               group_size, lo, hi, values.data_ptr<int8_t>(),
                               block_scales.data_ptr<float>(),
                               mins ? block_mins.data_ptr<float>() : nullptr);
    } else {
      pack_channels<float>(w, scales.data_ptr<float>(), mins ? mins->data_ptr<float>() : nullptr,
                           bits, k, group_size, lo, hi, values.data_ptr<int8_t>(),
                           block_scales.data_ptr<float>(),
                           mins ? block_mins.data_ptr<float>() : nullptr);
    }
  });
  return {values, block_scales, block_mins};
}

#ifdef KVRELAY_INT16_GEMM
static_assert(kvrelay_cpu::fvec::kWidth == kLanes, "float lanes must match the channel lanes");

struct Packed {
  const int8_t* values;
  const float* scales;
  const float* mins;  // nullptr without minimums
  int64_t k, blocks;
};

// Rows [row, row + R) x channel groups [group, group + G) of the product, into
// out[r * ldo + g * L + lane] (a local buffer: the caller trims channels past N).
template <int R, int G, bool Mins>
void tile(const Packed& w, const qdot::Activations& a, int64_t row, int64_t group, float* out,
          int64_t ldo) {
  const int64_t k = w.k, blocks = w.blocks;
  using namespace kvrelay_cpu::fvec;
  Vec acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = zero();
  const int8_t* values = w.values + group * k * kLanes;
  for (int64_t b = 0; b < blocks; ++b) {
    VecI dots[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) dots[r][g] = zero_int();
    const int8_t* wb = values + b * kBlock * kLanes;
    const int16_t* xb = a.q + row * k + b * kBlock;
    for (int64_t p = 0; p < kBlock / 2; ++p) {
      VecI wv[G];
      for (int g = 0; g < G; ++g) wv[g] = widen(wb + g * k * kLanes + p * 2 * kLanes);
      for (int r = 0; r < R; ++r) {
        const VecI xv = broadcast_pair(xb + r * k + 2 * p);
        for (int g = 0; g < G; ++g) dots[r][g] = dot_pairs(dots[r][g], wv[g], xv);
      }
    }
    for (int g = 0; g < G; ++g) {
      const int64_t at_block = ((group + g) * blocks + b) * kLanes;
      const Vec scale = load(w.scales + at_block);
      for (int r = 0; r < R; ++r) {
        const Vec combined = mul(scale, splat(a.d[(row + r) * blocks + b]));
        acc[r][g] = fmadd(from_int32(dots[r][g]), combined, acc[r][g]);
      }
      if constexpr (Mins) {
        const Vec minimum = load(w.mins + at_block);
        for (int r = 0; r < R; ++r) {
          acc[r][g] = fmadd(minimum, splat(a.sums[(row + r) * blocks + b]), acc[r][g]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store(out + r * ldo + g * kLanes, acc[r][g]);
}

template <int G, bool Mins>
void tile_rows(int64_t rows, const Packed& w, const qdot::Activations& a, int64_t row,
               int64_t group, float* out, int64_t ldo) {
  static_assert(kRowTile <= 4, "tile_rows dispatches up to four rows");
  switch (rows) {
    case 1: tile<1, G, Mins>(w, a, row, group, out, ldo); break;
    case 2: tile<2, G, Mins>(w, a, row, group, out, ldo); break;
    case 3: tile<3, G, Mins>(w, a, row, group, out, ldo); break;
    default: tile<kRowTile, G, Mins>(w, a, row, group, out, ldo); break;
  }
}

template <bool Mins>
void tile_any(int64_t rows, int64_t groups, const Packed& w, const qdot::Activations& a,
              int64_t row, int64_t group, float* out, int64_t ldo) {
  static_assert(kGroupTile == 2, "tile_any dispatches one or two channel groups");
  if (groups == 1) {
    tile_rows<1, Mins>(rows, w, a, row, group, out, ldo);
  } else {
    tile_rows<2, Mins>(rows, w, a, row, group, out, ldo);
  }
}
#endif

// y = x @ W.T (+ bias) for float32 x [M, K] and W packed by pack_int16_gemm (n channels).
at::Tensor int16_gemm(const at::Tensor& x, const at::Tensor& values,
                      const at::Tensor& block_scales, const at::Tensor& block_mins, int64_t n,
                      const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(kLanes > 0, "no integer GEMM at this instruction-set level");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t groups = (n + kLanes - 1) / std::max<int64_t>(kLanes, 1);
  const int64_t blocks = k / kBlock;
  TORCH_CHECK(n > 0 && k > 0 && k % kBlock == 0, "K must be a positive multiple of 32");
  TORCH_CHECK(values.scalar_type() == at::kChar && values.is_contiguous() &&
              values.dim() == 2 && values.size(0) == groups && values.size(1) == k * kLanes,
              "values must be the packed int8 [", groups, ", ", k * kLanes, "]");
  TORCH_CHECK(block_scales.scalar_type() == at::kFloat && block_scales.is_contiguous() &&
              block_scales.dim() == 2 && block_scales.size(0) == groups &&
              block_scales.size(1) == blocks * kLanes, "block_scales do not match");
  const bool has_mins = block_mins.numel() > 0;
  TORCH_CHECK(!has_mins || (block_mins.scalar_type() == at::kFloat &&
                            block_mins.is_contiguous() && block_mins.sizes() == block_scales.sizes()),
              "block_mins must be empty or shaped like block_scales");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n &&
                        bias->is_contiguous()), "bias must be float32 [N]");
  at::Tensor out = at::empty({m, n}, x.options());
#ifdef KVRELAY_INT16_GEMM
  if (m == 0) return out;
  // int16 blocks of every row, as the integer dot-product kernel quantizes them
  qdot::RowBlocks rows_in;
  rows_in.resize(m, k);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, m, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) rows_in.quantize(xp + r * k, r);
  });
  const qdot::Activations a = rows_in.view();
  const Packed w{values.data_ptr<int8_t>(), block_scales.data_ptr<float>(),
                 has_mins ? block_mins.data_ptr<float>() : nullptr, k, blocks};
  const float* bias_p = bias ? bias->data_ptr<float>() : nullptr;
  float* out_p = out.data_ptr<float>();
  const int64_t group_tiles = (groups + kGroupTile - 1) / kGroupTile;
  const int64_t panels = (m + kRowPanel - 1) / kRowPanel;
  // Task t: channel-group tile t % group_tiles of row panel t / group_tiles.
  at::parallel_for(0, panels * group_tiles, 1, [&](int64_t lo, int64_t hi) {
    float local[kRowTile * kGroupTile * kLanes];
    const int64_t ldo = kGroupTile * kLanes;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t panel = t / group_tiles, group = (t % group_tiles) * kGroupTile;
      const int64_t group_count = std::min<int64_t>(kGroupTile, groups - group);
      const int64_t last_row = std::min(m, (panel + 1) * kRowPanel);
      for (int64_t row = panel * kRowPanel; row < last_row; row += kRowTile) {
        const int64_t rows = std::min<int64_t>(kRowTile, last_row - row);
        if (has_mins) {
          tile_any<true>(rows, group_count, w, a, row, group, local, ldo);
        } else {
          tile_any<false>(rows, group_count, w, a, row, group, local, ldo);
        }
        const int64_t first = group * kLanes;
        const int64_t width = std::min(n, (group + group_count) * kLanes) - first;
        for (int64_t r = 0; r < rows; ++r) {
          float* dst = out_p + (row + r) * n + first;
          const float* src = local + r * ldo;
          for (int64_t c = 0; c < width; ++c) dst[c] = src[c] + (bias_p ? bias_p[first + c] : 0.f);
        }
      }
    }
  });
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("int16_gemm_lanes() -> int", &lanes);
  m.def("pack_int16_gemm(Tensor qweight, Tensor scales, Tensor? mins, int bits, "
        "int group_size, int in_features) -> (Tensor, Tensor, Tensor)");
  m.impl("pack_int16_gemm", c10::DispatchKey::CPU, &pack_int16_gemm);
  m.def("int16_gemm(Tensor x, Tensor values, Tensor block_scales, Tensor block_mins, int n, "
        "Tensor? bias) -> Tensor");
  m.impl("int16_gemm", c10::DispatchKey::CPU, &int16_gemm);
}
