//===- lib/strategy/embedding.cpp - Embedding lookups ----------------------===//
//
// embedding(weight [V, D], indices [...], padding_idx, scale_grad_by_freq, sparse) -> [..., D]:
//   indices S(d), weight R              -> out S(d)       (each rank looks up its indices)
//   weight S(1) (columns), indices R    -> out S(last)    (each rank holds a slice of every row)
//   weight S(0) (vocab rows), indices R -> out P(sum)     masked lookup: each rank returns the
//       rows it owns and zeros for the others, so the sum over ranks is the full lookup. Uneven
//       vocabularies (GPT-2's 50257) are fine: pieces follow torch.chunk and lowering uses each
//       rank's offset from apc/layout/layout.h. The entry's local rewrite maps padding_idx to the
//       rank's rows and writes the masked lookup (indices shifted by that offset, the rows the
//       rank does not own zeroed) as the node's local graph, which lowering records and the
//       runtime runs without knowing the op (apc/strategy/local_rewrite.h).
// plus all-R. The lookup is linear in the weight, but a Partial weight never arises (it is a
// parameter), so weight P is not offered.
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

std::vector<DimStrategy> embeddingRule(const RuleContext& c) {
  int64_t wr = c.inputRank(0), ir_ = c.inputRank(1);
  if (wr != 2 || ir_ < 0 || c.outputRank(0) != ir_ + 1) return {};
  auto make = [&](Placement w, Placement idx, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = w;
    s.inputs[1] = idx;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R()));
  for (int64_t d = 0; d < ir_; ++d) res.push_back(make(R(), S(d), S(d)));
  res.push_back(make(S(1), R(), S(ir_)));
  res.push_back(make(S(0), R(), P()));
  return res;
}

/// A gather: reads the indices and the looked-up rows, writes the output.
Work embeddingWork(const RuleContext& c, const LocalShapes& l) {
  Work w;
  w.bytes = localInputBytes(c, l, 1) + 2 * localOutputBytes(c, l, 0);
  return w;
}

}  // namespace

void registerEmbeddingRules(Registry& r) {
  r.add("aten::embedding", embeddingRule, cost::OpFamily::kEmbedding, embeddingWork);
  // embedding(weight, indices, ...): the Megatron baseline cuts the table's vocabulary.
  r.entry("aten::embedding")->tp = TpUse{TpUse::Kind::kVocab, /*weight=*/0, /*bias=*/-1};
  // A vocab-cut weight: padding_idx on the rank's rows and the masked lookup as a local graph.
  r.entry("aten::embedding")->local_rewrite = detail::rewriteEmbeddingRows;
  // embedding_dense_backward adds the gradient rows into a zero-filled table: the table's bytes
  // written once more than the multiple of the forward (the looked-up rows) counts.
  r.entry("aten::embedding")->backward_work = [](const RuleContext& c, const LocalShapes& local) {
    Work w;
    w.bytes = detail::localInputBytes(c, local, 0);
    return w;
  };

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::embedding"},
          {{"", {S::f32({10, 3}), S::i64({4, 5})}}, {"", {S::f32({7, 4}), S::i64({6}), S::of(2)}}});
}

}  // namespace apc::strategy
