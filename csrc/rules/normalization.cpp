// native_layer_norm, _fused_rms_norm and native_batch_norm. Per normalized row (N elements),
// with x̂ the normalized input, r = 1/std and c_i = w_i·r:
//     layer norm:  J[i, j] = c_i (δ_ij − (1 + x̂_i x̂_j) / N)
//     RMS norm:    J[i, j] = c_i (δ_ij −       x̂_i x̂_j  / N)
// Off the diagonal both factor through lift(ab) = lift(a) ⊗ lift(b):
//     layer norm:  ⊕_{i≠j} (g_i ⊗ lift(−c_i/N)) ⊗ lift(1 + x̂_i x̂_j)
//                  = Semiring::norm_offdiagonal — without the block in the
//                  built-in semirings (kernels/norm_rows: O(N log N) sorted
//                  range sums and envelopes of lines; a direct O(N²/L) pair
//                  pass for the sums on rows of up to ~1 000 float32 elements, where it is
//                  cheaper, and for entropy's φ term);
//     RMS norm:    lift(x̂_j) ⊗ ⊕_{i≠j} (g_i ⊗ lift(−c_i x̂_i/N)), an "all but
//                  me" ⊕ (Semiring::exclusive_oplus): O(N) a row.
// The stock backward costs O(N) a row; the diagonal is one element-wise ⊗.
// weight: one edge x̂ per element (⊕ over rows by the engine's broadcast
// reduction); bias: one edge of weight 1.
// Batch norm normalizes each channel over the batch and spatial dims: with
// running statistics (eval) its Jacobian is diagonal; with batch statistics
// (training) each channel is one row of the layer-norm form above.
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include "kernels/cpu_gemm.h"  // TS_CPU_CLONES
#include "rules/normalization.h"
#include "rule.h"

#include <cstdlib>
#include <string>

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

// The per-element edge weights of a row: off the diagonal (the factor of
// lift(1 + x̂_i x̂_j) in layer norm, of the "all but me" sum in RMS norm) and on it.
struct RowWeights {
  Tensor off_diagonal, diagonal;
};
RowWeights row_weights(const Tensor& x_hat, const Tensor& c, int64_t N, bool centered) {
  const double n = double(N);
  if (centered) return {c / -n, c * (1.0 - (1.0 + x_hat * x_hat) / n)};
  return {c * x_hat / -n, c * (1.0 - x_hat * x_hat / n)};
}

// Layer norm's x̂ and row weights from the saved mean and 1/std in ONE pass
// over the rows (contiguous float32/float64 CPU tensors; undefined results
// otherwise): the 9 element-wise ATen passes of x̂ = (x − mean)·rstd,
// c = rstd·w, c/−N and c·(1 − (1 + x̂²)/N), each rounded as those ops round
// it (no contraction into FMAs). O(N) a row,
// vectorised; ~25 µs less per norm of MiniLM (64 × 384, float32).
#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=off")  // each op rounded as ATen rounds it
template <class T>
inline __attribute__((always_inline)) void layer_norm_weights_impl(const T* x, const T* mean, const T* rstd,
                                                                   const T* w, T* x_hat, T* off, T* diag,
                                                                   int64_t rows, int64_t N) {
  const T n = T(N), minus_n = -T(N);
  for (int64_t r = 0; r < rows; ++r) {
    const T m = mean[r], s = rstd[r];
    const T* xr = x + r * N;
    T *h = x_hat + r * N, *o = off + r * N, *d = diag + r * N;
    for (int64_t i = 0; i < N; ++i) {
      const T xh = (xr[i] - m) * s;
      const T c = w ? s * w[i] : s;
      h[i] = xh;
      o[i] = c / minus_n;
      d[i] = c * (T(1) - (T(1) + xh * xh) / n);
    }
  }
}
TS_CPU_CLONES void layer_norm_weights(const float* x, const float* mean, const float* rstd, const float* w,
                                      float* x_hat, float* off, float* diag, int64_t rows, int64_t N) {
  layer_norm_weights_impl(x, mean, rstd, w, x_hat, off, diag, rows, N);
}
TS_CPU_CLONES void layer_norm_weights(const double* x, const double* mean, const double* rstd, const double* w,
                                      double* x_hat, double* off, double* diag, int64_t rows, int64_t N) {
  layer_norm_weights_impl(x, mean, rstd, w, x_hat, off, diag, rows, N);
}
#pragma GCC pop_options

// TORCH_SEMIRING_FUSED_NORM_WEIGHTS=0 takes the ATen expressions instead (tests compare both; read per node).
bool fused_weights_enabled() {
  const char* v = std::getenv("TORCH_SEMIRING_FUSED_NORM_WEIGHTS");
  return !(v && std::string(v) == "0");
}

// x̂ and the row weights of layer norm, fused where it applies (above), else by ATen.
std::pair<Tensor, RowWeights> layer_norm_inputs(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                                const Tensor& weight, int64_t N) {
  const auto t = x.scalar_type();
  const int64_t rows = N > 0 ? x.numel() / N : 0;
  const bool fused = (t == at::kFloat || t == at::kDouble) && rows > 0 && x.device().is_cpu() &&
                     mean.scalar_type() == t && rstd.scalar_type() == t && mean.numel() == rows &&
                     rstd.numel() == rows && (!weight.defined() || (weight.scalar_type() == t &&
                                                                   weight.numel() == N && weight.device().is_cpu())) &&
                     !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) &&
                     fused_weights_enabled();
  if (!fused) {
    auto x_hat = (x - mean) * rstd;
    auto scale = weight.defined() ? rstd * weight : rstd.expand_as(x_hat);
    return {x_hat, row_weights(x_hat, scale.expand_as(x_hat), N, /*centered=*/true)};
  }
  auto xc = x.contiguous(), mc = mean.contiguous(), rc = rstd.contiguous();
  auto wc = weight.defined() ? weight.contiguous() : Tensor();
  auto x_hat = at::empty_like(xc), off = at::empty_like(xc), diag = at::empty_like(xc);
  if (t == at::kFloat)
    layer_norm_weights(xc.data_ptr<float>(), mc.data_ptr<float>(), rc.data_ptr<float>(),
                       wc.defined() ? wc.data_ptr<float>() : nullptr, x_hat.data_ptr<float>(), off.data_ptr<float>(),
                       diag.data_ptr<float>(), rows, N);
  else
    layer_norm_weights(xc.data_ptr<double>(), mc.data_ptr<double>(), rc.data_ptr<double>(),
                       wc.defined() ? wc.data_ptr<double>() : nullptr, x_hat.data_ptr<double>(),
                       off.data_ptr<double>(), diag.data_ptr<double>(), rows, N);
  return {x_hat, {off, diag}};
}

// Value of the normalized input. g: shape (C, *rows, N…); x_hat and the
// weights: (*rows, N…).
Tensor normalized_input_value(const Semiring& sr, const Tensor& g, const Tensor& x_hat, const RowWeights& w,
                              int64_t N, bool centered) {
  const int64_t C = g.size(0), rows = x_hat.numel() / std::max<int64_t>(N, 1);
  auto xh = x_hat.reshape({rows, N});
  auto gv = g.reshape({C, rows, N});
  auto off = w.off_diagonal.reshape({rows, N}), diag = w.diagonal.reshape({rows, N});
  Tensor off_diagonal;
  if (centered) off_diagonal = sr.norm_offdiagonal(sr.otimes_edge(gv, off), xh);
  else off_diagonal = sr.otimes_edge(sr.exclusive_oplus(sr.otimes_edge(gv, off), -1), xh);
  return sr.oplus(off_diagonal, sr.otimes_edge(gv, diag)).reshape(g.sizes());
}

// weights: the row weights of the input edge, where it is needed.
std::vector<Tensor> normalization(const RuleContext& ctx, const Tensor& g, const Tensor& x_hat,
                                  const RowWeights& weights, int64_t N, bool centered, bool has_bias) {
  const auto& sr = ctx.semiring;
  std::vector<Tensor> out(has_bias ? 3 : 2);
  if (ctx.needs(0)) out[0] = normalized_input_value(sr, g, x_hat, weights, N, centered);
  if (ctx.needs(1)) out[1] = sr.otimes_edge(g, x_hat);
  if (has_bias && ctx.needs(2)) out[2] = g;
  return out;
}

int64_t numel_of(const std::vector<c10::SymInt>& shape) {
  int64_t n = 1;
  for (const auto& s : shape) n *= s.expect_int();
  return n;
}
int64_t numel_of(const std::vector<int64_t>& shape) {  // (_fused_rms_norm's node keeps plain ints)
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<Tensor> layer_norm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  TORCH_CHECK(std::all_of(grads.begin() + 1, grads.end(), [](const Tensor& t) { return !t.defined(); }), "torch_semiring: values arriving at the mean/rstd "
              "outputs of native_layer_norm are not supported (only its normalized output is)");
  auto& n = static_cast<NativeLayerNormBackward0&>(ctx.node);
  const int64_t N = numel_of(n.normalized_shape);
  auto inputs = layer_norm_inputs(ctx.unpack(n.input_), ctx.unpack(n.result1_), ctx.unpack(n.result2_),
                                  ctx.unpack(n.weight_), N);
  return normalization(ctx, grads[0], inputs.first, inputs.second, N, /*centered=*/true, /*has_bias=*/true);
}

std::vector<Tensor> rms_norm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  TORCH_CHECK(grads.size() < 2 || !grads[1].defined(), "torch_semiring: values arriving at the rstd output of "
              "_fused_rms_norm are not supported (only its normalized output is)");
  auto& n = static_cast<FusedRmsNormBackward0&>(ctx.node);
  auto x = ctx.unpack(n.input_);
  auto rstd = ctx.unpack(n.result1_), weight = ctx.unpack(n.weight_);
  const int64_t N = numel_of(n.normalized_shape);
  auto x_hat = x * rstd;
  RowWeights weights;
  if (ctx.needs(0)) {
    auto scale = weight.defined() ? rstd * weight : rstd.expand_as(x_hat);
    weights = row_weights(x_hat, scale.expand_as(x_hat), N, /*centered=*/false);
  }
  return normalization(ctx, grads[0], x_hat, weights, N, /*centered=*/false, /*has_bias=*/false);
}

// What the batch-norm rule reads off a node: native_batch_norm's and CUDA's
// cudnn_batch_norm's save the same fields (cuDNN's result2 is its saved
// inverse standard deviation, as native's save_invstd) under two names for ε.
struct SavedBatchNorm {
  Tensor x, running_mean, running_var, weight, save_mean, save_invstd;
  double eps;
  bool training;
};

std::vector<Tensor> batch_norm_values(const RuleContext& ctx, const std::vector<Tensor>& grads,
                                      const SavedBatchNorm& n) {
  TORCH_CHECK(std::all_of(grads.begin() + 1, grads.end(), [](const Tensor& t) { return !t.defined(); }),
              "torch_semiring: values arriving at the save_mean/save_invstd outputs of ", ctx.node.name(),
              " are not supported (only its normalized output is)");
  const auto& sr = ctx.semiring;
  const Tensor& g = grads[0];
  const auto& x = n.x;
  const int64_t channels = x.size(1), C = g.size(0);
  std::vector<int64_t> per_channel(x.dim(), 1);
  per_channel[1] = channels;
  Tensor mean, invstd;
  if (n.training) {  // batch statistics, saved by the forward
    mean = n.save_mean;
    invstd = n.save_invstd;
  } else {
    mean = n.running_mean;
    invstd = (n.running_var + n.eps).rsqrt();
  }
  auto x_hat = (x - mean.view(per_channel)) * invstd.view(per_channel);
  const auto& weight = n.weight;
  std::vector<int64_t> not_channel{0};
  for (int64_t d = 2; d < x.dim(); ++d) not_channel.push_back(d);
  std::vector<Tensor> out(3);
  if (ctx.needs(0)) {
    auto scale = (weight.defined() ? invstd * weight : invstd).view(per_channel).expand_as(x);
    if (!n.training) {
      out[0] = sr.otimes_edge(g, scale);
    } else {
      const int64_t M = x.numel() / channels;
      // channels as rows: (C, B, ch, *S) → (C, ch, B·S), and back
      auto g_rows = g.movedim(2, 1);
      auto xh = x_hat.movedim(1, 0).reshape({channels, M});
      auto rows = normalized_input_value(sr, g_rows.reshape({C, channels, M}), xh,
                                         row_weights(xh, scale.movedim(1, 0).reshape({channels, M}), M, true), M,
                                         /*centered=*/true);
      out[0] = rows.view(g_rows.sizes()).movedim(1, 2);
    }
  }
  if (ctx.needs(1)) out[1] = sr.oplus_reduce(sr.otimes_edge(g, x_hat), not_channel, false);
  if (ctx.needs(2)) out[2] = sr.oplus_reduce(g, not_channel, false);
  return out;
}

std::vector<Tensor> batch_norm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<NativeBatchNormBackward0&>(ctx.node);
  return batch_norm_values(ctx, grads, {ctx.unpack(n.input_), ctx.unpack(n.running_mean_), ctx.unpack(n.running_var_),
                                        ctx.unpack(n.weight_), ctx.unpack(n.result1_), ctx.unpack(n.result2_), n.eps,
                                        n.training});
}

// CUDA's batch norm through cuDNN (on the CPU: cudnn_batch_norm_node_standin).
std::vector<Tensor> cudnn_batch_norm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<CudnnBatchNormBackward0&>(ctx.node);
  return batch_norm_values(ctx, grads, {ctx.unpack(n.input_), ctx.unpack(n.running_mean_), ctx.unpack(n.running_var_),
                                        ctx.unpack(n.weight_), ctx.unpack(n.result1_), ctx.unpack(n.result2_),
                                        n.epsilon, n.training});
}

}  // namespace

void register_normalization_rules() {
  register_rule("NativeBatchNormBackward0", batch_norm_rule, "normalization");
  register_rule("CudnnBatchNormBackward0", cudnn_batch_norm_rule, "normalization");
  register_rule("NativeLayerNormBackward0", layer_norm_rule, "normalization", [](const Node& n) {
    return numel_of(static_cast<const NativeLayerNormBackward0&>(n).normalized_shape);
  });
  register_rule("FusedRmsNormBackward0", rms_norm_rule, "normalization", [](const Node& n) {
    return numel_of(static_cast<const FusedRmsNormBackward0&>(n).normalized_shape);
  });
}

Tensor cudnn_batch_norm_node_standin(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                     const Tensor& running_mean, const Tensor& running_var, const Tensor& out,
                                     const Tensor& save_mean, const Tensor& save_invstd, bool training, double eps) {
  using torch::autograd::SavedVariable;
  auto node = make_node<CudnnBatchNormBackward0>();
  node->input_ = SavedVariable(input, false);
  node->weight_ = SavedVariable(weight, false);
  node->running_mean_ = SavedVariable(running_mean, false);
  node->running_var_ = SavedVariable(running_var, false);
  node->result1_ = SavedVariable(save_mean, false);
  node->result2_ = SavedVariable(save_invstd, false);
  node->epsilon = eps;
  node->training = training;
  node->set_next_edges(torch::autograd::collect_next_edges(input, weight, bias));
  auto result = out.detach().clone();
  torch::autograd::set_history(result, node);
  return result;
}

}  // namespace torch_semiring
