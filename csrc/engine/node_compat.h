// What differs between torch releases in the autograd nodes this code holds,
// so that the extension compiles against 2.11 and 2.12 (the torch of the
// project's GPU machine) as against 2.13 on (CI: 2.13.0 and the newest):
//   - the owning pointer: c10::intrusive_ptr<Node> from 2.13, std::shared_ptr<Node>
//     before — NodePtr is the type of Edge::function;
//   - Node::forward_op_name(), from 2.13 (error messages only).
// Each helper is a template, so that a release compiles only its own branch.
#pragma once
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace torch_semiring {

using NodePtr = decltype(torch::autograd::Edge::function);
inline constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>;

// An owning pointer to a node that its graph keeps alive (a node this code
// was handed by reference or raw pointer); null for null.
template <class N>
NodePtr hold_node(N* n) {
  using P = std::conditional_t<std::is_void_v<N>, N, NodePtr>;  // NodePtr, named dependently
  if (!n) return NodePtr();
  if constexpr (kSharedNodes) return n->getptr();
  else return P::unsafe_reclaim_from_nonowning(n);
}

// The name of the forward op that made a node, where the torch records it.
template <class N, class = void>
struct HasForwardOpName : std::false_type {};
template <class N>
struct HasForwardOpName<N, std::void_t<decltype(std::declval<const N&>().forward_op_name())>> : std::true_type {};
template <class N>
std::string forward_op_of(const N& n) {
  if constexpr (HasForwardOpName<N>::value) return std::string(n.forward_op_name());
  else return "not recorded by this torch release";
}

// A new node of type T, owned as the torch owns nodes.
template <class T>
auto make_node() {
  if constexpr (kSharedNodes) return std::make_shared<T>();
  else return c10::make_intrusive<T>();
}

}  // namespace torch_semiring
