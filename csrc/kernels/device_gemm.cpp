// The device glue of the semiring matrix products (see device_gemm.h): shapes
// and strides for the C API, the range checks, the weight lift and workspace,
// the backend chosen by the tensors' device.
#include "kernels/device_gemm.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/cpu_gemm.h"
#include "kernels/cuda/api.h"
#include "kernels/cuda/host_launcher.h"

namespace torch_semiring {
namespace kernels {
namespace device {
namespace {

using at::Tensor;
namespace impl = cuda_kernels::impl;

std::atomic<int64_t> device_calls{0}, device_elementwise_calls{0};

#ifdef TS_WITH_CUDA_KERNELS
constexpr bool kHaveCudaKernels = true;
}  // namespace
}  // namespace device
}  // namespace kernels
}  // namespace torch_semiring
// torch's cuBLAS handle for the current device and stream (libtorch_cuda,
// ATen/cuda/CUDAContext.h), declared here with an opaque return type so that
// this file needs no CUDA header (C++ names do not encode the return type).
namespace at {
namespace cuda {
void* getCurrentCUDABlasHandle();
}  // namespace cuda
}  // namespace at
namespace torch_semiring {
namespace kernels {
namespace device {
namespace {
#else
constexpr bool kHaveCudaKernels = false;
#endif

bool emulating() {
  const char* backend = std::getenv("TORCH_SEMIRING_KERNEL_BACKEND");
  return backend && std::strcmp(backend, "emulate") == 0;
}

// One product's calls into the C API: the CUDA kernels on the tensors' current
// stream, or the host emulation of the same kernels.
struct Backend {
  bool cuda;
  void* stream = nullptr;

  explicit Backend(const Tensor& t) : cuda(t.device().is_cuda()) {
    if (cuda)  // a cudaStream_t, read without CUDA headers
      stream = reinterpret_cast<void*>(
          c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).native_handle());
  }
  int max_gemm(int op, int64_t batch, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_c, int64_t a_b,
               int64_t a_m, int64_t a_k, const float* b, int64_t b_b, float* c, int64_t c_c, int32_t* idx) const {
    const int64_t c_b = M * N, c_m = N, i_b = M * N, i_m = N, b_k = N, b_n = 1;
#ifdef TS_WITH_CUDA_KERNELS
    if (cuda)
      return ts_max_gemm(op, TS_DTYPE_F32, batch, M, N, K, a, a_c, a_b, a_m, a_k, b, b_b, b_k, b_n, c, c_c, c_b, c_m,
                         idx, i_b, i_m, stream);
#endif
    cuda_kernels::HostLauncher L(nullptr, nullptr);
    return impl::max_gemm(L, op, TS_DTYPE_F32, batch, M, N, K, a, a_c, a_b, a_m, a_k, b, b_b, b_k, b_n, c, c_c, c_b,
                          c_m, idx, i_b, i_m);
  }
  int lift(int mode, int w_dtype, int64_t batch, int64_t K, int64_t N, const void* w, int64_t w_b, int64_t w_k,
           int64_t w_n, float* out) const {
#ifdef TS_WITH_CUDA_KERNELS
    if (cuda) return ts_lift_weights(mode, w_dtype, batch, K, N, w, w_b, w_k, w_n, out, stream);
#endif
    cuda_kernels::HostLauncher L(nullptr, nullptr);
    return impl::lift_weights(L, mode, w_dtype, batch, K, N, w, w_b, w_k, w_n, out);
  }
  int fused(int op, bool pair, int64_t C, int dtype, int ndim, const int64_t* size, const void* a, int64_t a_c,
            const int64_t* a_s, const void* b, int64_t b_c, const int64_t* b_s, void* out) const {
#ifdef TS_WITH_CUDA_KERNELS
    if (cuda) return ts_fused(op, pair, C, dtype, ndim, size, a, a_c, a_s, b, b_c, b_s, out, stream);
#endif
    cuda_kernels::HostLauncher L(nullptr, nullptr);
    return impl::fused(L, op, pair, C, dtype, ndim, size, a, a_c, a_s, b, b_c, b_s, out);
  }
  int exp_shift(bool entropy, int64_t batch, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_b,
                int64_t a_m, int64_t a_k, const float* ha, int w_dtype, const void* w, int64_t w_b, int64_t w_k,
                int64_t w_n, float* l, float* h, void* ws, size_t ws_bytes, int64_t* n_exact) const {
#if defined(TS_WITH_CUDA_KERNELS) && defined(TS_CUDA_HAVE_CUBLAS)
    if (cuda)
      return ts_exp_shift_matmul(entropy, batch, M, N, K, a, a_b, a_m, a_k, ha, a_b, a_m, a_k, w_dtype, w, w_b, w_k,
                                 w_n, l, h, ws, ws_bytes, n_exact, at::cuda::getCurrentCUDABlasHandle(), stream);
#endif
    cuda_kernels::HostLauncher L(nullptr, nullptr);
    return impl::exp_shift_matmul(L, entropy, batch, M, N, K, a, a_b, a_m, a_k, ha, a_b, a_m, a_k, w_dtype, w, w_b,
                                  w_k, w_n, l, h, ws, ws_bytes, n_exact);
  }
};

void check(int rc, const char* what) {
  TORCH_CHECK(rc == 0, "torch_semiring: the device kernel ", what, " failed (code ", rc, ": ",
              rc == TS_CUDA_ETOOLARGE ? "a grid past CUDA's limits" : rc == TS_CUDA_ECUBLAS ? "cuBLAS" :
              rc == TS_CUDA_EWORKSPACE ? "workspace too small" : rc == TS_CUDA_EBADARG ? "a bad argument" :
              "a CUDA launch error", ")");
}

// The operands flattened to one batch dim: g (C, B, M, K) (its own strides),
// w (K, N) shared by every batch (w_b = 0) or (B, K, N).
struct Flat {
  Tensor g, w;
  int64_t C = 0, B = 1, M = 0, K = 0, N = 0, w_b = 0, w_k = 0, w_n = 0;
  std::vector<int64_t> out_shape;
};

bool flatten(const Tensor& g, const Tensor& w, Flat& f) {
  BatchedOperands ops;
  if (!broadcast_operands(g, w, ops)) return false;
  for (auto s : ops.out_shape)
    if (s == 0) return false;  // empty products: the generic path knows the zero
  f.C = g.size(0), f.M = ops.g.size(-2), f.K = ops.g.size(-1), f.N = ops.w.size(-1);
  if (f.K == 0) return false;
  for (int64_t d = 1; d + 2 < ops.g.dim(); ++d) f.B *= ops.g.size(d);
  f.g = ops.g.reshape({f.C, f.B, f.M, f.K});
  if (w.dim() == 2) {
    f.w = w;
    f.w_b = 0, f.w_k = w.stride(0), f.w_n = w.stride(1);
  } else {
    f.w = ops.w.reshape({f.B, f.K, f.N});
    f.w_b = f.w.stride(0), f.w_k = f.w.stride(1), f.w_n = f.w.stride(2);
  }
  f.out_shape = ops.out_shape;
  return true;
}

int w_dtype(const Tensor& w) { return w.scalar_type() == at::kBFloat16 ? TS_DTYPE_BF16 : TS_DTYPE_F32; }

// true: some check failed (one host read for all of them).
bool any_of(std::initializer_list<Tensor> flags) {
  std::vector<Tensor> each;
  for (const auto& f : flags) each.push_back(f.any());
  return at::stack(each).any().item<bool>();
}

// (min, max) of each tensor, in one host read: a kernel per tensor (aminmax,
// which propagates NaN) instead of a chain of element-wise tests and
// reductions per condition — on a GPU each is a launch, at every product.
std::vector<double> ranges(std::initializer_list<Tensor> tensors) {
  std::vector<Tensor> each;
  for (const auto& t : tensors) {
    auto [lo, hi] = at::aminmax(t);
    each.push_back(lo.to(at::kFloat)), each.push_back(hi.to(at::kFloat));
  }
  auto host = at::stack(each).to(at::kCPU, at::kDouble);
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

// Comparisons with NaN are false, so a NaN bound fails every test below.
bool below_inf(double hi) { return hi < std::numeric_limits<double>::infinity(); }
bool finite_range(double lo, double hi) { return lo > -std::numeric_limits<double>::infinity() && below_inf(hi); }

// out (C, B, M, N) = the max-semiring product `op` of f.g with the weights
// lifted by `lift_mode` (0 log|w|, 1 |w|, 2 w with zeros marked), argmax into
// idx (B, M, N) when given.
Tensor run_max_gemm(const Tensor& g, const Flat& f, int op, int lift_mode, int64_t C, int32_t* idx) {
  const Backend backend(g);
  auto lifted = at::empty({f.w_b == 0 ? 1 : f.B, f.K, f.N}, g.options());
  check(backend.lift(lift_mode, w_dtype(f.w), lifted.size(0), f.K, f.N, f.w.data_ptr(), f.w_b, f.w_k, f.w_n,
                     lifted.data_ptr<float>()),
        "ts_lift_weights");
  auto out = at::empty({C, f.B, f.M, f.N}, g.options());
  check(backend.max_gemm(op, f.B, f.M, f.N, f.K, f.g.data_ptr<float>(), f.g.stride(0), f.g.stride(1), f.g.stride(2),
                         f.g.stride(3), lifted.data_ptr<float>(), f.w_b == 0 ? 0 : f.K * f.N, out.data_ptr<float>(),
                         f.B * f.M * f.N, idx),
        "ts_max_gemm");
  ++device_calls;
  return out.view(f.out_shape);
}

}  // namespace

bool routes(const Tensor& g, const Tensor& w) {
  const bool on_device = g.device().is_cuda() && w.device() == g.device() && kHaveCudaKernels;
  const bool emulated = g.device().is_cpu() && w.device().is_cpu() && emulating();
  return (on_device || emulated) && g.scalar_type() == at::kFloat &&
         (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) &&
         !(at::GradMode::is_enabled() && (g.requires_grad() || w.requires_grad()));
}

Tensor max_matmul(bool times, const Tensor& g, const Tensor& w, Tensor* argmax) {
  Flat f;
  if (!routes(g, w) || g.size(0) != 1 || !flatten(g, w, f)) return {};
  // As the CPU kernel: no NaN or +∞ in g (max_abs: g ≥ 0), finite weights.
  const auto r = ranges({f.g, f.w});
  if (!below_inf(r[1]) || (times && !(r[0] >= 0)) || !finite_range(r[2], r[3])) return {};
  Tensor idx = argmax ? at::empty({f.B, f.M, f.N}, g.options().dtype(at::kInt)) : Tensor();
  auto out = run_max_gemm(g, f, times ? TS_OP_MAX_TIMES : TS_OP_MAX_PLUS, times ? 1 : 0, 1,
                          argmax ? idx.data_ptr<int32_t>() : nullptr);
  if (argmax) *argmax = idx.view(std::vector<int64_t>(f.out_shape.begin() + 1, f.out_shape.end()));
  return out;
}

Tensor kmax_matmul(const Tensor& g, const Tensor& w, int64_t k) {
  if (k == 1) return max_matmul(false, g, w);
  Flat f;
  if (k < 2 || k > 8 || !routes(g, w) || g.size(0) != k || !flatten(g, w, f)) return {};
  // As the CPU kernel: no NaN or +∞ among the scores, finite weights.
  const auto r = ranges({f.g, f.w});
  if (!below_inf(r[1]) || !finite_range(r[2], r[3])) return {};
  return run_max_gemm(g, f, int(TS_OP_KMAX + k), 0, k, nullptr);
}

Tensor max_prod_matmul(const Tensor& g, const Tensor& w) {
  Flat f;
  if (!routes(g, w) || g.size(0) != 2 || !flatten(g, w, f)) return {};
  const double inf = std::numeric_limits<double>::infinity();
  auto M = f.g.select(0, 0), m = f.g.select(0, 1);
  // As the CPU kernel: (M, m) finite with M ≥ m, or the empty value (−∞, +∞); finite weights.
  const auto empty = (M == -inf).logical_and(m == inf);
  if (any_of({at::isfinite(M).logical_or(empty).logical_not(), at::isfinite(m).logical_or(empty).logical_not(),
              (M < m).logical_and(empty.logical_not()), at::isfinite(f.w).logical_not()}))
    return {};
  return run_max_gemm(g, f, TS_OP_MAX_PROD, 2, 2, nullptr);
}

Tensor exp_shift_matmul(bool entropy, const Tensor& g, const Tensor& w) {
  Flat f;
  if (!routes(g, w) || g.size(0) != (entropy ? 2 : 1) || !flatten(g, w, f)) return {};
#if defined(TS_WITH_CUDA_KERNELS) && !defined(TS_CUDA_HAVE_CUBLAS)
  // A CUDA build without cuBLAS's header (setup.py found no cublas_v2.h): no
  // ts_exp_shift_matmul to call, so CUDA tensors take the generic path.
  if (g.device().is_cuda()) return {};
#endif
  // ℓ: finite or −∞ (no path); h finite; finite weights.
  const auto r = entropy ? ranges({f.g.select(0, 0), f.w, f.g.select(0, 1)}) : ranges({f.g.select(0, 0), f.w});
  if (!below_inf(r[1]) || !finite_range(r[2], r[3]) || (entropy && !finite_range(r[4], r[5]))) return {};
  // The kernels read ℓ and h with the same strides: one contiguous block each.
  auto a = f.g.contiguous();
  const Backend backend(g);
  const size_t bytes = cuda_kernels::impl::exp_shift_workspace_bytes(entropy, f.B, f.M, f.N, f.K);
  auto workspace = at::empty({int64_t(bytes)}, g.options().dtype(at::kByte));
  auto out = at::empty({entropy ? 2 : 1, f.B, f.M, f.N}, g.options());
  int64_t n_exact = 0;
  const float* ha = entropy ? a.data_ptr<float>() + f.B * f.M * f.K : nullptr;
  check(backend.exp_shift(entropy, f.B, f.M, f.N, f.K, a.data_ptr<float>(), f.M * f.K, f.K, 1, ha, w_dtype(f.w),
                          f.w.data_ptr(), f.w_b, f.w_k, f.w_n, out.data_ptr<float>(),
                          entropy ? out.data_ptr<float>() + f.B * f.M * f.N : nullptr, workspace.data_ptr(), bytes,
                          &n_exact),
        "ts_exp_shift_matmul");
  ++device_calls;
  return out.view(f.out_shape);
}

bool routes_elementwise(const Tensor& a) {
  return (a.device().is_cuda() && kHaveCudaKernels) ||
         (a.device().is_cpu() && a.scalar_type() == at::kFloat && emulating());
}

Tensor fused_elementwise(Fused op, const std::vector<Tensor>& values, const Tensor& w) {
  const Tensor& a = values[0];
  const bool pair = values.size() == 2;
  const Tensor& b = pair ? values[1] : w;
  const auto dtype = a.scalar_type();
  if (!routes_elementwise(a)) return {};
  if (!b.defined() || b.device() != a.device() || b.scalar_type() != dtype ||
      (dtype != at::kFloat && dtype != at::kDouble) || a.dim() < 1 || (pair && (b.dim() < 1 || b.size(0) != a.size(0))) ||
      (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())))
    return {};
  const int64_t C = a.size(0);
  const auto S = at::infer_size(a.sizes().slice(1), pair ? b.sizes().slice(1) : b.sizes());
  std::vector<int64_t> full{C};
  full.insert(full.end(), S.begin(), S.end());
  const Tensor ae = a.expand(full), be = pair ? b.expand(full) : b.expand(S);
  const int64_t b0 = pair ? 1 : 0;  // where b's element dims start
  // S's dims with size > 1, adjacent ones merged where both operands step
  // through them as one (the output, contiguous, always does).
  std::vector<int64_t> size, a_s, b_s;
  for (size_t d = 0; d < S.size(); ++d) {
    if (S[d] == 1) continue;
    const int64_t sa = ae.stride(1 + d), sb = be.stride(b0 + d);
    if (!size.empty() && a_s.back() == sa * S[d] && b_s.back() == sb * S[d]) {
      size.back() *= S[d], a_s.back() = sa, b_s.back() = sb;
    } else {
      size.push_back(S[d]), a_s.push_back(sa), b_s.push_back(sb);
    }
  }
  if (size.size() > size_t(cuda_kernels::kFusedMaxDims)) return {};
  auto out = at::empty(full, a.options());
  const Backend backend(a);
  const int rc = backend.fused(int(op), pair, C, dtype == at::kFloat ? TS_DTYPE_F32 : TS_DTYPE_F64, int(size.size()),
                               size.data(), ae.data_ptr(), ae.stride(0), a_s.data(), be.data_ptr(),
                               pair ? be.stride(0) : 0, b_s.data(), out.data_ptr());
  if (rc == TS_CUDA_EBADARG) return {};  // no such op (e.g. kmax beyond k = 8): the generic path
  check(rc, "ts_fused");
  ++device_elementwise_calls;
  return out;
}

int64_t calls() { return device_calls.load(); }
int64_t elementwise_calls() { return device_elementwise_calls.load(); }

}  // namespace device
}  // namespace kernels
}  // namespace torch_semiring
