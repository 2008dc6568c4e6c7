//===- lib/frontend/torchscript_importer.cpp - TorchScript -> apc IR -------===//
//
// The TorchScript importer. See
// apc/frontend/torchscript.h for the algorithm. The interpreter keeps one Slot per
// torch::jit::Value: its run-time IValue (a meta tensor, a real CPU scalar, an int, a list, a
// module object), the apc value it maps to, the module path of module objects, and whether it
// depends on the forward's inputs (which decides whether a prim::If may be flattened).
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/functionalize.h"
#include "apc/frontend/script_module.h"
#include "apc/frontend/torchscript.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ExpandUtils.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/jit/runtime/symbolic_shape_registry.h>
#include <torch/script.h>

#include "apc/support/activity.h"
#include "apc/support/clock.h"
#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "torch_types.h"

namespace apc::frontend {

namespace tj = torch::jit;
using ir::DType;

namespace {

/// "model.py:42", or "" when the node has no source.
std::string sourceOf(const tj::Node* node) {
  auto loc = node->sourceRange().file_line_col();
  if (!loc) return "";
  auto [file, line, col] = *loc;
  (void)col;
  return std::filesystem::path(file).filename().string() + ":" + std::to_string(line);
}

at::Tensor metaLike(const at::Tensor& t) {
  return at::empty(t.sizes(), at::TensorOptions().device(at::kMeta).dtype(t.scalar_type()));
}

ir::TensorMeta metaOf(const at::Tensor& t, bool requires_grad) {
  ir::TensorMeta m;
  m.dtype = dtypeOf(t.scalar_type());
  for (auto s : t.sizes()) m.shape.push_back(ir::Dim::fixed(s));
  m.requires_grad = requires_grad;
  return m;
}

bool hasMutatingOp(tj::Block* block);

// --- the importer --------------------------------------------------------------------------------

struct Slot {
  c10::IValue iv;
  ir::ValueId id;        // invalid for module objects and structural values
  std::string module;    // module path, for module objects
  bool tainted = false;  // depends on a forward input
  bool is_module = false;
  bool data_dependent = false;  // a scalar read from a tensor's values: unknown at import time
  // A tuple built in the forward: its elements, so that unpacking it (TupleUnpack, TupleIndex
  // with a known index) reads them directly instead of adding structural nodes.
  std::shared_ptr<const std::vector<Slot>> tuple_elements;
};

class Importer {
 public:
  /// `defaults[i]`, when set, binds forward input i to that value (its declared default) instead
  /// of an input node.
  Importer(tj::Module module, std::vector<InputSpec> inputs,
           std::vector<std::optional<c10::IValue>> defaults, bool memoize_meta,
           int64_t max_interpreted_nodes)
      : module_(std::move(module)),
        inputs_(std::move(inputs)),
        defaults_(std::move(defaults)),
        max_interpreted_nodes_(max_interpreted_nodes),
        memoize_meta_(memoize_meta) {}

  Expected<ir::Graph> run(const std::shared_ptr<tj::Graph>& graph) {
    graph_ = graph;
    // One slot per value, most of them node outputs: reserved, so that a deep model's 30,000
    // values do not rehash the table a dozen times.
    slots_.reserve(countValues(graph->block()));
    // Without in-place ops no meta tensor changes after it is made, so outputs can be shared.
    memoize_ = memoize_meta_ && !hasMutatingOp(graph->block());
    APC_RETURN_IF_ERROR(addInputsAndParameters());
    markStructuralOutputs();
    APC_RETURN_IF_ERROR(interpretBlock(graph->block()));
    APC_ASSIGN_OR_RETURN(ir::OutputTree tree, buildTree(graph->outputs().at(0), 0));
    out_.setOutputs(std::move(tree));
    APC_RETURN_IF_ERROR(out_.verify());
    APC_RETURN_IF_ERROR(checkTensorSizes());
    return std::move(out_);
  }

 private:
  /// The values `block` defines, nested blocks included.
  static size_t countValues(const tj::Block* block) {
    size_t n = block->inputs().size();
    for (const tj::Node* node : block->nodes()) {
      n += node->outputs().size();
      for (const tj::Block* b : node->blocks()) n += countValues(b);
    }
    return n;
  }

  /// Sizes come from the input shapes (recorded or given) and from what the forward computes of
  /// them: every tensor's sizes stay within the caps of the .pt2 reader (kMaxTensorDim,
  /// kMaxTensorNumel), else the planner's byte counts overflow.
  Status checkTensorSizes() const {
    auto check = [&](const ir::Value& v, const ir::TensorMeta& m) -> Status {
      int64_t numel = 1;
      for (const ir::Dim& d : m.shape) {
        std::string what = "tensor %" + printable(v.debug_name);
        if (v.producer.valid()) what += " (" + out_.node(v.producer).qualifiedOp() + ")";
        if (d.size < 0 || d.size > kMaxTensorDim)
          return invalidArgument(what + " has a size " + std::to_string(d.size) +
                                 " outside [0, 2^40]");
        if (__builtin_mul_overflow(numel, d.size, &numel) || numel > kMaxTensorNumel)
          return invalidArgument(what + " has more than 2^56 elements");
      }
      return Status::success();
    };
    for (const ir::Value& v : out_.values()) {
      if (v.tensor) APC_RETURN_IF_ERROR(check(v, *v.tensor));
      for (const ir::TensorMeta& m : v.elements) APC_RETURN_IF_ERROR(check(v, m));
    }
    return Status::success();
  }

  // Input nodes first (forward order), then every parameter (named_parameters order).
  Status addInputsAndParameters() {
    const auto& gin = graph_->inputs();
    // self
    Slot self;
    self.iv = module_._ivalue();
    self.is_module = true;
    slots_[gin.at(0)] = self;
    if (gin.size() - 1 != inputs_.size())
      return internalError("forward has " + std::to_string(gin.size() - 1) + " inputs but " +
                           std::to_string(inputs_.size()) + " shapes were resolved");
    for (size_t i = 1; i < gin.size(); ++i) {
      const InputSpec& spec = inputs_[i - 1];
      if (i - 1 < defaults_.size() && defaults_[i - 1]) {
        // An optional argument left at its default (`mask: Optional[Tensor] = None`): a constant.
        Slot s;
        s.iv = *defaults_[i - 1];
        s.id = addConstantValue(s.iv, spec.name);
        slots_[gin[i]] = s;
        continue;
      }
      at::Tensor t =
          at::empty(ir::hintSizes(spec.shape),
                    at::TensorOptions().device(at::kMeta).dtype(scalarTypeOf(spec.dtype)));
      ir::Value v;
      v.type = ir::ValueType::kTensor;
      v.debug_name = spec.name;
      v.tensor = ir::TensorMeta{spec.shape, spec.dtype, false};
      ir::ValueId id = out_.addValue(std::move(v));
      ir::Node n;
      n.kind = ir::NodeKind::kInput;
      n.op = "input";
      n.name = spec.name;
      n.outputs = {id};
      out_.addNode(std::move(n));
      Slot s;
      s.iv = t;
      s.id = id;
      s.tainted = true;
      slots_[gin[i]] = s;
    }
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      std::string key = tensorIdentity(p.value);
      if (tensor_nodes_.count(key)) continue;  // tied: reported once, under its first name
      tensor_nodes_[key] =
          addLeaf(ir::NodeKind::kParameter, p.name, p.value, p.value.requires_grad());
    }
    return Status::success();
  }

  ir::ValueId addLeaf(ir::NodeKind kind, const std::string& name, const at::Tensor& t, bool grad,
                      std::optional<std::string> module_path = std::nullopt) {
    ir::Value v;
    v.type = ir::ValueType::kTensor;
    v.debug_name = name;
    v.tensor = metaOf(t, grad);
    ir::ValueId id = out_.addValue(std::move(v));
    ir::Node n;
    n.kind = kind;
    n.op = ir::nodeKindName(kind);
    n.name = name;
    n.outputs = {id};
    auto dot = name.rfind('.');
    n.module_path = module_path                ? *module_path
                    : dot == std::string::npos ? ""
                                               : name.substr(0, dot);
    out_.addNode(std::move(n));
    return id;
  }

  // Tuple/List/Dict constructs that only build the returned structure become the OutputTree.
  void markStructuralOutputs() {
    std::vector<tj::Value*> work(graph_->outputs().begin(), graph_->outputs().end());
    while (!work.empty()) {
      tj::Value* v = work.back();
      work.pop_back();
      tj::Node* p = v->node();
      auto k = p->kind();
      if ((k == c10::prim::TupleConstruct || k == c10::prim::DictConstruct ||
           (k == c10::prim::ListConstruct && !v->type()->isSubtypeOf(*c10::ListType::ofInts()))) &&
          v->uses().size() == 1) {
        structural_.insert(p);
        for (tj::Value* in : p->inputs()) work.push_back(in);
      }
    }
  }

  Expected<ir::OutputTree> buildTree(tj::Value* v, int depth) {
    if (depth > 32) return unsupported("output structure nested too deeply");
    tj::Node* p = v->node();
    if (structural_.count(p)) {
      ir::OutputTree t;
      if (p->kind() == c10::prim::DictConstruct) {
        t.kind = ir::OutputTree::Kind::kDict;
        for (size_t i = 0; i + 1 < p->inputs().size(); i += 2) {
          auto key = tj::toIValue(p->inputs()[i]);
          if (!key || !key->isString())
            return unsupported("output dict with a non-constant or non-string key" + where(p));
          t.keys.push_back(key->toStringRef());
          APC_ASSIGN_OR_RETURN(ir::OutputTree c, buildTree(p->inputs()[i + 1], depth + 1));
          t.children.push_back(std::move(c));
        }
      } else {
        t.kind = p->kind() == c10::prim::TupleConstruct ? ir::OutputTree::Kind::kTuple
                                                        : ir::OutputTree::Kind::kList;
        for (tj::Value* in : p->inputs()) {
          APC_ASSIGN_OR_RETURN(ir::OutputTree c, buildTree(in, depth + 1));
          t.children.push_back(std::move(c));
        }
      }
      return t;
    }
    APC_ASSIGN_OR_RETURN(ir::ValueId id, valueIdOf(v));
    return ir::OutputTree::makeLeaf(id);
  }

  /// The apc value of a torch value, materializing graph-level constants on first use.
  Expected<ir::ValueId> valueIdOf(tj::Value* v) {
    auto it = slots_.find(v);
    if (it == slots_.end())
      return internalError("value %" + v->debugName() + " used before definition");
    if (!it->second.id.valid()) {
      if (it->second.is_module)
        return unsupported("a module object is used as a value" + where(v->node()));
      it->second.id = addConstantValue(it->second.iv, v->debugName());
      if (!it->second.id.valid())
        return unsupported("constant %" + v->debugName() + " of type " + v->type()->str() +
                           " is not supported" + where(v->node()));
    }
    return it->second.id;
  }

  /// Module path of an inlined node: "layers.3.attention.wq". The call stack names each called
  /// submodule only by its attribute name in the caller ("0" for an entry of `layers`), since
  /// containers such as ModuleList are never called; so each step searches the caller's submodule
  /// tree breadth-first for the attribute of that name and class.
  std::string modulePathOf(const tj::Node* node) {
    auto cs = node->callstack();
    if (!cs) return "";
    const tj::InlinedCallStack* key = cs->get();
    auto cached = module_paths_.find(key);
    if (cached != module_paths_.end()) return cached->second;
    std::string path;
    c10::intrusive_ptr<c10::ivalue::Object> obj = module_._ivalue();
    for (const auto& entry : (*cs)->vec()) {
      const auto& info = std::get<tj::kModuleInstanceInfo>(entry);
      // "SELF": a scripted module calling a method of its own (torchvision's ResNet.forward calls
      // self._forward_impl, a Conv2d self._conv_forward): the same module, no path component.
      if (!info || info->instance_name().empty() || info->instance_name() == "SELF") continue;
      auto [rel, child] = cachedSubmodule(obj, info->instance_name(), info->class_type());
      if (!child) {  // not found: keep the name as the call stack gives it
        rel = info->instance_name();
      } else {
        obj = child;
      }
      path = path.empty() ? rel : path + "." + rel;
    }
    module_paths_[key] = path;
    return path;
  }

  /// findSubmodule, once per (object, name, class): every layer's call stacks search the root for
  /// their entry of `layers` ("0", "1", ...), a search as long as the list, so uncached the import
  /// grew with the square of the number of layers.
  std::pair<std::string, c10::intrusive_ptr<c10::ivalue::Object>> cachedSubmodule(
      const c10::intrusive_ptr<c10::ivalue::Object>& root, const std::string& name,
      const c10::ClassTypePtr& type) {
    auto key = std::make_tuple(root.get(), name, type.get());
    auto it = submodules_.find(key);
    if (it == submodules_.end())
      it = submodules_.emplace(key, findSubmodule(root, name, type)).first;
    return it->second;
  }

  static std::pair<std::string, c10::intrusive_ptr<c10::ivalue::Object>> findSubmodule(
      const c10::intrusive_ptr<c10::ivalue::Object>& root, const std::string& name,
      const c10::ClassTypePtr& type) {
    std::vector<std::pair<std::string, c10::intrusive_ptr<c10::ivalue::Object>>> queue{{"", root}};
    for (size_t head = 0; head < queue.size(); ++head) {
      auto [rel, obj] = queue[head];
      const auto& cls = obj->type();
      for (size_t i = 0; i < cls->numAttributes(); ++i) {
        c10::IValue v = obj->getSlot(i);
        if (!v.isObject() || !v.toObject()->type()->is_module()) continue;
        std::string attr = cls->getAttributeName(i);
        std::string child_rel = rel.empty() ? attr : rel + "." + attr;
        if (attr == name && (!type || v.toObject()->type() == type))
          return {child_rel, v.toObject()};
        queue.emplace_back(child_rel, v.toObject());
      }
    }
    return {"", {}};
  }

  std::string where(const tj::Node* n) {
    std::string s = " at node " + std::string(n->kind().toQualString());
    std::string src = sourceOf(n);
    if (!src.empty()) s += " (" + src + ")";
    std::string mod = modulePathOf(n);
    if (!mod.empty()) s += " in module " + mod;
    return s;
  }

  // --- non-tensor values ---------------------------------------------------------------------

  /// Type and constant of a non-tensor IValue; kOther without constant when not representable.
  static std::pair<ir::ValueType, std::optional<ir::Constant>> describe(const c10::IValue& iv) {
    using VT = ir::ValueType;
    if (iv.isNone()) return {VT::kNone, ir::None{}};
    if (iv.isInt()) return {VT::kInt, iv.toInt()};
    if (iv.isDouble()) return {VT::kFloat, iv.toDouble()};
    if (iv.isBool()) return {VT::kBool, iv.toBool()};
    if (iv.isString()) return {VT::kString, iv.toStringRef()};
    if (iv.isDevice()) return {VT::kDevice, iv.toDevice().str()};
    if (iv.isIntList()) return {VT::kIntList, iv.toIntVector()};
    if (iv.isDoubleList()) return {VT::kFloatList, iv.toDoubleVector()};
    if (iv.isBoolList()) {
      std::vector<bool> b;
      for (bool x : iv.toBoolList()) b.push_back(x);
      return {VT::kBoolList, b};
    }
    if (iv.isTensorList()) return {VT::kTensorList, std::nullopt};
    if (iv.isTuple()) return {VT::kTuple, std::nullopt};
    if (iv.isList() && iv.toListRef().empty()) return {VT::kIntList, std::vector<int64_t>{}};
    return {VT::kOther, std::nullopt};
  }

  static bool isTensorsOnlyOptionalList(const c10::IValue& iv) {
    if (!iv.isList() || iv.isTensorList() || iv.toListRef().empty()) return false;
    for (const c10::IValue& e : iv.toListRef())
      if (!e.isTensor()) return false;
    return true;
  }

  ir::ValueId addConstantValue(const c10::IValue& iv, const std::string& name) {
    auto [type, constant] = describe(iv);
    if (!constant) return {};
    return out_.addConstant(type, *constant, name);
  }

  // --- interpretation --------------------------------------------------------------------------

  Status interpretBlock(tj::Block* block) {
    for (tj::Node* node : block->nodes()) {
      if (structural_.count(node)) continue;  // becomes the OutputTree
      // Unrolling is bounded as a whole, not only per loop: nested loops whose trip counts come
      // from the input shapes multiply (a 2 KB model unrolled without bound before).
      if (++interpreted_ > max_interpreted_nodes_)
        return unsupported("the model unrolls to more than " +
                           std::to_string(max_interpreted_nodes_) +
                           " nodes at import (apc unrolls loops; nested loops multiply their trip "
                           "counts)" +
                           where(node));
      auto k = node->kind();
      if (k == c10::prim::Constant) {
        APC_RETURN_IF_ERROR(interpretConstant(node));
      } else if (k == c10::prim::GetAttr) {
        APC_RETURN_IF_ERROR(interpretGetAttr(node));
      } else if (k == c10::prim::If) {
        APC_RETURN_IF_ERROR(interpretIf(node));
      } else if (k == c10::prim::Loop) {
        APC_RETURN_IF_ERROR(interpretLoop(node));
      } else if (k == c10::prim::CallMethod || k == c10::prim::CallFunction ||
                 k == c10::prim::fork || k == c10::prim::Enter || k == c10::prim::RaiseException) {
        return unsupported("cannot flatten control flow " + std::string(k.toQualString()) +
                           where(node) +
                           " (use tracing, or make the branch independent of the inputs)");
      } else {
        APC_RETURN_IF_ERROR(interpretOp(node));
      }
    }
    return Status::success();
  }

  Status interpretConstant(tj::Node* node) {
    tj::Value* out = node->output();
    auto iv = tj::toIValue(out);
    if (!iv) return unsupported("constant without a value" + where(node));
    Slot s;
    s.iv = *iv;
    if (iv->isTensor()) {
      at::Tensor t = iv->toTensor();
      if (t.dim() == 0) {
        // A scalar tensor literal (traced constants such as eps): a graph-level constant value.
        ir::Value v;
        v.type = ir::ValueType::kTensor;
        v.debug_name = out->debugName();
        v.tensor = metaOf(t, false);
        if (t.is_floating_point())
          v.constant = t.item<double>();
        else if (t.scalar_type() == at::kBool)
          v.constant = t.item<bool>();
        else
          v.constant = t.item<int64_t>();
        s.id = out_.addValue(std::move(v));
      } else {
        // A tensor literal (traced masks, tables): a Buffer node, so that later stages keep its
        // data.
        s.id = addLeaf(ir::NodeKind::kBuffer, "__constant." + out->debugName(), t, false, "");
        s.iv = metaLike(t);
      }
    }
    slots_[out] = s;
    return Status::success();
  }

  Status interpretGetAttr(tj::Node* node) {
    const Slot& obj = slots_.at(node->input());
    if (!obj.iv.isObject()) return unsupported("attribute access on a non-object" + where(node));
    const std::string& attr = node->s(c10::attr::name);
    auto object = obj.iv.toObject();
    auto cls = object->type();
    auto slot_index = cls->findAttributeSlot(attr);
    if (!slot_index) return unsupported("unknown attribute '" + attr + "'" + where(node));
    c10::IValue value = object->getSlot(*slot_index);
    std::string path = obj.module.empty() ? attr : obj.module + "." + attr;
    Slot s;
    if (value.isObject()) {
      s.iv = value;
      s.is_module = true;
      s.module = path;
    } else if (value.isTensor()) {
      at::Tensor t = value.toTensor();
      std::string key = tensorIdentity(t);
      auto it = tensor_nodes_.find(key);
      if (it == tensor_nodes_.end()) {
        // A buffer or a plain tensor attribute; parameters were all added up front.
        it = tensor_nodes_.emplace(key, addLeaf(ir::NodeKind::kBuffer, path, t, false)).first;
      }
      s.id = it->second;
      s.iv = metaLike(t);
    } else {
      s.iv = value;
    }
    slots_[node->output()] = s;
    return Status::success();
  }

  Status interpretIf(tj::Node* node) {
    const Slot& cond = slots_.at(node->input(0));
    if (cond.data_dependent)
      return unsupported(
          "cannot flatten control flow prim::If whose condition depends on tensor values" +
          where(node));
    // A condition computed from the inputs' shapes (not their values) is known here: the plan is
    // made for these shapes (torch's _verify_batch_size in BatchNorm, rank checks).
    if (!cond.iv.isBool())
      return unsupported(
          "cannot flatten control flow prim::If whose condition is not known at import" +
          where(node));
    tj::Block* taken = node->blocks().at(cond.iv.toBool() ? 0 : 1);
    APC_RETURN_IF_ERROR(interpretBlock(taken));
    for (size_t i = 0; i < node->outputs().size(); ++i)
      slots_[node->outputs()[i]] = slots_.at(taken->outputs()[i]);
    return Status::success();
  }

  /// prim::Loop whose trip count and conditions are known at import (computed from constants,
  /// module attributes or the inputs' shapes, never from tensor values): unrolled.
  Status interpretLoop(tj::Node* node) {
    const Slot& trip = slots_.at(node->input(0));
    const Slot& start = slots_.at(node->input(1));
    if (trip.data_dependent || start.data_dependent || !trip.iv.isInt() || !start.iv.isBool())
      return unsupported(
          "cannot flatten control flow prim::Loop whose trip count or condition depends on "
          "tensor values" +
          where(node));
    constexpr int64_t kMaxUnroll = 4096;
    const int64_t max_trips = trip.iv.toInt();
    bool cond = start.iv.toBool();
    tj::Block* body = node->blocks().at(0);
    std::vector<Slot> carried;
    for (size_t i = 2; i < node->inputs().size(); ++i) carried.push_back(slots_.at(node->input(i)));
    int64_t i = 0;
    for (; i < max_trips && cond; ++i) {
      if (i == kMaxUnroll)
        return unsupported("prim::Loop runs more than " + std::to_string(kMaxUnroll) +
                           " iterations; apc unrolls loops at import" + where(node));
      Slot counter;
      counter.iv = c10::IValue(i);
      slots_[body->inputs().at(0)] = counter;
      for (size_t k = 0; k < carried.size(); ++k) slots_[body->inputs().at(k + 1)] = carried[k];
      APC_RETURN_IF_ERROR(interpretBlock(body));
      const Slot& c = slots_.at(body->outputs().at(0));
      if (c.data_dependent || !c.iv.isBool())
        return unsupported(
            "cannot flatten control flow prim::Loop whose condition depends on tensor values" +
            where(node));
      cond = c.iv.toBool();
      for (size_t k = 0; k < carried.size(); ++k) carried[k] = slots_.at(body->outputs().at(k + 1));
    }
    for (size_t k = 0; k < carried.size(); ++k) slots_[node->outputs().at(k)] = carried[k];
    return Status::success();
  }

  static bool isVararg(c10::Symbol k) {
    return k == c10::prim::ListConstruct || k == c10::prim::TupleConstruct ||
           k == c10::prim::ListUnpack || k == c10::prim::TupleUnpack ||
           k == c10::prim::DictConstruct || k == c10::prim::TupleIndex;
  }

  /// Structural prim ops, by hand: their implementations in libtorch are not exported.
  void runVararg(tj::Node* node, tj::Stack& stack) {
    auto k = node->kind();
    size_t n_in = node->inputs().size();
    tj::Stack args(stack.end() - static_cast<long>(n_in), stack.end());
    stack.resize(stack.size() - n_in);
    if (k == c10::prim::ListConstruct) {
      auto list_type = node->output()->type()->expect<c10::ListType>();
      c10::impl::GenericList list(list_type->getElementType());
      list.reserve(n_in);
      for (auto& a : args) list.push_back(std::move(a));
      stack.emplace_back(std::move(list));
    } else if (k == c10::prim::TupleConstruct) {
      stack.emplace_back(c10::ivalue::Tuple::create(std::move(args)));
    } else if (k == c10::prim::ListUnpack) {
      for (const auto& e : args.at(0).toListRef()) stack.push_back(e);
    } else if (k == c10::prim::TupleUnpack) {
      for (const auto& e : args.at(0).toTupleRef().elements()) stack.push_back(e);
    } else if (k == c10::prim::DictConstruct) {
      auto dict_type = node->output()->type()->expect<c10::DictType>();
      c10::impl::GenericDict dict(dict_type->getKeyType(), dict_type->getValueType());
      for (size_t i = 0; i + 1 < args.size(); i += 2) dict.insert_or_assign(args[i], args[i + 1]);
      stack.emplace_back(std::move(dict));
    } else {  // TupleIndex
      stack.push_back(args.at(0).toTupleRef().elements().at(args.at(1).toInt()));
    }
  }

  /// The memo key of an operator call on meta tensors and plain values: the schema, then each
  /// argument (a tensor's dtype, sizes, strides and offset; a scalar's or list's value). False when
  /// an argument is of another kind (a real tensor, whose values may matter; a list of tensors;
  /// an object), and then the call is not memoized.
  static bool memoKey(const c10::FunctionSchema* schema, const tj::Stack& args, std::string& key) {
    auto put = [&key](const auto& x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
    put(schema);
    for (const c10::IValue& a : args) {
      if (a.isTensor()) {
        const at::Tensor& t = a.toTensor();
        if (!t.defined() || !t.is_meta()) return false;
        put('T');
        put(static_cast<int16_t>(t.scalar_type()));
        put(t.dim());
        for (int64_t d : t.sizes()) put(d);
        for (int64_t d : t.strides()) put(d);
        put(t.storage_offset());
      } else if (a.isInt()) {
        put('i');
        put(a.toInt());
      } else if (a.isDouble()) {
        put('d');
        put(a.toDouble());
      } else if (a.isBool()) {
        put('b');
        put(a.toBool());
      } else if (a.isNone()) {
        put('n');
      } else if (a.isString()) {
        put('s');
        put(a.toStringRef().size());
        key += a.toStringRef();
      } else if (a.isIntList() || a.isDoubleList() || a.isBoolList()) {
        put(a.isIntList() ? 'I' : a.isDoubleList() ? 'D' : 'B');
        put(a.toListRef().size());
        for (const c10::IValue& e : a.toListRef()) {
          if (e.isInt()) put(e.toInt());
          if (e.isDouble()) put(e.toDouble());
          if (e.isBool()) put(e.toBool());
        }
      } else if (a.isDevice()) {
        put('v');
        put(static_cast<int16_t>(a.toDevice().type()));
        put(a.toDevice().index());
      } else {
        return false;
      }
    }
    return true;
  }

  /// execute, memoized for graphs without in-place ops: a deep model's layers run the same ops on
  /// the same shapes, and the dispatcher (or a failed meta kernel's exception and the shape
  /// function after it) is most of interpreting an op. The outputs are shared between the calls:
  /// nothing changes a meta tensor once no op mutates, and interpretation makes new lists rather
  /// than changing them.
  Status executeMemoized(tj::Node* node, tj::Stack& stack) {
    // Before the memo, whose key holds only the repeats tensor's metadata, not its value.
    if (repeatInterleaveByKnownCount(node, stack)) return Status::success();
    const c10::FunctionSchema* schema = node->maybeSchema();
    std::string key;
    if (!memoize_ || isVararg(node->kind()) || !schema || node->hasSideEffects() ||
        !memoKey(schema, stack, key))
      return execute(node, stack);
    auto hit = memo_.find(key);
    if (hit != memo_.end()) {
      stack = hit->second;
      return Status::success();
    }
    APC_RETURN_IF_ERROR(execute(node, stack));
    memo_.emplace(std::move(key), stack);
    return Status::success();
  }

  /// Runs the node's operator on the stack; on failure, the registered shape function.
  Status execute(tj::Node* node, tj::Stack& stack) {
    if (isVararg(node->kind())) {
      runVararg(node, stack);
      return Status::success();
    }
    tj::Stack saved = stack;
    std::string first_error;
    try {
      node->getOperation()(stack);
      return Status::success();
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      first_error = torchErrorLine(e);
    }
    stack = std::move(saved);
    if (runHandShapeRule(node, stack)) return Status::success();
    APC_ASSIGN_OR_RETURN(bool ok, runShapeFunction(node, stack));
    if (ok) return Status::success();
    const std::string op = node->kind().toQualString();
    if (isDataDependent(op))
      return unsupported("shape inference failed" + where(node) + ": " + op +
                         "'s output size depends on its input's values, which apc does not know "
                         "when it plans (static shapes only; compute it outside the model or "
                         "with a fixed size, e.g. nonzero_static)");
    // LibTorch's message for an op whose meta kernel is written in Python ends in a paragraph and
    // a link to torch.compile's documentation: one plain line instead.
    if (first_error.find("no fake impl or Meta kernel registered") != std::string::npos)
      first_error = op +
                    " has no shape rule in LibTorch (its meta kernel exists in Python only) nor in "
                    "apc";
    return unsupported("shape inference failed" + where(node) + ": " + first_error);
  }

  /// repeat_interleave.self_Tensor(self, repeats, dim, output_size) whose 0-dim repeats is a size
  /// made a tensor (prim::NumToTensor of a known int: a traced `x.repeat_interleave(t.size(-1))`,
  /// as Hugging Face's batched_mm experts have it): every element repeated that many times, so
  /// the output size follows. False for any other node (the meta kernel then decides).
  bool repeatInterleaveByKnownCount(tj::Node* node, tj::Stack& stack) const {
    if (std::string(node->kind().toQualString()) != "aten::repeat_interleave" ||
        node->inputs().size() != 4 || stack.size() < 4)
      return false;
    tj::Node* producer = node->input(1)->node();
    if (producer->kind() != c10::prim::NumToTensor) return false;
    auto it = slots_.find(producer->input(0));
    if (it == slots_.end() || it->second.data_dependent || !it->second.iv.isInt()) return false;
    const int64_t count = it->second.iv.toInt();
    tj::Stack args(stack.end() - 4, stack.end());
    if (count < 0 || !args[0].isTensor() || !args[1].isTensor() || args[1].toTensor().dim() != 0)
      return false;
    const at::Tensor self = args[0].toTensor();
    std::vector<int64_t> out;
    if (args[2].isNone()) {
      out = {self.numel() * count};
    } else if (args[2].isInt() && self.dim() > 0) {
      int64_t d = args[2].toInt();
      if (d < 0) d += self.dim();
      if (d < 0 || d >= self.dim()) return false;
      out = self.sizes().vec();
      out[static_cast<size_t>(d)] *= count;
    } else {
      return false;
    }
    stack.resize(stack.size() - 4);
    stack.emplace_back(
        at::empty(out, at::TensorOptions().device(at::kMeta).dtype(self.scalar_type())));
    return true;
  }

  /// Ops whose output size depends on the values of their inputs (no shape rule can exist).
  static bool isDataDependent(const std::string& op) {
    return op == "aten::nonzero" || op == "aten::masked_select" || op == "aten::unique" ||
           op == "aten::_unique" || op == "aten::_unique2" || op == "aten::unique_consecutive" ||
           op == "aten::unique_dim" || op == "aten::nonzero_numpy" || op == "aten::argwhere" ||
           op == "aten::repeat_interleave";  // with repeats computed in the model
  }

  /// Shape rules for the few ops that have neither a C++ meta kernel nor a registered shape
  /// function in LibTorch 2.13. Returns false when the node is not one of them.
  static bool runHandShapeRule(tj::Node* node, tj::Stack& stack) {
    std::string op = node->kind().toQualString();
    if ((op == "aten::max" || op == "aten::min") && node->inputs().size() == 1) {
      // max(Tensor) / min(Tensor): the reduction of every element, a 0-dim tensor of self's dtype.
      const c10::IValue& self = stack.back();
      if (!self.isTensor()) return false;
      at::ScalarType dtype = self.toTensor().scalar_type();
      stack.pop_back();
      stack.emplace_back(at::empty({}, at::TensorOptions().device(at::kMeta).dtype(dtype)));
      return true;
    }
    if (op == "aten::floor_divide" && node->inputs().size() == 2) {
      // floor_divide(Tensor, Tensor | Scalar): broadcast shape, promoted dtype.
      tj::Stack args(stack.end() - 2, stack.end());
      if (!args[0].isTensor()) return false;
      const at::Tensor& a = args[0].toTensor();
      std::vector<int64_t> out = a.sizes().vec();
      at::ScalarType dtype;
      if (args[1].isTensor()) {
        const at::Tensor& b = args[1].toTensor();
        out = at::infer_size(a.sizes(), b.sizes());
        dtype = at::result_type(a, b);
      } else if (args[1].isScalar()) {
        dtype = at::result_type(a, args[1].toScalar());
      } else {
        return false;
      }
      stack.resize(stack.size() - 2);
      stack.emplace_back(at::empty(out, at::TensorOptions().device(at::kMeta).dtype(dtype)));
      return true;
    }
    if (op == "aten::group_norm" && node->inputs().size() == 6) {
      // group_norm(input, num_groups, weight?, bias?, eps, cudnn_enabled): input's shape and dtype.
      tj::Stack args(stack.end() - 6, stack.end());
      if (!args[0].isTensor()) return false;
      const at::Tensor& x = args[0].toTensor();
      stack.resize(stack.size() - 6);
      stack.emplace_back(
          at::empty(x.sizes(), at::TensorOptions().device(at::kMeta).dtype(x.scalar_type())));
      return true;
    }
    if (op == "aten::histc" && node->inputs().size() == 4) {
      // histc(self, bins, min, max) -> [bins], self's dtype (mixture-of-experts token counts).
      tj::Stack args(stack.end() - 4, stack.end());
      if (!args[0].isTensor() || !args[1].isInt() || args[1].toInt() < 0) return false;
      const at::ScalarType dtype = args[0].toTensor().scalar_type();
      const int64_t bins = args[1].toInt();
      stack.resize(stack.size() - 4);
      stack.emplace_back(at::empty({bins}, at::TensorOptions().device(at::kMeta).dtype(dtype)));
      return true;
    }
    if (op == "aten::_grouped_mm" && node->inputs().size() == 5) {
      // _grouped_mm(self, mat2, offs, bias, out_dtype): [M, K] x [G, K, N] -> [M, N] (with offs);
      // [G, M, K] x [G, K, N] -> [G, M, N]; out_dtype or self's dtype.
      tj::Stack args(stack.end() - 5, stack.end());
      if (!args[0].isTensor() || !args[1].isTensor()) return false;
      const at::Tensor a = args[0].toTensor(), b = args[1].toTensor();
      std::vector<int64_t> out;
      if (a.dim() == 2 && b.dim() == 3 && a.size(1) == b.size(1))
        out = {a.size(0), b.size(2)};
      else if (a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1))
        out = {a.size(0), a.size(1), b.size(2)};
      else
        return false;
      const at::ScalarType dtype =
          args[4].isInt() ? static_cast<at::ScalarType>(args[4].toInt()) : a.scalar_type();
      stack.resize(stack.size() - 5);
      stack.emplace_back(at::empty(out, at::TensorOptions().device(at::kMeta).dtype(dtype)));
      return true;
    }
    if (op == "aten::scaled_dot_product_attention") {
      // (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> query's shape
      // with value's last dim, query's dtype.
      size_t n = node->inputs().size();
      tj::Stack args(stack.end() - static_cast<long>(n), stack.end());
      if (n < 3 || !args[0].isTensor() || !args[2].isTensor()) return false;
      at::Tensor q = args[0].toTensor(), v = args[2].toTensor();
      if (q.dim() < 2 || v.dim() < 1) return false;
      std::vector<int64_t> out = q.sizes().vec();
      out.back() = v.size(-1);
      stack.resize(stack.size() - n);
      stack.emplace_back(
          at::empty(out, at::TensorOptions().device(at::kMeta).dtype(q.scalar_type())));
      return true;
    }
    if (op == "aten::roll" || op == "aten::flip") {
      // (self, ...) -> self's shape and dtype.
      size_t n = node->inputs().size();
      tj::Stack args(stack.end() - static_cast<long>(n), stack.end());
      if (n < 1 || !args[0].isTensor()) return false;
      at::Tensor self = args[0].toTensor();
      stack.resize(stack.size() - n);
      stack.emplace_back(
          at::empty(self.sizes(), at::TensorOptions().device(at::kMeta).dtype(self.scalar_type())));
      return true;
    }
    if (op == "aten::_convolution" || op == "aten::convolution" || op == "aten::conv2d" ||
        op == "aten::conv1d" || op == "aten::conv3d") {
      // (input, weight, bias, stride, padding, dilation, [transposed, output_padding,] groups, ...)
      size_t n = node->inputs().size();
      tj::Stack args(stack.end() - static_cast<long>(n), stack.end());
      if (!args[0].isTensor() || !args[1].isTensor() || !args[3].isIntList() ||
          !args[4].isIntList() || !args[5].isIntList())
        return false;
      bool full_form = op == "aten::_convolution" || op == "aten::convolution";
      if (full_form && args[6].isBool() && args[6].toBool())
        return false;  // transposed: not handled
      at::Tensor input = args[0].toTensor(), weight = args[1].toTensor();
      auto stride = args[3].toIntVector(), padding = args[4].toIntVector(),
           dilation = args[5].toIntVector();
      int64_t spatial = input.dim() - 2;
      if (spatial < 1 || weight.dim() != input.dim()) return false;
      auto at = [](const std::vector<int64_t>& v, int64_t i) {
        return v.size() == 1 ? v[0] : v.at(i);
      };
      std::vector<int64_t> out = {input.size(0), weight.size(0)};
      for (int64_t i = 0; i < spatial; ++i) {
        int64_t k = weight.size(2 + i);
        out.push_back((input.size(2 + i) + 2 * at(padding, i) - at(dilation, i) * (k - 1) - 1) /
                          at(stride, i) +
                      1);
      }
      stack.resize(stack.size() - n);
      stack.emplace_back(
          at::empty(out, at::TensorOptions().device(at::kMeta).dtype(input.scalar_type())));
      return true;
    }
    return false;
  }

  /// Output dtype of an op that ran through its shape function.
  static at::ScalarType inferDtype(tj::Node* node, const tj::Stack& args) {
    std::string op = node->kind().toQualString();
    if (op == "aten::embedding") return args.at(0).toTensor().scalar_type();
    if (op == "aten::where" && args.size() >= 3 && args[1].isTensor() && args[2].isTensor())
      return at::promoteTypes(args[1].toTensor().scalar_type(), args[2].toTensor().scalar_type());
    if (op == "aten::eq" || op == "aten::ne" || op == "aten::lt" || op == "aten::gt" ||
        op == "aten::le" || op == "aten::ge")
      return at::kBool;
    for (const auto& a : args)
      if (a.isTensor()) return a.toTensor().scalar_type();
    return at::kFloat;
  }

  Expected<bool> runShapeFunction(tj::Node* node, tj::Stack& stack) {
    const c10::FunctionSchema* schema = node->maybeSchema();
    if (!schema) return false;
    auto it = shape_codes_.find(schema);
    if (it == shape_codes_.end()) {
      std::shared_ptr<tj::Code> code;
      size_t n_inputs = 0;
      if (auto sg = tj::shapeComputeGraphForSchema(*schema)) {
        code = std::make_shared<tj::Code>(*sg, "shape_" + schema->name());
        n_inputs = (*sg)->inputs().size();
      }
      it = shape_codes_.emplace(schema, std::make_pair(code, n_inputs)).first;
    }
    auto [code, n_inputs] = it->second;
    if (!code) return false;
    size_t n_args = node->inputs().size();
    tj::Stack args(stack.end() - static_cast<long>(n_args), stack.end());
    stack.resize(stack.size() - n_args);
    tj::Stack shape_stack;
    for (size_t i = 0; i < n_args && i < n_inputs; ++i) {
      if (args[i].isTensor())
        shape_stack.emplace_back(c10::List<int64_t>(args[i].toTensor().sizes().vec()));
      else
        shape_stack.push_back(args[i]);
    }
    try {
      tj::InterpreterState state(*code);
      state.run(shape_stack);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return unsupported("shape function failed" + where(node) + ": " + torchErrorLine(e));
    }
    if (shape_stack.empty()) return false;
    at::ScalarType dtype = inferDtype(node, args);
    auto meta = [&](const c10::IValue& sizes) {
      return at::empty(sizes.toIntVector(), at::TensorOptions().device(at::kMeta).dtype(dtype));
    };
    const c10::IValue& result = shape_stack.back();
    if (result.isTuple()) {
      for (const auto& e : result.toTupleRef().elements()) stack.emplace_back(meta(e));
    } else {
      stack.emplace_back(meta(result));
    }
    return true;
  }

  Status interpretOp(tj::Node* node) {
    // Unpacking a tuple built in the forward (scripted MultiheadAttention returns
    // `(attn_output, None)` and its caller takes `[0]`): the elements themselves.
    if ((node->kind() == c10::prim::TupleUnpack || node->kind() == c10::prim::TupleIndex) &&
        slots_.count(node->input(0)) && slots_.at(node->input(0)).tuple_elements) {
      std::shared_ptr<const std::vector<Slot>> elems = slots_.at(node->input(0)).tuple_elements;
      if (node->kind() == c10::prim::TupleUnpack && node->outputs().size() == elems->size()) {
        for (size_t k = 0; k < elems->size(); ++k) slots_[node->outputs()[k]] = (*elems)[k];
        return Status::success();
      }
      if (node->kind() == c10::prim::TupleIndex && slots_.count(node->input(1)) &&
          slots_.at(node->input(1)).iv.isInt()) {
        int64_t i = slots_.at(node->input(1)).iv.toInt();
        int64_t n = static_cast<int64_t>(elems->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          slots_[node->output()] = (*elems)[static_cast<size_t>(i)];
          return Status::success();
        }
      }
    }
    tj::Stack stack;
    bool tainted = false;
    bool grad = false;
    std::vector<ir::ValueId> in_ids;
    for (tj::Value* in : node->inputs()) {
      auto it = slots_.find(in);
      if (it == slots_.end())
        return internalError("value %" + in->debugName() + " undefined" + where(node));
      if (it->second.data_dependent)
        return unsupported("value %" + in->debugName() +
                           " depends on tensor values (data-dependent shapes or " +
                           "control flow are not supported)" + where(node));
      stack.push_back(it->second.iv);
      tainted |= it->second.tainted;
      APC_ASSIGN_OR_RETURN(ir::ValueId id, valueIdOf(in));
      in_ids.push_back(id);
      const ir::Value& v = out_.value(id);
      if (v.tensor) grad |= v.tensor->requires_grad;
      for (const auto& e : v.elements) grad |= e.requires_grad;
    }
    if (node->kind() == c10::aten::detach) grad = false;
    Status ran = [&] {
      c10::InferenceMode guard;
      return executeMemoized(node, stack);
    }();
    if (!ran.ok()) {
      // Reading a scalar out of a meta tensor (aten::Bool, aten::Int, item) cannot work: the value
      // depends on data. Keep it as unknown; whatever consumes it reports the problem.
      bool scalar_outputs = !node->outputs().empty();
      for (tj::Value* o : node->outputs())
        scalar_outputs &= o->type()->kind() == c10::TypeKind::BoolType ||
                          o->type()->kind() == c10::TypeKind::IntType ||
                          o->type()->kind() == c10::TypeKind::FloatType ||
                          o->type()->kind() == c10::TypeKind::NumberType;
      if (!scalar_outputs) return ran;
      for (tj::Value* o : node->outputs()) {
        Slot s;
        s.data_dependent = true;
        s.tainted = true;
        slots_[o] = s;
      }
      return Status::success();
    }
    size_t n_out = node->outputs().size();
    if (stack.size() != n_out)
      return internalError("operator produced " + std::to_string(stack.size()) + " values for " +
                           std::to_string(n_out) + " outputs" + where(node));
    ir::Node n;
    n.op = node->kind().toQualString();
    if (const auto* schema = node->maybeSchema()) n.overload = schema->overload_name();
    n.inputs = std::move(in_ids);
    n.module_path = modulePathOf(node);
    n.source = sourceOf(node);
    for (size_t i = 0; i < n_out; ++i) {
      c10::IValue iv = stack[i];
      ir::Value v;
      v.debug_name = node->outputs()[i]->debugName();
      if (iv.isTensor()) {
        at::Tensor t = iv.toTensor();
        if (t.dim() > 0 && !t.is_meta()) t = metaLike(t);
        iv = t;
        v.type = ir::ValueType::kTensor;
        v.tensor = metaOf(t, grad && at::isFloatingType(t.scalar_type()));
      } else {
        auto [type, constant] = describe(iv);
        v.type = type;
        v.constant = constant;
        if (iv.isTensorList()) {
          c10::List<at::Tensor> list = iv.toTensorList();
          c10::List<at::Tensor> meta_list;
          for (at::Tensor t : list) {
            if (t.dim() > 0 && !t.is_meta()) t = metaLike(t);
            meta_list.push_back(t);
            v.elements.push_back(metaOf(t, grad && at::isFloatingType(t.scalar_type())));
          }
          iv = meta_list;
        } else if (isTensorsOnlyOptionalList(iv)) {
          // `Tensor?[]` (aten::index's indices) holding tensors only: a Tensor[] to the planner,
          // so rules place its tensors; the runtime re-types it at the call.
          c10::List<std::optional<at::Tensor>> meta_list;
          for (const c10::IValue& e : iv.toListRef()) {
            at::Tensor t = e.toTensor();
            if (t.dim() > 0 && !t.is_meta()) t = metaLike(t);
            meta_list.push_back(t);
            v.elements.push_back(metaOf(t, grad && at::isFloatingType(t.scalar_type())));
          }
          v.type = ir::ValueType::kTensorList;
          v.constant.reset();
          iv = meta_list;
        }
      }
      n.outputs.push_back(out_.addValue(std::move(v)));
      Slot s;
      s.iv = iv;
      s.id = n.outputs.back();
      s.tainted = tainted;
      if (node->kind() == c10::prim::TupleConstruct) {
        auto elems = std::make_shared<std::vector<Slot>>();
        for (tj::Value* in : node->inputs()) elems->push_back(slots_.at(in));
        s.tuple_elements = std::move(elems);
      }
      slots_[node->outputs()[i]] = s;
    }
    out_.addNode(std::move(n));
    return Status::success();
  }

  tj::Module module_;
  std::vector<InputSpec> inputs_;
  std::vector<std::optional<c10::IValue>> defaults_;
  std::shared_ptr<tj::Graph> graph_;
  ir::Graph out_;
  /// TorchScript nodes interpreted so far (loop bodies once per trip), at most
  /// ImportOptions::max_interpreted_nodes.
  int64_t max_interpreted_nodes_;
  int64_t interpreted_ = 0;
  std::unordered_map<const tj::Value*, Slot> slots_;
  std::map<std::string, ir::ValueId> tensor_nodes_;
  std::unordered_set<const tj::Node*> structural_;
  std::unordered_map<const tj::InlinedCallStack*, std::string> module_paths_;
  std::map<std::tuple<const c10::ivalue::Object*, std::string, const c10::ClassType*>,
           std::pair<std::string, c10::intrusive_ptr<c10::ivalue::Object>>>
      submodules_;
  std::unordered_map<const c10::FunctionSchema*, std::pair<std::shared_ptr<tj::Code>, size_t>>
      shape_codes_;
  bool memoize_meta_ = true;  // ImportOptions::memoize_meta
  bool memoize_ = false;      // memoize_meta_, and the graph has no in-place op
  std::unordered_map<std::string, tj::Stack> memo_;  // executeMemoized's
};

/// Whether some node of `block` (nested blocks included) has a mutating schema (`Tensor(a!)`).
bool hasMutatingOp(tj::Block* block) {
  for (tj::Node* n : block->nodes()) {
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (schema && schema->is_mutable()) return true;
    for (tj::Block* b : n->blocks())
      if (hasMutatingOp(b)) return true;
  }
  return false;
}

struct Loaded {
  tj::Module module;
  std::vector<InputSpec> recorded;  // names always; dtype/shape empty when unknown
  std::vector<bool> known;          // whether recorded[i] has a shape
  // recorded[i]'s declared default when it is not a tensor input (None, a number, a bool):
  // used when no shape is given or recorded for it.
  std::vector<std::optional<c10::IValue>> defaults;
};

Expected<Loaded> loadArchive(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return notFound("model file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec))
    return invalidArgument("model path '" + path + "' is a directory, not a TorchScript archive");
  APC_RETURN_IF_ERROR(checkRegularFile(path));  // a FIFO or a device: the loader would block
  Loaded l;
  tj::ExtraFilesMap extra{{"apc_inputs.json", ""}};
  try {
    l.module = loadScriptModule(path, extra);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path + "' is not a readable TorchScript archive (" + torchErrorLine(e) +
                      ")");
  }
  auto method = l.module.find_method("forward");
  if (!method) return unsupported("'" + path + "' has no forward method");
  const auto& args = method->function().getSchema().arguments();
  std::vector<std::string> names;
  for (size_t i = 1; i < args.size(); ++i) names.push_back(args[i].name());
  APC_ASSIGN_OR_RETURN(auto recorded, parseRecordedInputs(extra["apc_inputs.json"], names, path));
  auto graph_inputs = method->graph()->inputs();
  for (size_t i = 1; i < args.size(); ++i) {
    InputSpec spec;
    spec.name = args[i].name();
    bool known = false;
    if (recorded[i - 1]) {
      spec = *recorded[i - 1];
      known = true;
    }
    if (!known && i < graph_inputs.size()) {
      if (auto tt = graph_inputs[i]->type()->cast<c10::TensorType>()) {
        auto sizes = tt->sizes().concrete_sizes();
        if (sizes && tt->scalarType()) {
          spec.dtype = dtypeOf(*tt->scalarType());
          spec.shape = ir::makeShape(*sizes);
          known = true;
        }
      }
    }
    l.recorded.push_back(spec);
    l.known.push_back(known);
    const auto& dv = args[i].default_value();
    l.defaults.push_back(dv && !dv->isTensor() ? dv : std::nullopt);
  }
  return l;
}

/// Symbolic propagation (only when some input has a symbolic dim; static imports are untouched).
/// For each symbol, the graph is interpreted a second time with that symbol's hint doubled; every
/// tensor dim (of a value or of a tensor-list element) whose size differs between the two runs
/// becomes that symbol, with the first run's size as hint (ir::Dim::per_symbol: size / hint of the
/// symbol when the size doubled with it, else 0). Int constants that differ (aten::size of
/// a dynamic dim and arithmetic on it) keep the hint as their constant: lowering recomputes the
/// size lists and arange bounds such ints build from the output's symbolic dims at run time
/// (apc/lower/local_rewrite.h); other consumers of such ints stay at the hint.
/// Both runs must give graphs of the same structure, else the dims stay static.
template <typename Interpret>
Status propagateSymbols(ir::Graph& g, const std::vector<InputSpec>& inputs, Interpret&& interpret) {
  std::vector<std::string> symbols;
  for (const InputSpec& s : inputs)
    for (const ir::Dim& d : s.shape)
      if (d.isSymbolic() && std::find(symbols.begin(), symbols.end(), d.symbol) == symbols.end())
        symbols.push_back(d.symbol);
  for (const std::string& sym : symbols) {
    int64_t hint = 0;  // the symbol's value in the first run
    for (const InputSpec& s : inputs)
      for (const ir::Dim& d : s.shape)
        if (d.symbol == sym && hint == 0) hint = d.size;
    std::vector<InputSpec> changed = inputs;
    for (InputSpec& s : changed)
      for (ir::Dim& d : s.shape)
        if (d.symbol == sym) d.size *= 2;
    APC_ASSIGN_OR_RETURN(ir::Graph h, interpret(changed));
    if (h.numValues() != g.numValues() || h.numNodes() != g.numNodes()) continue;
    auto mark = [&](ir::TensorMeta& a, const ir::TensorMeta& b) {
      if (a.shape.size() != b.shape.size()) return;
      for (size_t d = 0; d < a.shape.size(); ++d)
        if (!a.shape[d].isSymbolic() && a.shape[d].size != b.shape[d].size) {
          // Proportional to the symbol when doubling it doubled the size (B, B*T with T
          // static); else another function of it (B+1).
          const int64_t n = a.shape[d].size;
          const bool proportional = hint > 0 && b.shape[d].size == 2 * n && n % hint == 0;
          a.shape[d] = ir::Dim::symbolic(sym, n, proportional ? n / hint : 0);
        }
    };
    for (size_t i = 0; i < g.numValues(); ++i) {
      ir::Value& a = g.value(ir::ValueId(static_cast<uint32_t>(i)));
      const ir::Value& b = h.value(ir::ValueId(static_cast<uint32_t>(i)));
      if (a.tensor && b.tensor) mark(*a.tensor, *b.tensor);
      if (a.elements.size() == b.elements.size())
        for (size_t e = 0; e < a.elements.size(); ++e) mark(a.elements[e], b.elements[e]);
    }
  }
  return Status::success();
}

}  // namespace

Expected<std::vector<InputSpec>> recordedInputs(const std::string& path) {
  APC_ASSIGN_OR_RETURN(Loaded l, loadArchive(path));
  return l.recorded;
}

Expected<ir::Graph> importTorchScript(const std::string& path, const ImportOptions& options,
                                      ImportTimings* timings) {
  auto t0 = std::chrono::steady_clock::now();
  APC_ASSIGN_OR_RETURN(Loaded l, loadArchive(path));
  if (timings) timings->load_s = secondsSince(t0);

  // Resolve input shapes: overrides by name, else recorded.
  std::vector<InputSpec> inputs = l.recorded;
  std::string names = joinMap(l.recorded, ", ", [](const InputSpec& s) { return s.name; });
  std::vector<bool> given(inputs.size(), false);
  for (const InputSpec& o : options.inputs) {
    size_t i = 0;
    while (i < inputs.size() && inputs[i].name != o.name) ++i;
    if (i == inputs.size())
      return invalidArgument("unknown input '" + o.name +
                             "'; the model's inputs are: " + (names.empty() ? "(none)" : names));
    if (l.known[i]) {
      if (o.shape.size() != inputs[i].shape.size())
        return invalidArgument("input '" + o.name + "' has rank " +
                               std::to_string(inputs[i].shape.size()) + " in the model (" +
                               toString(inputs[i]) + ") but rank " +
                               std::to_string(o.shape.size()) + " was given");
      if (o.dtype != inputs[i].dtype)
        return invalidArgument("input '" + o.name + "' has dtype " +
                               ir::dtypeName(inputs[i].dtype) + " in the model but " +
                               ir::dtypeName(o.dtype) + " was given");
    }
    inputs[i] = o;
    given[i] = true;
  }
  // An input neither given nor recorded takes its declared default when it has one.
  std::vector<std::optional<c10::IValue>> defaults(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!given[i] && !l.known[i] && l.defaults[i]) defaults[i] = l.defaults[i];
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!given[i] && !l.known[i] && !defaults[i])
      return invalidArgument("the shape of input '" + inputs[i].name +
                             "' is not recorded in the model; give it with --input " +
                             inputs[i].name + ":dtype[d0,d1,...]");

  auto t1 = std::chrono::steady_clock::now();
  std::shared_ptr<tj::Graph> graph;
  try {
    graph = l.module.get_method("forward").graph()->copy();
    tj::Inline(*graph);
    // Without a mutating op, dead code elimination without alias analysis removes the same
    // nodes (alias analysis only lets it drop writes to dead values), and building the AliasDb
    // was half of the pass: 0.025 of 0.045 s on a 126-layer LLaMA.
    if (hasMutatingOp(graph->block()))
      tj::EliminateDeadCode(graph);
    else
      tj::EliminateDeadCode(graph->block());
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return unsupported("cannot inline the forward of '" + path + "': " + torchErrorLine(e));
  }
  if (timings) timings->inline_s = secondsSince(t1);

  auto t2 = std::chrono::steady_clock::now();
  auto interpret = [&](const std::vector<InputSpec>& specs) -> Expected<ir::Graph> {
    auto importer = std::make_unique<Importer>(l.module, specs, defaults, options.memoize_meta,
                                               options.max_interpreted_nodes);
    Expected<ir::Graph> result = [&]() -> Expected<ir::Graph> {
      try {
        return importer->run(graph);
      } catch (const std::exception& e) {
        rethrowIfOutOfMemory(e);
        return unsupported("import failed: " + torchErrorLine(e));
      }
    }();
    // Its meta tensors, one per value, go to the caller's sink too (ImportOptions::keep).
    if (options.keep) options.keep(std::shared_ptr<Importer>(std::move(importer)));
    return result;
  };
  Expected<ir::Graph> g = interpret(inputs);
  if (!g.ok()) return g;
  APC_RETURN_IF_ERROR(propagateSymbols(*g, inputs, interpret));
  APC_RETURN_IF_ERROR(functionalizeInPlace(*g, torchSchemaAliasing));
  g->name = std::filesystem::path(path).stem().string();
  if (timings) timings->interpret_s = secondsSince(t2);
  if (options.keep) {
    options.keep(std::move(graph));
    options.keep(std::make_shared<tj::Module>(std::move(l.module)));
  }
  return g;
}

}  // namespace apc::frontend
