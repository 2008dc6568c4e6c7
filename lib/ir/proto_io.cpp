//===- lib/ir/proto_io.cpp - Protobuf (de)serialization of graphs ----------===//
#include "apc/ir/proto_io.h"

#include "apc/support/file_io.h"

#include <fstream>
#include <sstream>

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "apc.pb.h"

namespace apc::ir {

namespace {

constexpr std::pair<ValueType, const char*> kTypeNames[] = {
    {ValueType::kTensor, "tensor"},       {ValueType::kInt, "int"},
    {ValueType::kFloat, "float"},         {ValueType::kBool, "bool"},
    {ValueType::kString, "str"},          {ValueType::kDevice, "device"},
    {ValueType::kNone, "none"},           {ValueType::kIntList, "int[]"},
    {ValueType::kFloatList, "float[]"},   {ValueType::kBoolList, "bool[]"},
    {ValueType::kTensorList, "Tensor[]"}, {ValueType::kTuple, "tuple"},
    {ValueType::kOther, "other"},
};
constexpr std::pair<NodeKind, const char*> kKindNames[] = {{NodeKind::kInput, "input"},
                                                           {NodeKind::kParameter, "parameter"},
                                                           {NodeKind::kBuffer, "buffer"},
                                                           {NodeKind::kOp, "op"}};
constexpr std::pair<OutputTree::Kind, const char*> kTreeNames[] = {
    {OutputTree::Kind::kLeaf, "leaf"},
    {OutputTree::Kind::kTuple, "tuple"},
    {OutputTree::Kind::kList, "list"},
    {OutputTree::Kind::kDict, "dict"}};

template <typename E, size_t N>
const char* nameOf(const std::pair<E, const char*> (&table)[N], E e) {
  for (const auto& [k, n] : table)
    if (k == e) return n;
  return "";
}
template <typename E, size_t N>
std::optional<E> fromName(const std::pair<E, const char*> (&table)[N], const std::string& s) {
  for (const auto& [k, n] : table)
    if (s == n) return k;
  return std::nullopt;
}

void toProto(const TensorMeta& t, proto::TensorMeta* p) {
  for (const Dim& d : t.shape) {
    proto::Dim* pd = p->add_shape();
    pd->set_size(d.size);
    pd->set_symbol(d.symbol);
    // Written only where it says more than the default (a bare symbol), so that graphs without
    // such dims serialize as before.
    if (d.isSymbolic() && d.per_symbol != 1) pd->set_per_symbol(d.per_symbol);
  }
  p->set_dtype(dtypeName(t.dtype));
  p->set_requires_grad(t.requires_grad);
}

Expected<TensorMeta> fromProto(const proto::TensorMeta& p) {
  TensorMeta t;
  for (const auto& d : p.shape())
    t.shape.push_back(Dim{d.size(), d.symbol(), d.has_per_symbol() ? d.per_symbol() : 1});
  if (p.dtype() == "?") {
    t.dtype = DType::kUnknown;
  } else {
    auto dt = parseDType(p.dtype());
    if (!dt) return parseError("unknown dtype '" + p.dtype() + "'");
    t.dtype = *dt;
  }
  t.requires_grad = p.requires_grad();
  return t;
}

void toProto(const Constant& c, proto::Constant* p) {
  struct V {
    proto::Constant* p;
    void operator()(const None&) const { p->set_none(true); }
    void operator()(int64_t v) const { p->set_i(v); }
    void operator()(double v) const { p->set_f(v); }
    void operator()(bool v) const { p->set_b(v); }
    void operator()(const std::string& v) const { p->set_s(v); }
    void operator()(const std::vector<int64_t>& v) const {
      auto* l = p->mutable_ints();
      for (auto x : v) l->add_v(x);
    }
    void operator()(const std::vector<double>& v) const {
      auto* l = p->mutable_floats();
      for (auto x : v) l->add_v(x);
    }
    void operator()(const std::vector<bool>& v) const {
      auto* l = p->mutable_bools();
      for (bool x : v) l->add_v(x);
    }
  };
  std::visit(V{p}, c);
}

Constant fromProto(const proto::Constant& p) {
  switch (p.value_case()) {
    case proto::Constant::kI:
      return p.i();
    case proto::Constant::kF:
      return p.f();
    case proto::Constant::kB:
      return p.b();
    case proto::Constant::kS:
      return p.s();
    case proto::Constant::kInts:
      return std::vector<int64_t>(p.ints().v().begin(), p.ints().v().end());
    case proto::Constant::kFloats:
      return std::vector<double>(p.floats().v().begin(), p.floats().v().end());
    case proto::Constant::kBools:
      return std::vector<bool>(p.bools().v().begin(), p.bools().v().end());
    default:
      return None{};
  }
}

void toProto(const OutputTree& t, proto::OutputTree* p) {
  p->set_kind(nameOf(kTreeNames, t.kind));
  if (t.kind == OutputTree::Kind::kLeaf) p->set_leaf(t.leaf.v);
  for (const auto& k : t.keys) p->add_keys(k);
  for (const auto& c : t.children) toProto(c, p->add_children());
}

Expected<OutputTree> fromProto(const proto::OutputTree& p, int depth = 0) {
  if (depth > 64) return parseError("output tree nested too deeply");
  OutputTree t;
  auto kind = fromName(kTreeNames, p.kind());
  if (!kind) return parseError("unknown output tree kind '" + p.kind() + "'");
  t.kind = *kind;
  if (t.kind == OutputTree::Kind::kLeaf) t.leaf = ValueId(p.leaf());
  t.keys.assign(p.keys().begin(), p.keys().end());
  for (const auto& c : p.children()) {
    APC_ASSIGN_OR_RETURN(OutputTree child, fromProto(c, depth + 1));
    t.children.push_back(std::move(child));
  }
  if (t.kind == OutputTree::Kind::kDict && t.keys.size() != t.children.size())
    return parseError("dict output has " + std::to_string(t.keys.size()) + " keys for " +
                      std::to_string(t.children.size()) + " values");
  return t;
}

}  // namespace

std::string serializeGraph(const Graph& g) {
  // On an arena: a 126-layer LLaMA's message is some 200,000 small objects, whose one-by-one
  // allocation and freeing took most of this function's time.
  google::protobuf::Arena arena;
  proto::Graph& p = *google::protobuf::Arena::CreateMessage<proto::Graph>(&arena);
  p.set_format_version(kGraphFormatVersion);
  p.set_name(g.name);
  for (const Value& v : g.values()) {
    proto::Value* pv = p.add_values();
    pv->set_type(nameOf(kTypeNames, v.type));
    pv->set_debug_name(v.debug_name);
    if (v.tensor) {
      toProto(*v.tensor, pv->mutable_tensor());
    }
    for (const TensorMeta& e : v.elements) toProto(e, pv->add_elements());
    if (v.constant) {
      toProto(*v.constant, pv->mutable_constant());
    }
    pv->set_producer(v.producer.valid() ? static_cast<int64_t>(v.producer.v) : -1);
    pv->set_producer_output(v.producer_output);
  }
  for (const Node& n : g.nodes()) {
    proto::Node* pn = p.add_nodes();
    pn->set_kind(nameOf(kKindNames, n.kind));
    pn->set_op(n.op);
    pn->set_overload(n.overload);
    pn->set_name(n.name);
    for (ValueId v : n.inputs) pn->add_inputs(v.v);
    for (ValueId v : n.outputs) pn->add_outputs(v.v);
    pn->set_module_path(n.module_path);
    pn->set_source(n.source);
  }
  toProto(g.outputs(), p.mutable_outputs());
  std::string out;
  google::protobuf::io::StringOutputStream sos(&out);
  google::protobuf::io::CodedOutputStream cos(&sos);
  cos.SetSerializationDeterministic(true);
  p.SerializeToCodedStream(&cos);
  cos.Trim();
  return out;
}

Expected<Graph> deserializeGraph(const std::string& bytes) {
  google::protobuf::Arena arena;
  proto::Graph& p = *google::protobuf::Arena::CreateMessage<proto::Graph>(&arena);
  if (!p.ParseFromString(bytes)) return parseError("not a valid apc graph (protobuf parse failed)");
  if (p.format_version() != kGraphFormatVersion)
    return parseError("graph format version " + std::to_string(p.format_version()) +
                      " is not supported (expected " + std::to_string(kGraphFormatVersion) + ")");
  Graph g;
  g.name = p.name();
  const auto num_nodes = static_cast<int64_t>(p.nodes_size());
  const auto num_values = static_cast<uint32_t>(p.values_size());
  for (const auto& pv : p.values()) {
    Value v;
    auto type = fromName(kTypeNames, pv.type());
    if (!type) return parseError("unknown value type '" + pv.type() + "'");
    v.type = *type;
    v.debug_name = pv.debug_name();
    if (pv.has_tensor()) {
      APC_ASSIGN_OR_RETURN(TensorMeta t, fromProto(pv.tensor()));
      v.tensor = std::move(t);
    }
    for (const auto& e : pv.elements()) {
      APC_ASSIGN_OR_RETURN(TensorMeta t, fromProto(e));
      v.elements.push_back(std::move(t));
    }
    if (pv.has_constant()) v.constant = fromProto(pv.constant());
    if (pv.producer() >= num_nodes || pv.producer() < -1)
      return parseError("value %" + v.debug_name + " names producer " +
                        std::to_string(pv.producer()) + " of " + std::to_string(num_nodes) +
                        " nodes");
    g.addValue(std::move(v));
  }
  for (const auto& pn : p.nodes()) {
    Node n;
    auto kind = fromName(kKindNames, pn.kind());
    if (!kind) return parseError("unknown node kind '" + pn.kind() + "'");
    n.kind = *kind;
    n.op = pn.op();
    n.overload = pn.overload();
    n.name = pn.name();
    for (uint32_t v : pn.inputs()) {
      if (v >= num_values)
        return parseError("node " + n.op + " uses value " + std::to_string(v) + " out of range");
      n.inputs.push_back(ValueId(v));
    }
    for (uint32_t v : pn.outputs()) {
      if (v >= num_values)
        return parseError("node " + n.op + " has output " + std::to_string(v) + " out of range");
      n.outputs.push_back(ValueId(v));
    }
    n.module_path = pn.module_path();
    n.source = pn.source();
    g.addNode(std::move(n));
  }
  // addNode set producers from node outputs; check they agree with the recorded ones.
  for (int i = 0; i < p.values_size(); ++i) {
    const Value& v = g.value(ValueId(static_cast<uint32_t>(i)));
    int64_t recorded = p.values(i).producer();
    int64_t actual = v.producer.valid() ? static_cast<int64_t>(v.producer.v) : -1;
    if (recorded != actual)
      return parseError("value %" + v.debug_name + " records producer " + std::to_string(recorded) +
                        " but node outputs say " + std::to_string(actual));
  }
  APC_ASSIGN_OR_RETURN(OutputTree outputs, fromProto(p.outputs()));
  g.setOutputs(std::move(outputs));
  APC_RETURN_IF_ERROR(g.verify());
  return g;
}

Status writeGraphFile(const Graph& g, const std::string& path) {
  return writeFileAtomic(path, serializeGraph(g));
}

Expected<Graph> readGraphFile(const std::string& path) {
  APC_ASSIGN_OR_RETURN(std::string bytes, readInputFile(path));
  auto g = deserializeGraph(bytes);
  if (!g.ok()) return g.error().withContext(path);
  return g;
}

Expected<Graph> deserializeProgramGraph(const std::string& bytes) {
  proto::Graph g;
  if (!g.ParseFromString(bytes))
    return parseError("not a valid apc program graph (protobuf parse failed)");
  for (proto::Node& n : *g.mutable_nodes())
    if (n.kind() == "redistribute") n.set_kind("op");
  if (g.format_version() == 0) g.set_format_version(kGraphFormatVersion);
  return deserializeGraph(g.SerializeAsString());
}

}  // namespace apc::ir
