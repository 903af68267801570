// Interpolating resampling — linear, bilinear, bicubic, trilinear. Each output is a sum over a product of
// per-axis taps,
//     out[o_1 … o_S] = Σ_{i_1 … i_S} Π_d A_d[o_d, i_d] · x[i_1 … i_S],
// so an edge's weight is the product Π_d A_d[o_d, i_d] and, since lift turns
// products into ⊗ in every semiring, the value of x is S semiring matmuls, one
// per axis (distributivity: no path is lost or doubled). A_d is read off the op
// itself: resampling an identity along axis d alone, on the value's device.
// Cost: S semiring matmuls, (C·rest, out_d) × (out_d, in_d) for axis d. (The
// antialiased variants are left without a rule: their backward's Jacobian is
// not the product of their forward's per-axis taps, measured against the
// reference.)
//
// Adaptive average pooling is area resampling and separable the same way:
// output (i, j) averages rows [⌊iH/OH⌋, ⌈(i+1)H/OH⌉) × cols [⌊jW/OW⌋,
// ⌈(j+1)W/OW⌉) with weight 1/(rows·cols) = (1/rows)·(1/cols); windows may
// overlap and differ in size, and the taps, read off the op, hold all that.
#include <torch/csrc/autograd/generated/Functions.h>

#include "rule.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

using Scales = std::vector<std::optional<double>>;
// The forward op, on a (1, channels, *spatial) input, with this node's
// align_corners and the given per-axis output sizes and scales.
using Resample = std::function<Tensor(const Tensor&, at::IntArrayRef, const Scales&)>;

// A_d as an (out_d, in_d) matrix, computed in float64 on the device of `value_options`.
Tensor axis_taps(const Resample& resample, int64_t S, int64_t d, int64_t in, int64_t out,
                 std::optional<double> scale, const at::TensorOptions& value_options) {
  std::vector<int64_t> shape(2 + S, 1), out_size(S, 1);
  shape[1] = shape[2 + d] = in;
  out_size[d] = out;
  Scales scales(S);
  scales[d] = scale;
  auto identity = at::eye(in, value_options.dtype(at::kDouble)).view(shape);
  return resample(identity, out_size, scales).reshape({in, out}).t();
}

Tensor separable_value(const Semiring& sr, Tensor g, const Resample& resample, at::IntArrayRef in_shape,
                       const Scales& scales) {
  const int64_t S = (int64_t)scales.size(), lead = g.dim() - S;
  for (int64_t d = 0; d < S; ++d) {
    const int64_t axis = lead + d, in = in_shape[in_shape.size() - S + d];
    auto taps = axis_taps(resample, S, d, in, g.size(axis), scales[d], g.options()).to(g.scalar_type());  // (out, in)
    auto moved = g.movedim(axis, -1);
    auto sizes = moved.sizes().vec();
    auto v = sr.matmul(moved.reshape({g.size(0), -1, g.size(axis)}), taps);  // ⊕ over this axis' outputs
    sizes.back() = in;
    g = v.view(sizes).movedim(-1, axis);
  }
  return g;
}

template <class N>
Scales scales_of(const N& n);
template <> Scales scales_of(const UpsampleLinear1DBackward0& n) { return {n.scales}; }
template <> Scales scales_of(const UpsampleBilinear2DBackward0& n) { return {n.scales_h, n.scales_w}; }
template <> Scales scales_of(const UpsampleBicubic2DBackward0& n) { return {n.scales_h, n.scales_w}; }
template <> Scales scales_of(const UpsampleTrilinear3DBackward0& n) { return {n.scales_d, n.scales_h, n.scales_w}; }

template <class N>
Rule resampling_rule(Tensor (*op)(const Tensor&, at::IntArrayRef, bool, const Scales&)) {
  return [op](const RuleContext& ctx, const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    if (!ctx.needs(0)) return {};
    auto& n = static_cast<N&>(ctx.node);
    const bool align = n.align_corners;
    Resample resample = [op, align](const Tensor& x, at::IntArrayRef out, const Scales& s) { return op(x, out, align, s); };
    return {separable_value(ctx.semiring, grads[0], resample, ctx.input_shape(0), scales_of(n))};
  };
}

Tensor linear1d(const Tensor& x, at::IntArrayRef o, bool a, const Scales& s) { return at::upsample_linear1d(x, o, a, s[0]); }
Tensor bilinear2d(const Tensor& x, at::IntArrayRef o, bool a, const Scales& s) {
  return at::upsample_bilinear2d(x, o, a, s[0], s[1]);
}
Tensor bicubic2d(const Tensor& x, at::IntArrayRef o, bool a, const Scales& s) {
  return at::upsample_bicubic2d(x, o, a, s[0], s[1]);
}
// adaptive_avg_pool2d takes no align_corners or scales: the output size alone sets the windows.
std::vector<Tensor> adaptive_avg_pool2d_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0)) return {};
  Resample resample = [](const Tensor& x, at::IntArrayRef out, const Scales&) { return at::adaptive_avg_pool2d(x, out); };
  return {separable_value(ctx.semiring, grads[0], resample, ctx.input_shape(0), Scales(2))};
}

Tensor trilinear3d(const Tensor& x, at::IntArrayRef o, bool a, const Scales& s) {
  return at::upsample_trilinear3d(x, o, a, s[0], s[1], s[2]);
}

}  // namespace

void register_resampling_rules() {
  register_rule("AdaptiveAvgPool2DBackward0", adaptive_avg_pool2d_rule, "resampling");
  register_rule("UpsampleLinear1DBackward0", resampling_rule<UpsampleLinear1DBackward0>(linear1d), "resampling");
  register_rule("UpsampleBilinear2DBackward0", resampling_rule<UpsampleBilinear2DBackward0>(bilinear2d), "resampling");
  register_rule("UpsampleBicubic2DBackward0", resampling_rule<UpsampleBicubic2DBackward0>(bicubic2d), "resampling");
  register_rule("UpsampleTrilinear3DBackward0", resampling_rule<UpsampleTrilinear3DBackward0>(trilinear3d),
                "resampling");
}

}  // namespace torch_semiring
