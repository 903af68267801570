// Sliding-window ops over 1-D and 2-D spatial dims: convolution (input,
// weight, bias; stride, padding, dilation, groups) and average pooling (fixed
// and adaptive windows). Both
// are written through im2col — the columns a window sees:
//   conv:  y[b, o, l] = Σ_j W[o, j] · cols[b, j, l] + bias[o]
// so   input:   v_cols[b, j, l] = ⊕_o g[b, o, l] ⊗ lift(W[o, j])   (semiring matmul)
//               v_x[b, c, p]    = ⊕ of v_cols over the (j, l) whose column entry is pixel p (⊕-scatter)
//      weight:  v_W[o, j]       = ⊕_{b,l} g[b, o, l] ⊗ lift(cols[b, j, l])   (semiring matmul)
//      bias:    v_b[o]          = ⊕_{b,l} g[b, o, l]
// The ⊕-scatter is col2im with ⊕ (fold_windows). Zero weights and padded
// zeros lift to the semiring zero: no edge.
#include <torch/csrc/autograd/generated/Functions.h>

#include "rule.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

std::vector<int64_t> ints(const std::vector<c10::SymInt>& v) {
  std::vector<int64_t> out;
  for (const auto& s : v) out.push_back(s.expect_int());
  return out;
}

// Window geometry in 2-D form (1-D ops get a unit height).
struct Windows {
  std::vector<int64_t> kernel, stride, padding, dilation;
  std::vector<int64_t> out_size;  // (out_h, out_w): the op's output (ceil_mode may add windows)

  static std::vector<int64_t> as2d(std::vector<int64_t> v, int64_t fill) {
    if (v.size() == 1) v.insert(v.begin(), fill);
    return v;
  }
  Windows(std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p, std::vector<int64_t> d,
          std::vector<int64_t> out)
      : kernel(as2d(std::move(k), 1)),
        stride(as2d(std::move(s), 1)),
        padding(as2d(std::move(p), 0)),
        dilation(as2d(std::move(d), 1)),
        out_size(as2d(std::move(out), 1)) {}
  int64_t K() const { return kernel[0] * kernel[1]; }
  int64_t L() const { return out_size[0] * out_size[1]; }
};

// col2im with ⊕: window values v (C, B, channels, K, L) go back to the pixels
// they read, (C, B, channels, height, width); K may be 1 when every entry of a
// window carries the same value (average pooling). One ⊕ per kernel offset: for a
// fixed offset the windows read distinct pixels, a strided slice of the padded
// image. Entries that read padding are dropped; pixels no window reads stay zero.
Tensor fold_windows(const Semiring& sr, const Tensor& v, const Windows& w, int64_t height, int64_t width) {
  const int64_t C = v.size(0), B = v.size(1), channels = v.size(2);
  const int64_t oh = w.out_size[0], ow = w.out_size[1];
  auto reach = [&](int64_t d) {  // padded extent every window fits in (ceil_mode windows may overhang)
    const int64_t size = d == 0 ? height : width;
    return std::max(size + 2 * w.padding[d], (w.out_size[d] - 1) * w.stride[d] + (w.kernel[d] - 1) * w.dilation[d] + 1);
  };
  auto image = sr.zero({B, channels, reach(0), reach(1)}, v.options());
  const bool shared = v.size(3) == 1;
  auto entries = v.reshape({C, B, channels, v.size(3), oh, ow});
  for (int64_t i = 0; i < w.kernel[0]; ++i)
    for (int64_t j = 0; j < w.kernel[1]; ++j) {
      auto slice = image.slice(3, i * w.dilation[0], i * w.dilation[0] + (oh - 1) * w.stride[0] + 1, w.stride[0])
                       .slice(4, j * w.dilation[1], j * w.dilation[1] + (ow - 1) * w.stride[1] + 1, w.stride[1]);
      slice.copy_(sr.oplus(slice, entries.select(3, shared ? 0 : i * w.kernel[1] + j)));
    }
  return image.narrow(3, w.padding[0], height).narrow(4, w.padding[1], width);
}

std::vector<Tensor> convolution_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ConvolutionBackward0&>(ctx.node);
  const auto& sr = ctx.semiring;
  auto weight = ctx.unpack(n.weight_);
  const int64_t spatial = weight.dim() - 2;
  TORCH_CHECK_NOT_IMPLEMENTED(!n.transposed && (spatial == 1 || spatial == 2), "torch_semiring: the semiring rule "
                              "of ConvolutionBackward0 covers 1-D and 2-D, non-transposed convolutions; this one is ",
                              spatial, "-D", n.transposed ? " transposed" : "", ". Register a rule with "
                              "torch_semiring.register_rule('ConvolutionBackward0', rule) to extend it.");
  const Tensor& g = grads[0];  // (C, B, Cout, *spatial): F.conv* batch an unbatched input before the op
  const int64_t C = g.size(0);
  const int64_t B = g.size(1), Cout = g.size(2), G = n.groups.expect_int();
  Windows win(std::vector<int64_t>(weight.sizes().begin() + 2, weight.sizes().end()), ints(n.stride), ints(n.padding),
              ints(n.dilation), std::vector<int64_t>(g.sizes().begin() + 3, g.sizes().end()));
  const int64_t K = win.K(), L = win.L(), CinG = weight.size(1), CoutG = Cout / G;
  auto gl = g.reshape({C, B, G, CoutG, L});
  auto w = weight.reshape({G, CoutG, CinG * K});
  std::vector<Tensor> out(3);
  if (ctx.needs(0)) {
    const auto in_shape = ctx.input_shape(0);
    const int64_t height = spatial == 2 ? in_shape[in_shape.size() - 2] : 1, width = in_shape.back();
    // (C, B, G, L, CinG·K): ⊕ over each group's output channels
    auto cols = sr.matmul(gl.permute({0, 1, 2, 4, 3}), w.unsqueeze(0).expand({B, G, CoutG, CinG * K}));
    cols = cols.reshape({C, B, G, L, CinG, K}).permute({0, 1, 2, 4, 5, 3}).reshape({C, B, G * CinG, K, L});
    auto v = fold_windows(sr, cols, win, height, width);
    std::vector<int64_t> shape{C};
    shape.insert(shape.end(), in_shape.begin(), in_shape.end());
    out[0] = v.reshape(shape);
  }
  if (ctx.needs(1)) {
    auto x = ctx.unpack(n.input_);
    if (spatial == 1) x = x.unsqueeze(2);
    auto cols = at::im2col(x, win.kernel, win.dilation, win.padding, win.stride)  // (B, Cin·K, windows)
                    .view({B, G, CinG * K, -1})
                    .narrow(3, 0, L);
    // (C, G, CoutG, CinG·K): ⊕ over batch and positions
    auto v = sr.matmul(gl.permute({0, 2, 3, 1, 4}).reshape({C, G, CoutG, B * L}),
                       cols.permute({1, 0, 3, 2}).reshape({G, B * L, CinG * K}));
    std::vector<int64_t> shape{C};
    shape.insert(shape.end(), weight.sizes().begin(), weight.sizes().end());
    out[1] = v.reshape(shape);
  }
  if (ctx.needs(2)) out[2] = sr.oplus_reduce(gl.permute({0, 2, 3, 1, 4}).reshape({C, Cout, B * L}), {1}, false);
  return out;
}

// avg_pool2d: each output o averages its window with weight 1/divisor(o) per
// input element. The weight is read off the op itself on ones: average / sum
// of the real (non-padding) elements of the window.
std::vector<Tensor> avg_pool2d_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<AvgPool2DBackward0&>(ctx.node);
  if (!ctx.needs(0)) return {};
  const auto& sr = ctx.semiring;
  const auto in_shape = ctx.input_shape(0);
  const int64_t height = in_shape[in_shape.size() - 2], width = in_shape.back();
  Tensor g = grads[0];
  const int64_t C = g.size(0), planes = g[0].numel() / (g.size(-1) * g.size(-2));
  auto stride = n.stride.empty() ? n.kernel_size : n.stride;
  Windows win(n.kernel_size, stride, n.padding, {1, 1}, {g.size(-2), g.size(-1)});
  auto ones = at::ones({1, 1, height, width}, g.options().dtype(at::kDouble));
  auto avg = at::avg_pool2d(ones, n.kernel_size, stride, n.padding, n.ceil_mode, n.count_include_pad,
                            n.divisor_override);
  auto sum = at::avg_pool2d(ones, n.kernel_size, stride, n.padding, n.ceil_mode, true, 1);
  auto weight = (avg / sum).to(g.scalar_type()).view({1, win.L()});
  auto gw = sr.otimes_edge(g.reshape({C, 1, planes, 1, win.L()}), weight);
  auto v = fold_windows(sr, gw, win, height, width);
  std::vector<int64_t> shape{C};
  shape.insert(shape.end(), in_shape.begin(), in_shape.end());
  return {v.reshape(shape)};
}

// adaptive_avg_pool2d: output (i, j) averages rows [⌊iH/OH⌋, ⌈(i+1)H/OH⌉) ×
// cols [⌊jW/OW⌋, ⌈(j+1)W/OW⌉); windows may overlap and differ in size, so the
// (output, input, weight) pairs are listed and ⊕-scattered.
std::vector<Tensor> adaptive_avg_pool2d_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0)) return {};
  const auto& sr = ctx.semiring;
  const auto in_shape = ctx.input_shape(0);
  const Tensor& g = grads[0];
  const int64_t C = g.size(0), H = in_shape[in_shape.size() - 2], W = in_shape.back();
  const int64_t OH = g.size(-2), OW = g.size(-1), planes = g[0].numel() / (OH * OW);
  auto window = [](int64_t o, int64_t size, int64_t out) {
    return std::make_pair(o * size / out, ((o + 1) * size + out - 1) / out);
  };
  std::vector<int64_t> source, target;
  std::vector<double> weight;
  for (int64_t i = 0; i < OH; ++i)
    for (int64_t j = 0; j < OW; ++j) {
      auto [h0, h1] = window(i, H, OH);
      auto [w0, w1] = window(j, W, OW);
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) {
          source.push_back(i * OW + j);
          target.push_back(h * W + w);
          weight.push_back(1.0 / double((h1 - h0) * (w1 - w0)));
        }
    }
  const auto longs = at::TensorOptions().dtype(at::kLong);
  auto src = at::tensor(source, longs), dst = at::tensor(target, longs);
  auto picked = g.reshape({C, planes, OH * OW}).index_select(2, src);  // (C, planes, pairs)
  picked = sr.otimes_edge(picked, at::tensor(weight, at::TensorOptions().dtype(at::kDouble)).to(g.scalar_type()));
  auto index = (at::arange(planes, longs).unsqueeze(1) * (H * W) + dst).reshape(-1);
  auto v = sr.scatter_oplus(picked.reshape({C, -1}), index, planes * H * W);
  std::vector<int64_t> shape{C};
  shape.insert(shape.end(), in_shape.begin(), in_shape.end());
  return {v.view(shape)};
}

}  // namespace

void register_convolution_rules() {
  register_rule("AdaptiveAvgPool2DBackward0", adaptive_avg_pool2d_rule, "convolution");
  register_rule("ConvolutionBackward0", convolution_rule, "convolution");
  register_rule("AvgPool2DBackward0", avg_pool2d_rule, "convolution");
}

}  // namespace torch_semiring
