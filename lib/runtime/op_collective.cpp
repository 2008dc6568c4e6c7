//===- lib/runtime/op_collective.cpp - Running an op's local graph ---------===//
#include "apc/runtime/op_collective.h"

#include <c10/util/Exception.h>

#include "apc/ir/op_collective.h"

namespace apc::runtime {

Expected<OpCollectiveRunner> OpCollectiveRunner::create(ir::Graph local, size_t num_inputs,
                                                        size_t num_outputs,
                                                        const InterpreterOptions& options) {
  APC_RETURN_IF_ERROR(ir::checkLocalGraph(local, num_inputs, num_outputs));
  OpCollectiveRunner r;
  std::vector<bool> external(local.numNodes(), false);
  r.arg_of_node_.assign(local.numNodes(), -1);
  r.all_reduce_of_node_.assign(local.numNodes(), -1);
  int next_arg = 0;
  for (const ir::Node& n : local.nodes()) {
    if (n.kind == ir::NodeKind::kInput) r.arg_of_node_[n.id.v] = next_arg++;
    if (n.op == ir::kOpAllReduce) {
      external[n.id.v] = true;
      r.all_reduce_of_node_[n.id.v] = static_cast<int>(r.num_all_reduces_++);
    }
  }
  auto shared = std::make_shared<const ir::Graph>(std::move(local));
  auto in = Interpreter::create(shared, options, std::move(external));
  if (!in.ok()) return in.error().withContext("local graph '" + shared->name + "'");
  r.interp_ = std::make_shared<const Interpreter>(std::move(in).value());
  return r;
}

std::vector<c10::IValue> OpCollectiveRunner::run(const std::vector<c10::IValue>& args,
                                                 const AllReduceFn& all_reduce) const {
  const Interpreter::ExternalFn feed = [&](const ir::Node& n, std::vector<c10::IValue>& in) {
    std::vector<c10::IValue> out;
    if (const int a = arg_of_node_.at(n.id.v); a >= 0) {
      TORCH_CHECK(static_cast<size_t>(a) < args.size(), "local graph '", graph().name,
                  "' reads argument ", a, " of ", args.size());
      out.push_back(args[static_cast<size_t>(a)]);
      return out;
    }
    const int k = all_reduce_of_node_.at(n.id.v);
    TORCH_CHECK(k >= 0 && in.size() == 1 && in[0].isTensor(), "local graph '", graph().name,
                "': node ", n.id.v, " (", n.op, ") is not an all-reduce of one tensor");
    out.push_back(all_reduce(static_cast<size_t>(k), in[0].toTensor()));
    return out;
  };
  Expected<std::vector<c10::IValue>> out = interp_->run(feed);
  TORCH_CHECK(out.ok(), out.error().message());  // the message is built only on failure
  return std::move(out).value();
}

}  // namespace apc::runtime
