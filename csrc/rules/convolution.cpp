// Sliding-window ops over 1–3 spatial dims: convolution (input, weight, bias;
// stride, padding, dilation, groups; transposed too) and average pooling
// (fixed windows; adaptive average pooling is area resampling, in
// resampling.cpp). Written through the windows an output reads
// (im2col's columns, here by Tensor::unfold so any number of dims works):
//   conv:  y[b, o, l] = Σ_j W[o, j] · cols[b, j, l] + bias[o]
// so   input:   v_cols[b, j, l] = ⊕_o g[b, o, l] ⊗ lift(W[o, j])   (semiring matmul)
//               v_x[b, c, p]    = ⊕ of v_cols over the (j, l) whose column entry is pixel p
//                                 (col2im with ⊕: fold_windows)
//      weight:  v_W[o, j]       = ⊕_{b,l} g[b, o, l] ⊗ lift(cols[b, j, l])   (semiring matmul)
//      bias:    v_b[o]          = ⊕_{b,l} g[b, o, l]
// A transposed convolution is the same with the roles of input and output
// swapped: each input element reads a window of the output's values. Zero
// weights and padded zeros lift to the semiring zero: no edge.
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

// Window geometry over the S = 1…3 spatial dims.
struct Windows {
  std::vector<int64_t> kernel, stride, padding, dilation, out;  // out: windows per dim (the op's output)
  int64_t dims() const { return (int64_t)kernel.size(); }
  int64_t span(int64_t d) const { return (kernel[d] - 1) * dilation[d] + 1; }
  int64_t K() const { return c10::multiply_integers(kernel); }
  int64_t L() const { return c10::multiply_integers(out); }
};

Windows windows(std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding,
                std::vector<int64_t> dilation, at::IntArrayRef out) {
  const size_t S = kernel.size();
  if (stride.empty()) stride = kernel;  // pooling's default
  if (padding.size() == 1) padding.resize(S, padding[0]);
  if (dilation.empty()) dilation.assign(S, 1);
  return {std::move(kernel), std::move(stride), std::move(padding), std::move(dilation), out.vec()};
}

// The windows of t, whose spatial dims start at `first` and are already
// padded: (…, K, L), kernel offsets before windows (im2col's order).
Tensor windows_of(Tensor t, int64_t first, const Windows& w) {
  const int64_t S = w.dims();
  for (int64_t d = 0; d < S; ++d) t = t.unfold(first + d, w.span(d), w.stride[d]).narrow(first + d, 0, w.out[d]);
  for (int64_t d = 0; d < S; ++d) t = t.slice(first + S + d, 0, INT64_MAX, w.dilation[d]);
  std::vector<int64_t> order, sizes(t.sizes().begin(), t.sizes().begin() + first);
  for (int64_t d = 0; d < first; ++d) order.push_back(d);
  for (int64_t d = 0; d < S; ++d) order.push_back(first + S + d);
  for (int64_t d = 0; d < S; ++d) order.push_back(first + d);
  sizes.push_back(w.K());
  sizes.push_back(w.L());
  return t.permute(order).reshape(sizes);
}

// Every window of a plain tensor x (B, channels, *spatial), zero padded: (B, channels, K, L).
Tensor windows_of_input(const Tensor& x, const Windows& w) {
  std::vector<int64_t> pad;  // constant_pad_nd: last dim first
  for (int64_t d = w.dims() - 1; d >= 0; --d) pad.insert(pad.end(), {w.padding[d], w.padding[d]});
  return windows_of(at::constant_pad_nd(x, pad), 2, w);
}

// An image of semiring zeros (C, B, channels, *extent) with v (C, B, channels, *sizes) at `offset`.
Tensor zero_padded(const Semiring& sr, const Tensor& v, const std::vector<int64_t>& offset,
                   const std::vector<int64_t>& extent) {
  std::vector<int64_t> shape{v.size(1), v.size(2)};
  shape.insert(shape.end(), extent.begin(), extent.end());
  auto image = sr.zero(shape, v.options());
  auto inside = image;
  for (size_t d = 0; d < offset.size(); ++d) inside = inside.narrow(3 + d, offset[d], v.size(3 + d));
  inside.copy_(v);
  return image;
}

// col2im with ⊕: window values v (C, B, channels, K, L) go back to the pixels
// they read, (C, B, channels, *spatial); K may be 1 when every entry of a
// window carries the same value (average pooling). One ⊕ per kernel offset:
// for a fixed offset the windows read distinct pixels, a strided slice of the
// padded image. Entries that read padding are dropped; pixels no window reads
// stay zero.
Tensor fold_windows(const Semiring& sr, const Tensor& v, const Windows& w, at::IntArrayRef spatial) {
  const int64_t S = w.dims(), C = v.size(0), B = v.size(1), channels = v.size(2);
  std::vector<int64_t> shape{B, channels};
  for (int64_t d = 0; d < S; ++d)  // ceil_mode windows may overhang the padded input
    shape.push_back(std::max(spatial[d] + 2 * w.padding[d], (w.out[d] - 1) * w.stride[d] + w.span(d)));
  auto image = sr.zero(shape, v.options());
  std::vector<int64_t> entries_shape{C, B, channels, v.size(3)};
  entries_shape.insert(entries_shape.end(), w.out.begin(), w.out.end());
  auto entries = v.reshape(entries_shape);
  for (int64_t k = 0; k < w.K(); ++k) {
    auto slice = image;
    int64_t rest = k;  // k = row-major kernel offset
    for (int64_t d = S - 1; d >= 0; --d) {
      const int64_t at = (rest % w.kernel[d]) * w.dilation[d];
      rest /= w.kernel[d];
      slice = slice.slice(3 + d, at, at + (w.out[d] - 1) * w.stride[d] + 1, w.stride[d]);
    }
    slice.copy_(sr.oplus(slice, entries.select(3, v.size(3) == 1 ? 0 : k)));
  }
  for (int64_t d = 0; d < S; ++d) image = image.narrow(3 + d, w.padding[d], spatial[d]);
  return image;
}

std::vector<int64_t> value_shape(int64_t C, at::IntArrayRef shape) {
  std::vector<int64_t> out{C};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

std::vector<Tensor> convolution_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ConvolutionBackward0&>(ctx.node);
  const auto& sr = ctx.semiring;
  auto weight = ctx.unpack(n.weight_);
  const int64_t S = weight.dim() - 2;
  const Tensor& g = grads[0];  // (C, B, Cout, *out): F.conv* batch an unbatched input before the op
  const int64_t C = g.size(0), B = g.size(1), Cout = g.size(2), G = n.groups.expect_int();
  const auto kernel = weight.sizes().slice(2).vec();
  const int64_t CoutG = Cout / G, K = c10::multiply_integers(kernel);
  const auto out_size = g.sizes().slice(3);
  const int64_t L = c10::multiply_integers(out_size);
  auto gl = g.reshape({C, B, G, CoutG, L});
  std::vector<Tensor> out(3);
  if (!n.transposed) {
    // y[b, o, l] = Σ_j W[o, j] · windows[b, j, l]; W: (Cout, Cin/G, *kernel)
    const int64_t CinG = weight.size(1);
    auto win = windows(kernel, ints(n.stride), ints(n.padding), ints(n.dilation), out_size);
    if (ctx.needs(0)) {
      const auto in_shape = ctx.input_shape(0);
      // (C, B, G, L, CinG·K): ⊕ over each group's output channels, then back to pixels
      auto cols = sr.matmul(gl.permute({0, 1, 2, 4, 3}),
                            weight.reshape({G, CoutG, CinG * K}).unsqueeze(0).expand({B, G, CoutG, CinG * K}));
      cols = cols.reshape({C, B, G, L, CinG, K}).permute({0, 1, 2, 4, 5, 3}).reshape({C, B, G * CinG, K, L});
      out[0] = fold_windows(sr, cols, win, at::IntArrayRef(in_shape).slice(2)).reshape(value_shape(C, in_shape));
    }
    if (ctx.needs(1)) {
      auto cols = windows_of_input(ctx.unpack(n.input_), win).reshape({B, G, CinG * K, L});
      // (C, G, CoutG, CinG·K): ⊕ over batch and positions
      auto v = sr.matmul(gl.permute({0, 2, 3, 1, 4}).reshape({C, G, CoutG, B * L}),
                         cols.permute({1, 0, 3, 2}).reshape({G, B * L, CinG * K}));
      out[1] = v.reshape(value_shape(C, weight.sizes()));
    }
  } else {
    // Transposed: y[b, o, (i·s − p + k·d)] += x[b, c, i] · W[c, o, k]; W: (Cin, Cout/G, *kernel).
    // Input i reads the values of its outputs through a window over the
    // output padded by p (semiring zeros): a convolution's geometry with the
    // input's size as the window count.
    const int64_t CinG = weight.size(0) / G;
    const auto in_shape = ctx.needs(0) ? ctx.input_shape(0) : ctx.unpack(n.input_).sizes().vec();
    const auto in_size = at::IntArrayRef(in_shape).slice(2);
    const int64_t Li = c10::multiply_integers(in_size);
    auto win = windows(kernel, ints(n.stride), std::vector<int64_t>(S, 0), ints(n.dilation), in_size);
    auto padding = ints(n.padding);
    if (padding.size() == 1) padding.resize(S, padding[0]);
    std::vector<int64_t> extent;
    for (int64_t d = 0; d < S; ++d)
      extent.push_back(std::max((in_size[d] - 1) * win.stride[d] + win.span(d), padding[d] + out_size[d]));
    // (C, B, G, CoutG·K, Li): what each input element's window of outputs holds
    auto cols = windows_of(zero_padded(sr, g, padding, extent), 3, win).reshape({C, B, G, CoutG * K, Li});
    auto w = weight.reshape({G, CinG, CoutG * K});
    if (ctx.needs(0)) {
      auto v = sr.matmul(cols.permute({0, 1, 2, 4, 3}), w.transpose(1, 2).unsqueeze(0).expand({B, G, CoutG * K, CinG}));
      out[0] = v.permute({0, 1, 2, 4, 3}).reshape(value_shape(C, in_shape));  // (C, B, G, CinG, Li)
    }
    if (ctx.needs(1)) {
      auto x = ctx.unpack(n.input_).reshape({B, G, CinG, Li});
      auto v = sr.matmul(cols.permute({0, 2, 3, 1, 4}).reshape({C, G, CoutG * K, B * Li}),
                         x.permute({1, 0, 3, 2}).reshape({G, B * Li, CinG}));  // (C, G, CoutG·K, CinG)
      out[1] = v.reshape({C, G, CoutG, K, CinG}).permute({0, 1, 4, 2, 3}).reshape(value_shape(C, weight.sizes()));
    }
  }
  if (ctx.needs(2)) out[2] = sr.oplus_reduce(gl.permute({0, 2, 3, 1, 4}).reshape({C, Cout, B * L}), {1}, false);
  return out;
}

// avg_pool2d / avg_pool3d: each output o averages its window with weight
// 1/divisor(o) per input element. The weight is read off the op itself on
// ones: average / sum of the real (non-padding) elements of the window.
template <class PoolNode, int S>
std::vector<Tensor> avg_pool_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<PoolNode&>(ctx.node);
  if (!ctx.needs(0)) return {};
  const auto& sr = ctx.semiring;
  const auto in_shape = ctx.input_shape(0);
  const auto spatial = at::IntArrayRef(in_shape).slice(in_shape.size() - S);
  const Tensor& g = grads[0];
  const auto out_size = g.sizes().slice(g.dim() - S);
  const int64_t C = g.size(0), L = c10::multiply_integers(out_size), planes = g[0].numel() / L;
  auto win = windows(n.kernel_size, n.stride, n.padding, {}, out_size);
  std::vector<int64_t> one_plane{1, 1};
  one_plane.insert(one_plane.end(), spatial.begin(), spatial.end());
  auto ones = at::ones(one_plane, g.options().dtype(at::kDouble));
  auto pool = [&](bool count_include_pad, std::optional<int64_t> divisor) {
    return S == 2 ? at::avg_pool2d(ones, n.kernel_size, win.stride, n.padding, n.ceil_mode, count_include_pad, divisor)
                  : at::avg_pool3d(ones, n.kernel_size, win.stride, n.padding, n.ceil_mode, count_include_pad, divisor);
  };
  auto weight = (pool(n.count_include_pad, n.divisor_override) / pool(true, 1)).to(g.scalar_type()).view({1, L});
  auto gw = sr.otimes_edge(g.reshape({C, 1, planes, 1, L}), weight);
  return {fold_windows(sr, gw, win, spatial).reshape(value_shape(C, in_shape))};
}

}  // namespace

void register_convolution_rules() {
  register_rule("ConvolutionBackward0", convolution_rule, "convolution");
  register_rule("AvgPool2DBackward0", avg_pool_rule<AvgPool2DBackward0, 2>, "convolution");
  register_rule("AvgPool3DBackward0", avg_pool_rule<AvgPool3DBackward0, 3>, "convolution");
}

}  // namespace torch_semiring
