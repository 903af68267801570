// The Python face of the C++ library: semirings (built-in and Python-defined),
// the engine entry point, and rule registration. Thin on purpose; the API
// lives in python/torch_semiring.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_anomaly_mode.h>
#include <torch/extension.h>

#include <cstring>
#include <optional>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <algorithm>

#include "../engine/engine.h"
#include "../engine/node_hooks.h"
#include "../engine/process_heap.h"
#include "../hooks/engine_hooks.h"
#include "../hooks/series_hooks.h"
#include "../kernels/attention_blocks.h"
#include "../kernels/cpu_gemm.h"
#include "../kernels/device_gemm.h"
#include "../kernels/lift_cache.h"
#include "../kernels/norm_rows.h"
#include "../paths/path_recorder.h"
#include "../rules/attention.h"
#include "../rules/normalization.h"
#include "../rules/rule.h"
#include "../rules/summed_within_nodes.h"
#include "../semiring/semiring.h"

namespace py = pybind11;
using namespace torch_semiring;
using torch::autograd::Edge;
using torch::autograd::Node;

namespace {

// A semiring written in Python: a small object with the interface's methods,
// written with torch ops. Slower (a Python call per operation), for experiments.
class PySemiring final : public Semiring {
 public:
  explicit PySemiring(py::object obj) : obj_(std::move(obj)) {
    for (const char* m : {"zero", "one", "lift", "otimes", "oplus", "oplus_reduce", "readout"})
      TORCH_CHECK_TYPE(py::hasattr(obj_, m), "torch_semiring: a Python semiring needs a method '", m,
                       "' (see README 'Defining a semiring in Python')");
    name_ = py::str(py::getattr(obj_, "name", py::str(py::type::of(obj_).attr("__name__"))));
    components_ = py::getattr(obj_, "components", py::int_(1)).cast<int64_t>();
    zero_is_zero_ = py::getattr(obj_, "zero_is_numeric_zero", py::bool_(false)).cast<bool>();
  }
  std::string name() const override { return name_; }
  int64_t components() const override { return components_; }
  bool zero_is_numeric_zero() const override { return zero_is_zero_; }
  Tensor readout(const Tensor& v) const override { return call("readout", v); }
  const py::object& object() const { return obj_; }

 protected:
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    py::gil_scoped_acquire gil;  // the arguments are Python objects too
    return call("zero", py::tuple(py::cast(s.vec())), at::empty({0}, o));
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    py::gil_scoped_acquire gil;
    return call("one", py::tuple(py::cast(s.vec())), at::empty({0}, o));
  }
  Tensor do_lift(const Tensor& w) const override { return call("lift", w); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return call("otimes", a, b); }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(obj_, "otimes_edge")) return call("otimes_edge", a, w);
    return do_otimes(a, do_lift(w));
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return call("oplus", a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    py::gil_scoped_acquire gil;
    return call("oplus_reduce", a, py::tuple(py::cast(dims.vec())), keepdim);
  }

 private:
  template <class... A>
  Tensor call(const char* method, A&&... args) const {
    // The stock engine (the LD_PRELOAD route) runs rules without the GIL.
    py::gil_scoped_acquire gil;
    py::object r = obj_.attr(method)(std::forward<A>(args)...);
    TORCH_CHECK_TYPE(THPVariable_Check(r.ptr()), "torch_semiring: ", name_, ".", method,
                     " must return a Tensor, got ", std::string(py::str(py::type::of(r))));
    return THPVariable_Unpack(r.ptr());
  }
  py::object obj_;
  std::string name_;
  int64_t components_;
  bool zero_is_zero_;
};

// The node of a Python autograd.Function's grad_fn (a template: each torch
// release compiles only its own branch).
template <class Fn>
NodePtr python_function_node(Fn* fn) {
  if constexpr (kSharedNodes) return hold_node(fn->cdata.lock().get());  // torch < 2.13: a weak_ptr<PyNode>
  else return fn->cdata;
}

NodePtr node_from_py(py::handle h) {
  if (h.is_none()) return {};
  if (torch::autograd::THPCppFunction_Check(h.ptr())) return ((torch::autograd::THPCppFunction*)h.ptr())->cdata;
  if (THPFunction_Check(h.ptr())) return python_function_node((THPFunction*)h.ptr());
  TORCH_CHECK_TYPE(false, "torch_semiring: expected an autograd node (a grad_fn), got ",
                   std::string(py::str(py::type::of(h))));
}

py::object node_to_py(const NodePtr& n) {
  return py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(n));
}

// Whether *p's dynamic type is the one with this mangled name. libtorch_python
// does not export the type_info of its hook and metadata classes, so
// dynamic_cast to them cannot link; the dynamic type's own name can be read.
template <class T>
bool is_exactly(const T* p, const char* mangled) {
  return p && std::strcmp(typeid(*p).name(), mangled) == 0;
}

// A handle on an autograd node for walking paths (paths.py), holding the node
// without giving it a Python object. torch's own wrapper (a grad_fn object)
// would: a node that has one is freed through Python's deallocator, which
// frees the next node the same way — recursively, so freeing a graph whose
// nodes were all wrapped (a 50 000-step chain, every node on the recorded
// path) overflows the stack. Unwrapped nodes are freed by torch iteratively.
struct NodeRef {
  NodePtr node;
};

std::vector<Edge> edges_from_py(const std::vector<std::pair<py::object, uint32_t>>& pairs) {
  std::vector<Edge> edges;
  for (const auto& [node, nr] : pairs) edges.emplace_back(node_from_py(node), nr);
  return edges;
}

// A rule written in Python: rule(node, grads, semiring, needed) -> list of
// values (None = zero), with `semiring` the Python handle of the semiring.
Rule python_rule(py::function fn) {
  return [fn](const RuleContext& ctx, const std::vector<at::Tensor>& grads) -> std::vector<at::Tensor> {
    py::gil_scoped_acquire gil;
    auto node = node_to_py(hold_node(&ctx.node));
    py::list pg;
    for (const auto& g : grads) pg.append(g.defined() ? py::cast(g) : py::none());
    py::object result = fn(node, pg, py::cast(&ctx.semiring, py::return_value_policy::reference),
                           py::cast(ctx.needed));
    std::vector<at::Tensor> out;
    for (auto item : result) out.push_back(item.is_none() ? at::Tensor() : item.cast<at::Tensor>());
    return out;
  };
}

// The rule of an autograd.Function declared pointwise (ts.register_pointwise):
// the checked diagonal rule, for nodes of exactly `forward_cls` — another
// Function class of the same name is refused rather than assumed pointwise.
Rule declared_pointwise_rule(py::object forward_cls) {
  return [forward_cls](const RuleContext& ctx, const std::vector<at::Tensor>& grads) -> std::vector<at::Tensor> {
    std::string mismatch;
    {
      py::gil_scoped_acquire gil;
      // (PyNode's type info is not exported by libtorch: no dynamic_cast; the
      // node's Python object says which Function class made it.)
      auto node = node_to_py(hold_node(&ctx.node));
      py::object actual = py::getattr(py::type::handle_of(node), "_forward_cls", py::none());
      if (!actual.is(forward_cls))
        mismatch = "torch_semiring: node " + ctx.node.name() + " belongs to " + py::repr(actual).cast<std::string>() +
                   ", but it was declared pointwise for " + py::repr(forward_cls).cast<std::string>() +
                   "; two autograd.Function classes share a name — rename one or register a rule by node name";
    }
    TORCH_CHECK_VALUE(mismatch.empty(), mismatch);
    return declared_diagonal_rule(ctx, grads);
  };
}

// Names whose rules hold Python callables: released at interpreter exit, while
// the GIL still exists (a static registry would destroy them too late).
std::vector<std::string>& python_rule_names() {
  static std::vector<std::string> names;
  return names;
}

// Per node name, the rules a Python registration replaced (a built-in or an
// earlier Python rule; an empty `rule`: there was none), so that
// unregistering one puts back what it replaced.
std::unordered_map<std::string, std::vector<RuleEntry>>& shadowed_rules() {
  static std::unordered_map<std::string, std::vector<RuleEntry>> shadowed;
  return shadowed;
}

// A Python callable the engine calls back (from any of its threads), kept for
// the process's life: leaked on purpose, it must not be destroyed after the
// interpreter (static).
py::function* held_callback(py::function fn) { return new py::function(std::move(fn)); }

// Calls `fn` with the GIL. A Python exception crosses the C++ engine as
// torch's python_error, which the engine's Python entry point restores: the
// caller sees the original exception.
template <class... Args>
void call_from_engine(const py::function& fn, const Args&... args) {
  py::gil_scoped_acquire gil;
  try {
    fn(args...);
  } catch (py::error_already_set& e) {
    e.restore();
    python_error err;
    err.persist();
    throw err;
  }
}

}  // namespace

// Tensor-subclass tensors a rule meets — a node's saved tensors (RuleContext::unpack) and its own backward's
// results (call_backward) — pass through this hook (rules/registry.cpp): torch_semiring.distributed sets it
// to gather a DTensor shard into the plain tensor of its global shape (a collective: every rank runs the
// same rules in the same order), so each rule computes on whole tensors. Unset: values pass unchanged.
// (Declared here rather than in rule.h, which every rule includes: the only caller is this binding.)
namespace torch_semiring {
void set_subclass_gatherer(std::function<at::Tensor(const at::Tensor&)> gather);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_semiring C++ core: semirings, rules and the semiring backward engine";
  register_builtin_rules();

  py::class_<Semiring, std::shared_ptr<Semiring>>(m, "Semiring")
      .def_property_readonly("name", &Semiring::name)
      .def_property_readonly("components", &Semiring::components)
      .def("value_like", [](const Semiring& s, const at::Tensor& t) { return t.to(s.value_dtype(t.scalar_type())); },
           "t in the dtype this semiring's values take for a tensor of t's dtype (Semiring::value_dtype)")
      .def("zero", [](const Semiring& s, std::vector<int64_t> shape, const at::Tensor& like) {
        return s.zero(shape, like.options());
      })
      .def("one", [](const Semiring& s, std::vector<int64_t> shape, const at::Tensor& like) {
        return s.one(shape, like.options());
      })
      .def("lift", &Semiring::lift)
      .def("otimes", &Semiring::otimes)
      .def("otimes_edge", &Semiring::otimes_edge)
      .def("oplus", &Semiring::oplus)
      .def("oplus_reduce", [](const Semiring& s, const at::Tensor& v, std::vector<int64_t> dims, bool keepdim) {
        return s.oplus_reduce(v, dims, keepdim);
      }, py::arg("value"), py::arg("dims"), py::arg("keepdim") = false)
      .def("matmul", &Semiring::matmul)
      .def("scatter_oplus", &Semiring::scatter_oplus)
      .def("exclusive_oplus", &Semiring::exclusive_oplus, py::arg("value"), py::arg("dim"))
      .def("norm_offdiagonal", &Semiring::norm_offdiagonal, py::arg("a"), py::arg("x"))
      // The interface's generic (block) version, which kernels are tested against.
      .def("generic_norm_offdiagonal", [](const Semiring& s, const at::Tensor& a, const at::Tensor& x) {
        return s.Semiring::norm_offdiagonal(a, x);
      }, py::arg("a"), py::arg("x"))
      .def("readout", &Semiring::readout)
      // The path recorder's re-seeding of ids (provenance.h), for the tests of its one-pass kernel.
      .def("with_origin", &Semiring::with_origin, py::arg("value"), py::arg("first"))
      .def("parts", [](const Semiring& s) {
        std::vector<std::shared_ptr<Semiring>> out;
        for (auto& p : product_parts(s)) out.push_back(std::const_pointer_cast<Semiring>(p));
        return out;
      })
      .def("split", [](const Semiring& s, const at::Tensor& v) { return split_product_value(s, v); })
      .def_property_readonly("origin_entries", &Semiring::origin_entries)
      // Capabilities (semiring.h), so that callers ask the semiring rather than check its name.
      .def_property_readonly("selects", &Semiring::selects)
      .def_property_readonly("selects_minimum", &Semiring::selects_minimum)
      .def_property_readonly("stock_backward_is_exact", &Semiring::stock_backward_is_exact)
      .def_property_readonly("readout_lists_components", &Semiring::readout_lists_components);

  m.def("semiring_names", &semiring_names);
  m.def("make_semiring", [](const std::string& name, int64_t k) {
    return std::const_pointer_cast<Semiring>(make_semiring(name, k));
  }, py::arg("name"), py::arg("k") = 1);
  m.def("python_semiring", [](py::object obj) -> std::shared_ptr<Semiring> {
    return std::make_shared<PySemiring>(std::move(obj));
  });
  m.def("make_provenance", [](const std::string& base, int64_t k) {
    return std::const_pointer_cast<Semiring>(make_provenance(base, k));
  }, py::arg("base"), py::arg("k") = 1);
  m.def("summed_within_nodes", [](std::shared_ptr<Semiring> base) {
    return std::const_pointer_cast<Semiring>(summed_within_nodes(std::move(base)));
  }, py::arg("base"), "base with ⊕ = + inside nodes (within_node_oplus='sum'; base itself where that changes nothing)");
  m.def("make_product", [](std::vector<std::shared_ptr<Semiring>> parts) {
    std::vector<SemiringPtr> p(parts.begin(), parts.end());
    return std::const_pointer_cast<Semiring>(make_product(std::move(p)));
  });

  py::class_<NodeRef>(m, "NodeRef", "An autograd node, held without a Python wrapper (see bindings.cpp)")
      .def(py::init([](py::handle grad_fn) { return NodeRef{node_from_py(grad_fn)}; }), py::arg("grad_fn"))
      .def("name", [](const NodeRef& r) { return r.node->name(); })
      .def_property_readonly("key", [](const NodeRef& r) { return reinterpret_cast<uintptr_t>(r.node.get()); })
      .def("__eq__", [](const NodeRef& a, const NodeRef& b) { return a.node.get() == b.node.get(); })
      .def("__hash__", [](const NodeRef& r) { return std::hash<const void*>()(r.node.get()); })
      // (shape, dtype, device) of each of the node's outputs (where values arrive)
      .def_property_readonly("outputs", [](const NodeRef& r) {
        py::list out;
        for (uint32_t i = 0; i < r.node->num_inputs(); ++i) {
          const auto& meta = r.node->input_metadata(i);
          std::vector<int64_t> shape;
          for (const auto& d : meta.shape_as_dim_vector()) shape.push_back(d.expect_int());
          out.append(py::make_tuple(py::tuple(py::cast(shape)),
                                    py::cast(c10::typeMetaToScalarType(meta.dtype())), py::cast(meta.device())));
        }
        return out;
      })
      // Elements per row of a rule with independent rows (RuleEntry::row_length: layer / RMS norm), else 0.
      .def_property_readonly("row_length", [](const NodeRef& r) -> int64_t {
        const RuleEntry* entry = find_rule(r.node->name());
        return entry && entry->row_length ? entry->row_length(*r.node) : 0;
      })
      // A leaf's tensor (AccumulateGrad), else None.
      .def_property_readonly("variable", [](const NodeRef& r) -> py::object {
        auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(r.node.get());
        return acc ? py::cast(acc->variable) : py::none();
      })
      // metadata["module"] (ts.track_modules), None if unlabelled.
      .def_property_readonly("module", [](const NodeRef& r) -> py::object {
        auto* base = r.node->metadata();
        if (!is_exactly(base, "N5torch8autograd17PyAnomalyMetadataE")) return py::none();
        auto* meta = static_cast<torch::autograd::PyAnomalyMetadata*>(base);
        py::dict d = py::reinterpret_borrow<py::dict>(meta->dict());
        return d.contains("module") ? py::object(d["module"]) : py::none();
      })
      // The node's own backward on plain tensors (None = zero), as grad_fn(*grads).
      .def("__call__", [](const NodeRef& r, const std::vector<std::optional<at::Tensor>>& grads) {
        torch::autograd::variable_list in;
        for (const auto& g : grads) in.push_back(g ? *g : at::Tensor());
        auto out = (*r.node)(std::move(in));
        py::list result;
        for (auto& t : out) result.append(t.defined() ? py::cast(t) : py::none());
        return result;
      });

  // ts.track_modules' labelling without grad_fn objects (see NodeRef): every
  // node reachable from the outputs' grad_fns, short of the inputs' grad_fns,
  // leaves and nodes already labelled, gets metadata["module"] = label.
  m.def("label_nodes", [](const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                          const std::string& label) {
    std::unordered_set<const Node*> stop;
    for (const auto& t : inputs)
      if (t.defined() && t.grad_fn()) stop.insert(t.grad_fn().get());
    std::vector<Node*> work;
    for (const auto& t : outputs)
      if (t.defined() && t.grad_fn()) work.push_back(t.grad_fn().get());
    py::str key("module"), value(label);
    while (!work.empty()) {
      Node* n = work.back();
      work.pop_back();
      if (!n || stop.count(n) || dynamic_cast<torch::autograd::AccumulateGrad*>(n)) continue;
      auto* base = n->metadata();
      if (!is_exactly(base, "N5torch8autograd17PyAnomalyMetadataE")) continue;
      auto dict = py::reinterpret_borrow<py::dict>(static_cast<torch::autograd::PyAnomalyMetadata*>(base)->dict());
      if (dict.contains(key)) continue;
      dict[key] = value;
      stop.insert(n);
      for (const auto& e : n->next_edges()) work.push_back(e.function.get());
    }
  }, py::arg("outputs"), py::arg("inputs"), py::arg("label"));

  m.def("run_backward",
        [](const std::shared_ptr<Semiring>& sr, const std::vector<std::pair<py::object, uint32_t>>& roots,
           const std::vector<at::Tensor>& seeds, const std::vector<std::pair<py::object, uint32_t>>& targets,
           bool keep_graph, bool create_graph, bool collect_leaves, bool record_paths) {
          BackwardOptions opt;
          opt.keep_graph = keep_graph;
          opt.create_graph = create_graph;
          opt.collect_leaves = collect_leaves;
          PreloadSuspended stock_engine_calls;  // this engine calls nodes itself
          std::optional<PathRecorder> recorder;
          if (record_paths) recorder.emplace(*sr);
          auto r = run_backward(*sr, edges_from_py(roots), seeds, edges_from_py(targets), opt,
                                recorder ? &*recorder : nullptr);
          py::list captured;
          for (auto& t : r.captured) captured.append(t.defined() ? py::cast(t) : py::none());
          py::list records;
          for (auto& rec : recorder ? recorder->take_records() : std::vector<PathRecord>{}) {
            py::list contributors;
            for (auto& [producer, edge] : rec.contributors)
              contributors.append(py::make_tuple(producer ? py::cast(NodeRef{producer}) : py::none(), edge));
            records.append(py::make_tuple(NodeRef{rec.node}, rec.slot, rec.value, contributors,
                                          rec.expected_contributors));
          }
          return py::make_tuple(captured, r.in_graph, r.leaf_variables, r.leaf_values, records);
        },
        py::arg("semiring"), py::arg("roots"), py::arg("seeds"), py::arg("targets"), py::arg("keep_graph"),
        py::arg("create_graph"), py::arg("collect_leaves"), py::arg("record_paths") = false);

  // Whether any node reachable from the outputs' grad_fns has a hook (engine/node_hooks.h): rules run
  // outside a walk (run_node_rule) would not run them.
  m.def("graph_has_hooks", [](const std::vector<at::Tensor>& outputs) {
    std::unordered_set<Node*> seen;
    std::vector<Node*> work;
    for (const auto& t : outputs)
      if (t.defined() && t.grad_fn()) work.push_back(t.grad_fn().get());
    while (!work.empty()) {
      Node* n = work.back();
      work.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (NodeHooks::any(*n)) return true;
      for (const auto& e : n->next_edges()) work.push_back(e.function.get());
    }
    return false;
  }, py::arg("outputs"));
  m.def("run_node_rule",
        [](const std::shared_ptr<Semiring>& sr, const NodeRef& node, const std::vector<std::optional<at::Tensor>>& values,
           const std::vector<bool>& wanted) {
          std::vector<at::Tensor> in;
          for (const auto& v : values) in.push_back(v ? *v : at::Tensor());
          PreloadSuspended stock_engine_calls;  // the rule may call the node's own backward
          py::list result;
          for (auto& t : run_node_rule(*sr, *node.node, in, wanted)) result.append(t.defined() ? py::cast(t) : py::none());
          return result;
        },
        py::arg("semiring"), py::arg("node"), py::arg("values"), py::arg("wanted"));

  // The LD_PRELOAD route (csrc/hooks, csrc/preload): the stock engine made
  // semiring-aware by the interposer, when the process was started with it.
  m.def("preload_install", &install_preload_hooks);
  m.def("preload_set_semiring", [](std::shared_ptr<Semiring> sr) { set_preload_semiring(std::move(sr)); },
        py::arg("semiring").none(true));
  m.def("preload_set_accumulator", [](py::function fn) {
    auto* held = held_callback(std::move(fn));
    set_preload_accumulator([held](const std::vector<at::Tensor>& leaves, const std::vector<at::Tensor>& values) {
      call_from_engine(*held, leaves, values);
    });
  });
  m.def("preload_symbols", &preload_symbols);
  // The upstream series (csrc/hooks/series_hooks.h): registers the semirings
  // with a patched torch's registry; False on a stock torch.
  m.def("series_register", [](py::function accumulate) {
    auto* held = held_callback(std::move(accumulate));
    return register_series_semirings(
        [held](const at::Tensor& leaf, const at::Tensor& value, const std::string& semiring, int64_t components) {
          call_from_engine(*held, leaf, value, semiring, components);
        });
  });

  // Both keep what they replace, for unregister_rule.
  auto register_from_python = [](const std::string& name, Rule rule, const std::string& family) {
    const RuleEntry* before = find_rule(name);
    shadowed_rules()[name].push_back(before ? *before : RuleEntry{});
    register_rule(name, std::move(rule), family);
    python_rule_names().push_back(name);
  };
  m.def("register_rule", [register_from_python](const std::string& name, py::function fn, const std::string& family) {
    register_from_python(name, python_rule(std::move(fn)), family);
  }, py::arg("node_name"), py::arg("rule"), py::arg("family") = "user");
  m.def("register_pointwise", [register_from_python](const std::string& name, py::object forward_cls) {
    register_from_python(name, declared_pointwise_rule(std::move(forward_cls)), "pointwise");
  }, py::arg("node_name"), py::arg("forward_cls"),
     "The checked diagonal (element-wise) rule for nodes of the autograd.Function forward_cls");
  m.def("unregister_rule", [](const std::string& name) {
    auto& names = python_rule_names();
    auto it = std::find(names.rbegin(), names.rend(), name);
    TORCH_CHECK_VALUE(it != names.rend(), "torch_semiring: no rule for '", name, "' was registered with "
                      "ts.register_rule (built-in rules cannot be removed; register one to replace it)");
    names.erase(std::next(it).base());
    auto& stack = shadowed_rules()[name];
    RuleEntry previous = stack.back();
    stack.pop_back();
    if (previous.rule) register_rule(name, std::move(previous.rule), previous.family);
    else unregister_rule(name);
  }, py::arg("node_name"), "Removes the latest ts.register_rule for node_name; the rule it replaced comes back");
  m.def("release_python_objects", [] {
    for (const auto& name : python_rule_names()) unregister_rule(name);
    python_rule_names().clear();
    shadowed_rules().clear();
    set_log_sink(nullptr);
    set_hook_namer(nullptr);
    set_subclass_gatherer(nullptr);
  });
  // The SIMD kernels' extras that the semiring interface has no place for:
  // argmax provenance for path extraction, and which ISA runs (for tests).
  m.def("kernel_max_matmul_argmax", &kernels::max_matmul_argmax, py::arg("semiring"), py::arg("g"), py::arg("w"));
  // The same for max_prod and kmax(k) (k = the value's components); None where
  // the kernel declines.
  m.def("kernel_selecting_matmul_argmax", [](const std::string& name, const at::Tensor& g,
                                             const at::Tensor& w) -> py::object {
    std::tuple<at::Tensor, at::Tensor> r;
    if (name == "max_prod") r = kernels::max_prod_matmul_argmax(g, w);
    else if (name == "kmax") r = kernels::kmax_matmul_argmax(g, w, g.size(0));
    else TORCH_CHECK_VALUE(false, "torch_semiring: no argmax kernel for semiring '", name, "' here (viterbi, "
                           "max_abs: kernel_max_matmul_argmax)");
    return std::get<0>(r).defined() ? py::cast(r) : py::none();
  }, py::arg("name"), py::arg("g"), py::arg("w"));
  m.def("kernel_isa", &kernels::kernel_isa);
  m.def("keep_freed_heap_for_reuse", &keep_freed_heap_for_reuse,
        "glibc's mmap and trim thresholds set once per process so a backward's freed blocks are reused "
        "(engine/process_heap.cpp); False where they were left alone. The first rule to run calls it.");
  m.def("kernel_calls", &kernels::kernel_calls);
  m.def("device_kernel_calls", &kernels::device::calls,
        "products computed through the device kernels' C API (CUDA, or the emulation: "
        "TORCH_SEMIRING_KERNEL_BACKEND=emulate)");
  m.def("device_elementwise_calls", &kernels::device::elementwise_calls,
        "fused element-wise ops (⊗ edge, ⊕) computed through the device kernels' C API");
  m.def("exp_shift_stats", &kernels::exp_shift_stats);
  m.def("norm_row_stats", [] {
    const auto st = kernels::norm_row_stats();
    py::dict d;
    d["pruned_max"] = st.pruned_max, d["declined_max"] = st.declined_max, d["topk_lanes"] = st.topk_lanes;
    d["pruned_signed"] = st.pruned_signed, d["declined_signed"] = st.declined_signed;
    return d;
  }, "layer-norm rows so far: max_abs's / viterbi's by the pruned pass, declined by it (its budget), kmax's by "
     "vector lanes, max_prod's by its pruned pass, declined by it");
  // The kernels' weight-preparation cache (policy in kernels/lift_cache.h).
  m.def("lift_cache_info", [] {
    auto i = kernels::lift_cache_info();
    py::dict d;
    d["hits"] = i.hits, d["misses"] = i.misses, d["uncached"] = i.uncached;
    d["entries"] = i.entries, d["bytes"] = i.bytes, d["limit"] = i.limit;
    return d;
  });
  m.def("clear_lift_cache", &kernels::clear_lift_cache);
  m.def("set_lift_cache_limit", &kernels::set_lift_cache_limit, py::arg("bytes"));
  m.def("lift_cacheable", &kernels::lift_cacheable, py::arg("w"));
  // One kernel by semiring name, None where it does not apply (the semiring's
  // matmul then takes the generic path): lets tests check the kernel itself.
  // saved_operand: w stands for a tensor a node saved in the forward pass (as
  // in the matmul rules), which the lift cache may keep (kernels/lift_cache.h).
  m.def("kernel_matmul", [](const std::string& name, const at::Tensor& g, const at::Tensor& w,
                            bool saved_operand) -> py::object {
    std::optional<kernels::SavedOperandScope> scope;
    if (saved_operand) scope.emplace();
    at::Tensor out;
    if (name == "viterbi") out = kernels::max_plus_matmul(g, w);
    else if (name == "max_abs") out = kernels::max_times_matmul(g, w);
    else if (name == "max_prod") out = kernels::max_prod_matmul(g, w);
    else if (name == "log") out = kernels::log_matmul(g, w);
    else if (name == "entropy") out = kernels::entropy_matmul(g, w);
    else if (name == "kmax") out = kernels::kmax_matmul(g, w, g.size(0));  // k = the value's components
    else TORCH_CHECK_VALUE(false, "torch_semiring: no matmul kernel for semiring '", name, "'");
    return out.defined() ? py::cast(out) : py::none();
  }, py::arg("name"), py::arg("g"), py::arg("w"), py::arg("saved_operand") = false);
  // The fused attention rule's row products out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n]) by its CPU loops,
  // None where they decline (tests compare them with the semiring's generic matmul).
  m.def("kernel_attention_row_products", [](std::shared_ptr<Semiring> sr, const at::Tensor& g,
                                            const at::Tensor& w) -> py::object {
    auto out = kernels::attention_row_products(*sr, g, w);
    return out.defined() ? py::cast(out) : py::none();
  }, py::arg("semiring"), py::arg("g"), py::arg("w"));
  m.def("attention_node_standin", &attention_node_standin, py::arg("kind"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("bias") = std::nullopt, py::arg("causal") = false,
        py::arg("scale") = std::nullopt, py::arg("dropout_p") = 0.0,
        "Test support: a CUDA fused-attention node standing in on CPU tensors (rules/attention.h)");
  m.def("cudnn_batch_norm_node_standin", &cudnn_batch_norm_node_standin, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("out"), py::arg("save_mean"),
        py::arg("save_invstd"), py::arg("training"), py::arg("eps"),
        "Test support: CUDA's cuDNN batch-norm node standing in on CPU tensors (rules/normalization.h)");
  m.def("restore_builtin_rules", &register_builtin_rules);
  m.def("registered_rules", &registered_rules);
  m.def("generic_families", &generic_families);
  m.def("has_rule", [](const std::string& name) { return find_rule(name) != nullptr; });
  // namer(hooks_dict) -> str names the Python hooks behind a refused hook
  // (node_hooks.h): the dict of one Python hook object of the autograd node.
  m.def("set_hook_namer", [](py::object namer) {
    if (namer.is_none()) return set_hook_namer(nullptr);
    set_hook_namer([namer](const torch::autograd::FunctionPreHook* pre,
                           const torch::autograd::FunctionPostHook* post) -> std::string {
      PyObject* dict = nullptr;
      if (is_exactly(pre, "N5torch8autograd23PyFunctionTensorPreHookE"))
        dict = static_cast<const torch::autograd::PyFunctionTensorPreHook*>(pre)->dict;
      else if (is_exactly(pre, "N5torch8autograd17PyFunctionPreHookE"))
        dict = static_cast<const torch::autograd::PyFunctionPreHook*>(pre)->dict;
      else if (is_exactly(post, "N5torch8autograd18PyFunctionPostHookE"))
        dict = static_cast<const torch::autograd::PyFunctionPostHook*>(post)->dict;
      if (!dict) return "";
      py::gil_scoped_acquire gil;
      try {
        return namer(py::reinterpret_borrow<py::object>(dict)).cast<std::string>();
      } catch (py::error_already_set&) {
        return "";
      }
    });
  });
  // Sets .grad of every tensor at once, with no Python code in between, so an
  // interrupt (KeyboardInterrupt is raised between bytecodes) cannot leave
  // some written and others not. The caller checked shapes, dtypes, devices.
  m.def("assign_grads", [](const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grads) {
    TORCH_CHECK(tensors.size() == grads.size(), "torch_semiring: assign_grads: ", tensors.size(), " tensors, ",
                grads.size(), " grads");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      const auto& g = grads[i];
      TORCH_CHECK(g.sizes().equals(t.sizes()) && g.scalar_type() == t.scalar_type() && g.device() == t.device(),
                  "torch_semiring: a .grad of shape ", g.sizes(), " (", g.scalar_type(), ", ", g.device(),
                  ") does not fit a tensor of shape ", t.sizes(), " (", t.scalar_type(), ", ", t.device(), ")");
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].mutable_grad() = grads[i];
  });
  // gather(t) -> plain tensor: DTensor shards a rule meets become whole tensors (rules/rule.h).
  m.def("set_subclass_gatherer", [](py::object gather) {
    if (gather.is_none()) return set_subclass_gatherer(nullptr);
    set_subclass_gatherer([gather](const at::Tensor& t) {
      py::gil_scoped_acquire gil;
      try {
        return gather(t).cast<at::Tensor>();
      } catch (py::error_already_set& e) {
        e.restore();
        python_error err;
        err.persist();
        throw err;
      }
    });
  });
  m.def("set_log_sink", [](py::object sink) {
    if (sink.is_none()) {
      set_log_sink(nullptr);
    } else {
      set_log_sink([sink](const std::string& line) {
        py::gil_scoped_acquire gil;
        sink(line);
      });
    }
  });
}
