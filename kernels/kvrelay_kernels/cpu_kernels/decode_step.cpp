// A whole decode step of a pre-norm decoder (Llama, Mistral, Qwen2, SmolLM2) in one call.
//
// Run op by op, a batch-1 step on a small model spends more time between the kernels than
// in them: per layer about ten module calls, ten op dispatches, dozens of tensor methods
// and argument checks, and a thread-team fork and join per kernel. Here the layer stack
// runs inside one OpenMP region: each phase (norm, projection, rotary and cache write,
// attention, ...) splits its work among the team and ends at a barrier, and nothing is
// allocated or checked inside the loop; the arguments are checked once per step.
//
// Every phase calls the per-op kernels' own routines (quantized_dot.h, rms_norm.h,
// rotary.h, attend.h) on the same data in the same order, and SiLU is ATen's kernel, so
// a step with quantized weights gives the per-op path's bits exactly. Float32 weights take
// a plain dot product here (the per-op path's is the BLAS GEMM), equal to float rounding.
//
// Layers are added one by one at load (add_layer, then add_part for each part of the four
// projections: q|k|v, o, gate|up, down; a projection kept in several layouts has several
// parts, each a run of output columns; decode_step_parts.h holds them). The Python side
// (kvrelay_worker.engine.runner.cpu_decode) decides which models and batches it serves.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "attend.h"
#include "decode_step_parts.h"
#include "quantized_args.h"
#include "rms_norm.h"
#include "rotary.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

namespace {

using kvrelay_cpu::normalize_row;
using kvrelay_cpu::rotate_heads;
namespace qdot = kvrelay_cpu::qdot;
using kvrelay_cpu::decode_step::Blocks;
using kvrelay_cpu::decode_step::Layer;
using kvrelay_cpu::decode_step::Part;
using kvrelay_cpu::decode_step::Projection;
using kvrelay_cpu::decode_step::project;

class DecodeStep : public torch::CustomClassHolder {
 public:
  DecodeStep(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
             int64_t intermediate, double eps, double scale)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        intermediate_(intermediate), eps_(static_cast<float>(eps)),
        scale_(static_cast<float>(scale)) {
    TORCH_CHECK(hidden > 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                head_dim > 0 && intermediate > 0, "bad model shape");
  }

  void add_layer(const at::Tensor& input_norm, const at::Tensor& post_norm,
                 const at::Tensor& cos_sin, int64_t window, double softcap) {
    check_vector(input_norm, hidden_, "input_norm");
    check_vector(post_norm, hidden_, "post_norm");
    TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.dim() == 2 &&
                cos_sin.is_contiguous() && cos_sin.size(1) % 2 == 0 &&
                cos_sin.size(1) <= head_dim_, "cos_sin must be contiguous float32 "
                "[positions, rot_dim], rot_dim even and at most head_dim");
    Layer layer;
    layer.input_norm = input_norm;
    layer.post_norm = post_norm;
    layer.cos_sin = cos_sin;
    layer.window = window;
    layer.softcap = static_cast<float>(softcap);
    const int64_t q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    const int64_t n[4] = {q + 2 * kv, hidden_, 2 * intermediate_, hidden_};
    const int64_t k[4] = {hidden_, q, hidden_, intermediate_};
    for (int i = 0; i < 4; ++i) {
      layer.proj[i].k = k[i];
      layer.proj[i].n = n[i];
    }
    layers_.push_back(std::move(layer));
  }

  // The next run of output columns of projection `which` (0 q|k|v, 1 o, 2 gate|up,
  // 3 down) of the last layer added: bits 32 with a float32 weight, or 8 / 4 in
  // kvrelay_kernels.quantized_weight's layout.
  void add_part(int64_t which, const at::Tensor& weight, const c10::optional<at::Tensor>& scales,
                const c10::optional<at::Tensor>& mins, int64_t bits, int64_t group,
                const c10::optional<at::Tensor>& bias) {
    TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "add a layer first; which 0..3");
    Projection& p = layers_.back().proj[which];
    Part part;
    part.bits = bits;
    part.n = weight.size(0);
    part.first = p.parts.empty() ? 0 : p.parts.back().first + p.parts.back().n;
    TORCH_CHECK(part.first + part.n <= p.n, "parts exceed the projection's ", p.n, " columns");
    if (bits == 32) {
      TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 &&
                  weight.is_contiguous() && weight.size(1) == p.k,
                  "a float part must be contiguous float32 [n, ", p.k, "]");
    } else {
      TORCH_CHECK(scales.has_value(), "a quantized part needs scales");
      const at::Tensor probe = at::empty({1, p.k}, weight.options().dtype(at::kFloat));
      kvrelay_cpu::check_quantized_linear_args(probe, weight, *scales, mins, bits, group, bias);
      TORCH_CHECK(group % qdot::kBlock == 0 || (group == qdot::kBlock / 2 && bits == 8 && !mins),
                  "group_size must be a multiple of 32 (or 16, for int8 without mins)");
      TORCH_CHECK(bits == 8 || (p.k / 2) % qdot::kBlock == 0, "int4 needs K/2 a multiple of 32");
      TORCH_CHECK(p.k % qdot::kBlock == 0 && p.k / qdot::kBlock <= qdot::kMaxBlocks,
                  "K must be a multiple of 32, at most ", qdot::kMaxBlocks * qdot::kBlock);
      part.scales = *scales;
      if (mins) part.mins = *mins;
      part.group = group;
      p.quantized = true;
    }
    if (bias) {
      TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                  bias->numel() == part.n, "bias must be float32 [n]");
      part.bias = *bias;
    }
    part.weight = weight;
    p.parts.push_back(std::move(part));
  }

  void set_final_norm(const at::Tensor& weight) {
    check_vector(weight, hidden_, "final norm");
    final_norm_ = weight;
  }

  // Hidden states after the final norm [m, hidden] for m decode rows: `hidden` the
  // embedded tokens [m, hidden], each row one sequence with one new token at `positions`,
  // written to cache slot `slots`; `block_tables` [m, width] and `seq_lens` [m] (int32)
  // as the paged attention kernel reads them; `kv_caches` one [2, blocks, block_size,
  // kv_heads, head_dim] float32 tensor per layer.
  at::Tensor run(const at::Tensor& hidden, const at::Tensor& positions,
                 const std::vector<at::Tensor>& kv_caches, const at::Tensor& slots,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens) {
    check_run(hidden, positions, kv_caches, slots, block_tables, seq_lens);
    const int64_t m = hidden.size(0);
    resize(m);
    at::Tensor out = at::empty({m, hidden_}, hidden.options());
    std::vector<float*> caches;
    for (const at::Tensor& c : kv_caches) caches.push_back(c.data_ptr<float>());
    Inputs in{hidden.data_ptr<float>(), positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
              block_tables.data_ptr<int32_t>(), block_tables.size(1), seq_lens.data_ptr<int32_t>(),
              kv_caches.empty() ? 0 : kv_caches[0].size(1), kv_caches.empty() ? 0 : kv_caches[0].size(2),
              m, std::move(caches)};
    const int threads = static_cast<int>(std::max<int64_t>(1, at::get_num_threads()));
    silu_error_ = nullptr;
#pragma omp parallel num_threads(threads)
    {
      // The SiLU is ATen's, on views made on the caller's thread: inference tensors when
      // the caller is in inference mode, which only a thread in that mode may write.
      const c10::InferenceMode inference;
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      for (size_t l = 0; l < layers_.size(); ++l) run_layer(l, in, tid, nt);
      for (int64_t r = tid; r < m; r += nt) {
        float* s = residual_.data() + r * hidden_;
        const float* x = mlp_out_.data() + r * hidden_;
#pragma omp simd
        for (int64_t i = 0; i < hidden_; ++i) s[i] = s[i] + x[i];
        normalize_row(s, final_norm_.data_ptr<float>(), eps_, hidden_,
                      out.data_ptr<float>() + r * hidden_);
      }
    }
    if (silu_error_) std::rethrow_exception(silu_error_);
    return out;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  struct Inputs {
    const float* hidden;
    const int64_t* positions;
    const int64_t* slots;
    const int32_t* tables;
    int64_t table_width;
    const int32_t* seq_lens;
    int64_t num_blocks, block_size;
    int64_t m;
    std::vector<float*> caches;
  };

  static void check_vector(const at::Tensor& t, int64_t n, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 1 &&
                t.size(0) == n, what, " must be contiguous float32 [", n, "]");
  }

  void check_run(const at::Tensor& hidden, const at::Tensor& positions,
                 const std::vector<at::Tensor>& kv_caches, const at::Tensor& slots,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens) const {
    TORCH_CHECK(final_norm_.defined(), "the final norm is not set");
    for (const Layer& layer : layers_) {
      for (const Projection& p : layer.proj) {
        const int64_t filled = p.parts.empty() ? 0 : p.parts.back().first + p.parts.back().n;
        TORCH_CHECK(filled == p.n, "a projection has ", filled, " of its ", p.n, " columns");
      }
    }
    TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 &&
                hidden.is_contiguous() && hidden.size(1) == hidden_,
                "hidden must be contiguous float32 [m, ", hidden_, "]");
    const int64_t m = hidden.size(0);
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                positions.numel() == m, "positions must be contiguous int64 [m]");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == m,
                "slots must be contiguous int64 [m]");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 &&
                block_tables.is_contiguous() && block_tables.size(0) == m,
                "block_tables must be contiguous int32 [m, width]");
    TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() &&
                seq_lens.numel() == m, "seq_lens must be contiguous int32 [m]");
    TORCH_CHECK(static_cast<int64_t>(kv_caches.size()) == num_layers(), "one KV cache per layer");
    const at::Tensor& first = kv_caches.front();
    for (const at::Tensor& c : kv_caches) {
      TORCH_CHECK(c.scalar_type() == at::kFloat && c.is_contiguous() && c.dim() == 5 &&
                  c.size(0) == 2 && c.sizes() == first.sizes() && c.size(3) == kv_heads_ &&
                  c.size(4) == head_dim_, "KV caches must be contiguous float32 [2, blocks, "
                  "block_size, ", kv_heads_, ", ", head_dim_, "], all alike");
    }
    const int64_t capacity = first.size(1) * first.size(2);
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int64_t width = block_tables.size(1), block_size = first.size(2);
    for (int64_t r = 0; r < m; ++r) {
      TORCH_CHECK(slot[r] >= 0 && slot[r] < capacity, "slot ", slot[r], " is outside the cache");
      for (const Layer& layer : layers_) {
        TORCH_CHECK(pos[r] >= 0 && pos[r] < layer.cos_sin.size(0), "position ", pos[r],
                    " is outside the rotary table");
      }
      TORCH_CHECK(lens[r] == pos[r] + 1, "row ", r, ": a decode row's seq_len is its position + 1");
      TORCH_CHECK(lens[r] <= width * block_size, "row ", r, ": seq_len exceeds its block table");
      for (int64_t b = 0; b < (lens[r] + block_size - 1) / block_size; ++b) {
        TORCH_CHECK(tables[r * width + b] >= 0 && tables[r * width + b] < first.size(1),
                    "row ", r, ": block ", tables[r * width + b], " is outside the cache");
      }
    }
  }

  // Scratch for m rows, kept between steps (a step allocates nothing once warm).
  void resize(int64_t m) {
    const int64_t q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    auto grow = [m](std::vector<float>& v, int64_t width) {
      if (static_cast<int64_t>(v.size()) < m * width) v.resize(static_cast<size_t>(m * width));
    };
    grow(residual_, hidden_);
    grow(normed_, hidden_);
    grow(qkv_, q + 2 * kv);
    grow(attn_, q);
    grow(o_out_, hidden_);
    grow(gate_up_, 2 * intermediate_);
    grow(act_, intermediate_);
    grow(mlp_out_, hidden_);
    if (rows_ < m) {
      hidden_blocks_.resize(m, hidden_);
      attn_blocks_.resize(m, q);
      act_blocks_.resize(m, intermediate_);
      rows_ = m;
    }
    act_rows_.clear();
    gate_rows_.clear();
    up_rows_.clear();
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    for (int64_t r = 0; r < m; ++r) {  // ATen views of the SiLU's rows (its own kernel)
      act_rows_.push_back(at::from_blob(act_.data() + r * intermediate_, {intermediate_}, f32));
      gate_rows_.push_back(
          at::from_blob(gate_up_.data() + r * 2 * intermediate_, {intermediate_}, f32));
      up_rows_.push_back(at::from_blob(gate_up_.data() + r * 2 * intermediate_ + intermediate_,
                                       {intermediate_}, f32));
    }
  }

  // residual (+)= x, normed = norm(residual) for this thread's rows, then the int16 blocks
  // of the projection that reads normed.
  void add_norm(const float* x, const at::Tensor& weight, const Projection& next, int64_t m,
                int tid, int nt) {
    for (int64_t r = tid; r < m; r += nt) {
      float* s = residual_.data() + r * hidden_;
      if (x != nullptr) {
        const float* xr = x + r * hidden_;
#pragma omp simd
        for (int64_t i = 0; i < hidden_; ++i) s[i] = s[i] + xr[i];
      }
      float* normed = normed_.data() + r * hidden_;
      normalize_row(s, weight.data_ptr<float>(), eps_, hidden_, normed);
      if (next.quantized) hidden_blocks_.quantize(normed, r);
    }
  }

  void run_layer(size_t l, const Inputs& in, int tid, int nt) {
    const Layer& layer = layers_[l];
    const int64_t m = in.m, q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    const int64_t qkv_width = q_size + 2 * kv_size;
    // 1. input norm: the first layer's residual is the embedding, later ones add the MLP.
    if (l == 0) {
      for (int64_t r = tid; r < m; r += nt) {
        std::memcpy(residual_.data() + r * hidden_, in.hidden + r * hidden_,
                    static_cast<size_t>(hidden_) * sizeof(float));
      }
    }
    add_norm(l == 0 ? nullptr : mlp_out_.data(), layer.input_norm, layer.proj[0], m, tid, nt);
#pragma omp barrier
    project(layer.proj[0], normed_.data(), hidden_blocks_, m, qkv_.data(), tid, nt);
#pragma omp barrier
    // 2. rotary on q and k, then k and v into the cache slot.
    float* cache = in.caches[l];
    const int64_t token_stride = kv_heads_ * head_dim_;
    float* key_cache = cache;
    float* value_cache = cache + in.num_blocks * in.block_size * token_stride;
    const int64_t rot_dim = layer.cos_sin.size(1);
    for (int64_t r = tid; r < m; r += nt) {
      float* row = qkv_.data() + r * qkv_width;
      const float* cos = layer.cos_sin.data_ptr<float>() + in.positions[r] * rot_dim;
      rotate_heads(row, heads_, head_dim_, cos, rot_dim / 2, true);
      rotate_heads(row + q_size, kv_heads_, head_dim_, cos, rot_dim / 2, true);
      const size_t bytes = static_cast<size_t>(kv_size) * sizeof(float);
      std::memcpy(key_cache + in.slots[r] * token_stride, row + q_size, bytes);
      std::memcpy(value_cache + in.slots[r] * token_stride, row + q_size + kv_size, bytes);
    }
#pragma omp barrier
    // 3. attention, one task per (row, KV head).
    for (int64_t task = tid; task < m * kv_heads_; task += nt) {
      const int64_t r = task / kv_heads_, kv_head = task % kv_heads_;
      kvrelay_cpu::attend::attend_task<float>(
          r, kv_head, qkv_.data(), qkv_width, head_dim_, key_cache, value_cache, in.block_size,
          kv_heads_, head_dim_, in.tables + r * in.table_width, r, 1, in.seq_lens[r],
          heads_ / kv_heads_, scale_, layer.softcap, layer.window, attn_.data(), q_size,
          head_dim_);
    }
#pragma omp barrier
    if (layer.proj[1].quantized) {
      for (int64_t r = tid; r < m; r += nt) attn_blocks_.quantize(attn_.data() + r * q_size, r);
#pragma omp barrier
    }
    project(layer.proj[1], attn_.data(), attn_blocks_, m, o_out_.data(), tid, nt);
#pragma omp barrier
    // 4. post-attention norm, gate|up, SiLU(gate) * up, down.
    add_norm(o_out_.data(), layer.post_norm, layer.proj[2], m, tid, nt);
#pragma omp barrier
    project(layer.proj[2], normed_.data(), hidden_blocks_, m, gate_up_.data(), tid, nt);
#pragma omp barrier
    for (int64_t r = tid; r < m; r += nt) {
      try {  // an exception must not leave the parallel region (it would terminate)
        at::silu_out(act_rows_[static_cast<size_t>(r)], gate_rows_[static_cast<size_t>(r)]);
        act_rows_[static_cast<size_t>(r)].mul_(up_rows_[static_cast<size_t>(r)]);
      } catch (...) {
#pragma omp critical(kvrelay_decode_step_error)
        if (!silu_error_) silu_error_ = std::current_exception();
      }
      if (layer.proj[3].quantized) act_blocks_.quantize(act_.data() + r * intermediate_, r);
    }
#pragma omp barrier
    project(layer.proj[3], act_.data(), act_blocks_, m, mlp_out_.data(), tid, nt);
#pragma omp barrier
  }

  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  float eps_, scale_;
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  int64_t rows_ = 0;
  std::vector<float> residual_, normed_, qkv_, attn_, o_out_, gate_up_, act_, mlp_out_;
  Blocks hidden_blocks_, attn_blocks_, act_blocks_;
  std::vector<at::Tensor> act_rows_, gate_rows_, up_rows_;
  std::exception_ptr silu_error_;  // the first error of a step's SiLU, raised after it
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvrelay_cpu, m) {
  m.class_<DecodeStep>("DecodeStep")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &DecodeStep::add_layer)
      .def("add_part", &DecodeStep::add_part)
      .def("set_final_norm", &DecodeStep::set_final_norm)
      .def("num_layers", &DecodeStep::num_layers)
      .def("run", &DecodeStep::run);
}
