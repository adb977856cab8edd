// Weight-only quantized linear layers on CPU with integer dot products.
//
// A decode step reads every weight byte once per token, so its speed is the rate at which
// the packed weights stream through the cores. Converting each weight to float before
// multiplying (what a dequantize loop does) costs more instructions per byte than the
// memory system needs; instead, as llama.cpp's q8 dot products and FBGEMM's dynamic
// quantization do, the activations are quantized once per call, in blocks of 32 with one
// float scale per block, and each block of the product is an integer dot product of 32
// activations with 32 weights widened to 16 bits: AVX-512 VNNI `vpdpwssd` on 32 pairs at a
// time where the CPU has it, AVX2 `vpmaddwd` on 16 otherwise, scalar code elsewhere. The
// library is built once per instruction-set level and each process loads its CPU's best
// (cpu_isa.py), so the choice is made for the CPU the library runs on.
//
// The activations are quantized to int16 (scale amax / 32767), not to int8 as llama.cpp's
// q8_1 does: on SmolLM2 int8 blocks moved a product by 1-3% (its activations have blocks
// with one large value) and teacher-forced top-1 agreement with the exact product fell to
// 91%; int16 costs one more widening per 32 weights and keeps the product within float
// rounding of the weight-only one (benchmarks/quality.py).
//
// Layouts are kvrelay_kernels.quantized_weight's: int8 [N, K] with one scale per group of
// G inputs (w = q * s); int4 [N, K/2] bytes, byte c holding input c (low nibble) and input
// K/2 + c (high nibble), with a scale and a minimum per group (w = q * s + m); int8 may have
// minimums too (GGUF's Q5_1 and Q5_K). G must be a multiple of 32 (and, for int4, K/2 too)
// so that each activation block lies in one group, or 16 for symmetric int8 (GGUF's Q6_K):
// then the block's 32 products are summed as two halves, each times its own scale (the
// integer dot products already sum pairs into lanes, and the lanes of one half take one
// scale). With minimums, sum(w * x) over a group is s * sum(q * x) + m * sum(x): the
// minimum leaves the inner loop and multiplies the exact float sum of the block's
// activations.
//
// Output channels are split across ATen's intra-op threads; each thread computes every
// activation row for its channels, up to four rows per pass over a weight row, so a
// weight byte is read once for the whole batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "quantized_args.h"
#include "quantized_dot.h"

#include <string>

namespace {

using namespace kvrelay_cpu::qdot;

template <typename S>
void run_rows(const at::Tensor& qweight, const at::Tensor& scales,
              const c10::optional<at::Tensor>& mins, int64_t bits, int64_t group,
              const Activations& a, int64_t m, const float* bias, float* out) {
  const QuantizedMatrix<S> q{static_cast<const uint8_t*>(qweight.data_ptr()),
                             scales.data_ptr<S>(), mins ? mins->data_ptr<S>() : nullptr,
                             qweight.size(0), qweight.size(1), scales.size(1), bits, group};
  // Enough channels per task that a task streams a few KiB of weights.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(q.packed, 1));
  at::parallel_for(0, q.n, grain, [&](int64_t lo, int64_t hi) {
    dot_channels(q, a, m, bias, out, q.n, lo, hi);
  });
}

// y = x @ W.T (+ bias), x float32 [M, K], W as described at the top; returns float32 [M, N].
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& qweight,
                            const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                            int64_t bits, int64_t group_size,
                            const c10::optional<at::Tensor>& bias) {
  kvrelay_cpu::check_quantized_linear_args(x, qweight, scales, mins, bits, group_size, bias);
  const int64_t m = x.size(0), k = x.size(1), n = qweight.size(0);
  TORCH_CHECK(group_size % kBlock == 0 || (group_size == kBlock / 2 && bits == 8 && !mins),
              "group_size must be a multiple of 32 that divides K (or 16, for int8 without "
              "mins)");
  TORCH_CHECK(bits == 8 || (k / 2) % kBlock == 0, "int4 needs K/2 a multiple of 32");
  TORCH_CHECK(k / kBlock <= kMaxBlocks, "K must be at most ", kMaxBlocks * kBlock);

  RowBlocks blocks;
  blocks.resize(m, k);
  const float* xp = x.data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) blocks.quantize(xp + r * k, r);
  const Activations a = blocks.view();
  at::Tensor out = at::empty({m, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  if (scales.scalar_type() == at::kHalf) {
    run_rows<c10::Half>(qweight, scales, mins, bits, group_size, a, m, bp,
                        out.data_ptr<float>());
  } else {
    run_rows<float>(qweight, scales, mins, bits, group_size, a, m, bp, out.data_ptr<float>());
  }
  return out;
}

// Which integer dot product this build uses, for the worker's ready line.
std::string quantized_linear_isa() {
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
  return "avx512-vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.def("quantized_linear(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int bits, "
        "int group_size, Tensor? bias) -> Tensor");
  m.impl("quantized_linear", c10::DispatchKey::CPU, &quantized_linear);
  m.def("quantized_linear_isa() -> str", &quantized_linear_isa);
}
