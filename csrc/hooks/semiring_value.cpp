#include "semiring_value.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace torch_semiring {

namespace {

// The wrapper's keys: CPU (its device) plus a functionality key that ranks
// above autograd and every backend, that stock torch registers no kernel or
// fallback for, and that composite kernels do not map to — so every operator
// called on a wrapper reaches the error fallback below first. (A backend key
// such as PrivateUse3, or CustomRNGKeyId, would not do: composite kernels
// outrank a backend fallback and run into the missing storage instead.) The
// key is named for C++ dispatcher tests; nothing in a torch process uses it.
constexpr auto kValueKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;
const c10::DispatchKeySet kValueKeys = c10::DispatchKeySet(c10::DispatchKey::CPU) | c10::DispatchKeySet(kValueKey);

class SemiringValueImpl final : public c10::TensorImpl {
 public:
  SemiringValueImpl(at::Tensor value, const Semiring& semiring, at::ScalarType dtype)
      : TensorImpl(kValueKeys, caffe2::TypeMeta::fromScalarType(dtype), value.device()),
        value_(std::move(value)),
        semiring_(semiring) {
    set_storage_access_should_throw();
    set_sizes_contiguous(value_.sizes().slice(1));
  }
  const at::Tensor& value() const { return value_; }
  const Semiring& semiring() const { return semiring_; }

 private:
  const char* tensorimpl_type_name() const override { return "torch_semiring::SemiringValueImpl"; }
  at::Tensor value_;
  const Semiring& semiring_;
};

SemiringValueImpl* impl_of(const at::Tensor& t) {
  return t.defined() ? dynamic_cast<SemiringValueImpl*>(t.unsafeGetTensorImpl()) : nullptr;
}

void refuse_stock_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string semiring = "a semiring";
  for (const auto& arg : *stack)
    if (arg.isTensor())
      if (auto* impl = impl_of(arg.toTensor())) semiring = "semiring '" + impl->semiring().name() + "'";
  TORCH_CHECK(false, "torch_semiring: ", op.schema().operator_name(), " was called on a value of ", semiring,
              " inside the autograd engine. Semiring values are only combined at the engine's hook points "
              "(input buffers, broadcast reduction, .grad accumulation, node rules); this one reached code "
              "that is not semiring-aware — a tensor hook (register_hook, retain_grad), a Python "
              "autograd.Function or a C++ custom function, which the LD_PRELOAD harness cannot intercept. "
              "Remove the hook, or run this model with torch_semiring.grad / ts.semiring() without the "
              "preload (the out-of-tree engine supports retain_grad and Python rules).");
}

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericWrapper, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_stock_op>()); }

}  // namespace

at::Tensor wrap_value(at::Tensor value, const Semiring& semiring, at::ScalarType dtype) {
  TORCH_INTERNAL_ASSERT(value.defined() && value.dim() >= 1 && value.size(0) == semiring.components());
  const auto carried = semiring.value_dtype(dtype);  // bf16/fp16 tensors: float32 values outside real
  if (value.scalar_type() != carried) value = value.to(carried);
  return at::Tensor(c10::make_intrusive<SemiringValueImpl>(std::move(value), semiring, dtype));
}

bool is_wrapped_value(const at::Tensor& t) { return impl_of(t) != nullptr; }

const at::Tensor& unwrap_value(const at::Tensor& t) {
  auto* impl = impl_of(t);
  TORCH_INTERNAL_ASSERT(impl, "torch_semiring: unwrap_value of a plain tensor");
  return impl->value();
}

}  // namespace torch_semiring
