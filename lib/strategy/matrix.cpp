//===- lib/strategy/matrix.cpp - Contractions from einsum dim roles --------===//
//
// Every contraction is described by its einsum indices, each with a position in lhs, rhs and out
// (or absent). One rule generator covers them all, per index:
//   batch        (lhs, rhs, out)   S on all three; an operand broadcast there (size 1) gets R
//   lhs-free     (lhs, out)        lhs S, rhs R, out S
//   rhs-free     (rhs, out)        lhs R, rhs S, out S
//   contracting  (lhs, rhs)        lhs S, rhs S, out P(sum)  (each rank sums its slice of k)
// plus all-R and the linear Partials: lhs P with rhs R, and lhs R with rhs P, give out P.
// matmul builds its indices from the operand ranks with torch.matmul's rules (1-d operands,
// broadcast batch dims of the 4-d attention products q @ k^T); mm, bmm, mv and dot are the same
// generator.
//
// Ops with an added term (linear's bias, addmm/baddbmm's self) place it like a broadcasting
// pointwise operand of the output: S where the output is sharded on a dim it has, R where it
// broadcasts, and P when the output is P. A Partial output needs a Partial bias: every rank adds
// its summand of the bias, which sums to the bias once (a Replicate bias would be added p times).
// So the contracting strategy of linear/addmm with a bias asks for the bias as P(sum), and has a
// twin that reads the bias Replicate: Megatron's row-parallel linear. A Replicate value cannot
// become Partial (apc/cost/redistribute.h), and a bias is a parameter (R or S), so without the
// twin a row-parallel linear with a bias was never plannable (gpt2_tiny's tp plan gathered every
// c_proj weight, 2026-12-07). The twin's local rewrite (rewriteAddendOnce) adds the bias on the
// ranks at coordinate 0 of the Partial mesh dims and bias * 0 on the others; the bias's
// gradient is then a Partial sum there, as any replicated input's of a split op.
//
// scaled_dot_product_attention (torch >= 2.0; not in 1.13) shards the dims before (L, E) on
// q, k, v, mask and out alike, and the query length L (k and v R) when is_causal is False (a
// causal mask on a query slice would need the slice's offset). Dropout inside it has the same
// RNG requirement as aten::dropout.
//
// einsum(equation, Tensor[] operands) parses its equation (explicit "->" or implicit output, with
// "..." ellipsis dims aligned from the right as torch broadcasts them). Its operands are ONE
// Tensor[] input, and a Tensor[] has one placement for all its elements (strategy.h), so a label
// can be sharded through the list only when it sits at the same dim index d in every operand
// (once each, with one size or 1 where an operand broadcasts, no diagonal): the list S(d), an
// operand of size 1 there whole (layout::elementPlacement), and the output S(its
// position) when the output has the label, P(sum) when the label is contracted (each rank sums its
// slice). Labels missing from some operand, or at different dims (bij,bjk->bik's j), stay R. P(sum)
// passes through a single-operand einsum (linear); with several operands the one list placement
// would make every operand Partial, whose product is not the product of the sums.
// aten::einsum.operands(equation, t0, t1, ...), the importers' form of an einsum whose list is
// built for it alone (frontend::importModel), places each operand on its own: a label is cut in
// every operand that has it, once and at its full size (an operand of size 1 there whole), the
// others whole; the output S(its position) or P(sum) when it is summed away; one operand P(sum)
// with the others whole -> P(sum) (linear in each operand).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

/// Positions of one einsum index in lhs, rhs and out (-1 when absent).
struct Index {
  int64_t lhs = -1, rhs = -1, out = -1;
};

struct Contraction {
  size_t lhs = 0, rhs = 1;       // input indices of the operands
  std::optional<size_t> addend;  // input index of a broadcast added term (bias, self)
  std::vector<Index> indices;    // every einsum index
  bool rhs_partial = true;       // offer lhs R, rhs P -> P
};

/// Placement of a broadcast addend of rank `r` for the output placement `out` of an output of
/// sizes `out_sizes`.
Placement addendPlacement(const std::vector<int64_t>& addend_sizes,
                          const std::vector<int64_t>& out_sizes, Placement out) {
  if (out.isPartial()) return out;
  if (!out.isShard()) return R();
  int64_t a = out.dim() - static_cast<int64_t>(out_sizes.size() - addend_sizes.size());
  if (a >= 0 && addend_sizes[static_cast<size_t>(a)] == out_sizes[static_cast<size_t>(out.dim())])
    return S(a);
  return R();
}

std::vector<DimStrategy> contract(const RuleContext& c, const Contraction& k) {
  if (!c.isTensorInput(k.lhs) || !c.isTensorInput(k.rhs) || !c.isTensorOutput(0)) return {};
  std::vector<int64_t> ls = c.inputSizes(k.lhs), rs = c.inputSizes(k.rhs), os = c.outputSizes(0);
  std::vector<int64_t> as;
  if (k.addend) {
    if (!c.isTensorInput(*k.addend)) return {};
    as = c.inputSizes(*k.addend);
    if (as.size() > os.size()) return {};
  }
  auto finish = [&](DimStrategy s) {
    if (k.addend) s.inputs[*k.addend] = addendPlacement(as, os, *s.outputs[0]);
    return s;
  };
  auto make = [&](Placement l, Placement r, Placement o) {
    DimStrategy s = emptyDim(c);
    s.inputs[k.lhs] = l;
    s.inputs[k.rhs] = r;
    s.outputs[0] = o;
    return finish(std::move(s));
  };
  // Every index within its operand's rank: a graph whose shapes disagree with the op (an edited
  // or damaged plan's graph; the fuzzer made a linear whose output has fewer dims than its input)
  // gets no rule, so the Replicate fallback, rather than reads past the sizes.
  auto within = [](int64_t pos, const std::vector<int64_t>& sizes) {
    return pos < static_cast<int64_t>(sizes.size());
  };
  for (const Index& ix : k.indices)
    if (!within(ix.lhs, ls) || !within(ix.rhs, rs) || !within(ix.out, os)) return {};
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R()));
  for (const Index& ix : k.indices) {
    if (ix.out >= 0) {
      int64_t n = os[static_cast<size_t>(ix.out)];
      bool l = ix.lhs >= 0 && ls[static_cast<size_t>(ix.lhs)] == n;
      bool r = ix.rhs >= 0 && rs[static_cast<size_t>(ix.rhs)] == n;
      if (!l && !r) continue;
      res.push_back(make(l ? S(ix.lhs) : R(), r ? S(ix.rhs) : R(), S(ix.out)));
    } else if (ix.lhs >= 0 && ix.rhs >= 0) {
      if (ls[static_cast<size_t>(ix.lhs)] != rs[static_cast<size_t>(ix.rhs)]) continue;
      res.push_back(make(S(ix.lhs), S(ix.rhs), P()));
      // Megatron's row-parallel linear: the bias Replicate, added once (rewriteAddendOnce).
      if (k.addend) {
        DimStrategy s = res.back();
        s.inputs[*k.addend] = R();
        res.push_back(std::move(s));
      }
    } else if (ix.lhs >= 0) {
      res.push_back(make(S(ix.lhs), R(), P()));
    } else if (ix.rhs >= 0) {
      res.push_back(make(R(), S(ix.rhs), P()));
    }
  }
  res.push_back(make(P(), R(), P()));
  if (k.rhs_partial) res.push_back(make(R(), P(), P()));
  return res;
}

/// torch.matmul's indices for operands of ranks `lr` and `rr` (both >= 1).
std::vector<Index> matmulIndices(int64_t lr, int64_t rr) {
  std::vector<Index> ix;
  if (lr == 1 && rr == 1) return {{0, 0, -1}};
  int64_t lb = lr >= 2 ? lr - 2 : 0, rb = rr >= 2 ? rr - 2 : 0;  // batch dims of each
  int64_t nb = std::max(lb, rb);
  for (int64_t b = 0; b < nb; ++b) {
    Index i;
    i.out = b;
    if (b >= nb - lb) i.lhs = b - (nb - lb);
    if (b >= nb - rb) i.rhs = b - (nb - rb);
    ix.push_back(i);
  }
  int64_t o = nb;
  if (lr >= 2) ix.push_back({lr - 2, -1, o++});      // m
  if (rr >= 2) ix.push_back({-1, rr - 1, o++});      // n
  ix.push_back({lr - 1, rr >= 2 ? rr - 2 : 0, -1});  // k
  return ix;
}

std::vector<DimStrategy> matmulRule(const RuleContext& c) {
  int64_t lr = c.inputRank(0), rr = c.inputRank(1);
  if (lr < 1 || rr < 1) return {};
  Contraction k;
  k.indices = matmulIndices(lr, rr);
  return contract(c, k);
}

/// addmm(self, mat1, mat2, ...), baddbmm(self, batch1, batch2, ...).
std::vector<DimStrategy> addmmRule(const RuleContext& c) {
  int64_t lr = c.inputRank(1), rr = c.inputRank(2);
  if (lr < 2 || rr < 2) return {};
  Contraction k;
  k.lhs = 1;
  k.rhs = 2;
  k.addend = 0;
  k.indices = matmulIndices(lr, rr);
  return contract(c, k);
}

/// linear(input [..., in], weight [out, in], bias [out]?).
std::vector<DimStrategy> linearRule(const RuleContext& c) {
  int64_t xr = c.inputRank(0);
  if (xr < 1 || c.inputRank(1) != 2) return {};
  Contraction k;
  if (c.isTensorInput(2)) k.addend = 2;
  k.rhs_partial = false;  // a Partial weight only arises from a parameter, which is never P
  for (int64_t d = 0; d + 1 < xr; ++d) k.indices.push_back({d, -1, d});
  k.indices.push_back({-1, 0, xr - 1});  // out features
  k.indices.push_back({xr - 1, 1, -1});  // in features (contracting)
  return contract(c, k);
}

/// scaled_dot_product_attention(q, k, v, attn_mask?, dropout_p, is_causal, ...).
std::vector<DimStrategy> sdpaRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  if (r < 2 || c.inputRank(1) != r || c.inputRank(2) != r || c.outputRank(0) != r) return {};
  std::vector<int64_t> q = c.inputSizes(0), k = c.inputSizes(1), v = c.inputSizes(2);
  bool has_mask = c.isTensorInput(3);
  std::vector<int64_t> m = has_mask ? c.inputSizes(3) : std::vector<int64_t>{};
  if (m.size() > static_cast<size_t>(r)) return {};
  // Mask placement when the scores [..., L, S] are sharded on dim d.
  auto maskAt = [&](int64_t d, int64_t size) {
    int64_t a = d - (r - static_cast<int64_t>(m.size()));
    return a >= 0 && m[static_cast<size_t>(a)] == size ? S(a) : R();
  };
  auto make = [&](Placement pq, Placement pk, Placement pv, Placement pm, Placement po) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = pq;
    s.inputs[1] = pk;
    s.inputs[2] = pv;
    if (has_mask) s.inputs[3] = pm;
    s.outputs[0] = po;
    for (size_t i = 1; i < c.numOutputs(); ++i)  // attention weights etc. of variants: not handled
      if (c.isTensorOutput(i)) return std::optional<DimStrategy>{};
    return std::optional<DimStrategy>{std::move(s)};
  };
  std::vector<DimStrategy> res;
  if (auto s = make(R(), R(), R(), R(), R()))
    res.push_back(std::move(*s));
  else
    return {};
  for (int64_t d = 0; d + 2 < r; ++d) {
    size_t u = static_cast<size_t>(d);
    if (q[u] != k[u] || q[u] != v[u]) continue;
    res.push_back(*make(S(d), S(d), S(d), maskAt(d, q[u]), S(d)));
  }
  std::optional<bool> causal = c.boolArg(5);
  if (causal.has_value() && !*causal)
    res.push_back(
        *make(S(r - 2), R(), R(), maskAt(r - 2, q[static_cast<size_t>(r - 2)]), S(r - 2)));
  return res;
}

Work sdpaWork(const RuleContext& c, const LocalShapes& l) {
  Work w = defaultWork(c, l);
  if (l.inputs.size() < 3 || l.inputs[0].empty() || l.inputs[1].empty() || l.inputs[2].empty())
    return w;
  const auto &q = l.inputs[0][0], &k = l.inputs[1][0], &v = l.inputs[2][0];
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) return w;
  double lead_l = numel(q) / static_cast<double>(q.back());  // batch... * L
  w.flops = 2.0 * lead_l * static_cast<double>(k[k.size() - 2]) *
            static_cast<double>(q.back() + v.back());
  return w;
}

/// The labels of an einsum equation: one per dim of each operand and of the output. Letters are
/// their character codes; ellipsis dims are kEllipsisLabel + their position in the broadcast
/// ellipsis shape (operands with fewer ellipsis dims align from the right).
struct EinsumLabels {
  std::vector<std::vector<int>> operands;
  std::vector<int> output;
};

constexpr int kEllipsisLabel = 1000;

/// Parses `equation` for operands of ranks `ranks`; nullopt when it is malformed or does not fit.
std::optional<EinsumLabels> parseEinsum(const std::string& equation,
                                        const std::vector<int64_t>& ranks) {
  std::string eq;
  for (char ch : equation)
    if (ch != ' ') eq += ch;
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::optional<std::string> rhs;
  if (arrow != std::string::npos) rhs = eq.substr(arrow + 2);
  // A term: its letters and whether (and where among them) it has an ellipsis.
  struct Term {
    std::vector<int> letters;
    std::optional<size_t> ellipsis;  // letters before the ellipsis
  };
  auto parseTerm = [](const std::string& t) -> std::optional<Term> {
    Term term;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 3, "...") == 0) {
        if (term.ellipsis) return std::nullopt;
        term.ellipsis = term.letters.size();
        i += 2;
      } else if ((t[i] >= 'a' && t[i] <= 'z') || (t[i] >= 'A' && t[i] <= 'Z')) {
        term.letters.push_back(t[i]);
      } else {
        return std::nullopt;
      }
    }
    return term;
  };
  std::vector<Term> terms;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    auto term = parseTerm(lhs.substr(start, comma - start));
    if (!term) return std::nullopt;
    terms.push_back(*term);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ranks.size()) return std::nullopt;
  // Ellipsis dims of each operand, and of the broadcast ellipsis shape.
  std::vector<int64_t> ell(terms.size(), 0);
  int64_t max_ell = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    int64_t named = static_cast<int64_t>(terms[k].letters.size());
    ell[k] = ranks[k] - named;
    if (ell[k] < 0 || (!terms[k].ellipsis && ell[k] != 0)) return std::nullopt;
    max_ell = std::max(max_ell, ell[k]);
  }
  auto expand = [&](const Term& t, int64_t n) {
    std::vector<int> labels;
    for (size_t i = 0; i <= t.letters.size(); ++i) {
      if (t.ellipsis && *t.ellipsis == i)
        for (int64_t j = 0; j < n; ++j)
          labels.push_back(kEllipsisLabel + static_cast<int>(max_ell - n + j));
      if (i < t.letters.size()) labels.push_back(t.letters[i]);
    }
    return labels;
  };
  EinsumLabels res;
  std::map<int, int> count;
  for (size_t k = 0; k < terms.size(); ++k) {
    res.operands.push_back(expand(terms[k], ell[k]));
    for (int l : terms[k].letters) ++count[l];
  }
  if (rhs) {
    auto out = parseTerm(*rhs);
    // Ellipsis dims the output drops would be summed; no rule for that.
    if (!out || (max_ell > 0 && !out->ellipsis)) return std::nullopt;
    res.output = expand(*out, max_ell);
    std::set<int> seen;
    for (int l : out->letters)
      if (!count.count(l) || !seen.insert(l).second) return std::nullopt;
  } else {
    // Implicit: the ellipsis dims, then the letters used once, in character order.
    for (int64_t j = 0; j < max_ell; ++j)
      res.output.push_back(kEllipsisLabel + static_cast<int>(j));
    for (const auto& [l, n] : count)
      if (n == 1) res.output.push_back(l);
  }
  return res;
}

/// True for aten::einsum.operands (ir::kEinsumOperandsOverload): operand k is input k + 1.
bool einsumOperandForm(const RuleContext& c) {
  return c.node.overload == ir::kEinsumOperandsOverload;
}

/// The einsum's operand metas: its Tensor[] input 1's elements, or inputs 1.. of the operand form.
std::vector<const ir::TensorMeta*> einsumOperandMetas(const RuleContext& c) {
  if (!einsumOperandForm(c))
    return c.numInputs() >= 2 ? c.inputMetas(1) : std::vector<const ir::TensorMeta*>{};
  std::vector<const ir::TensorMeta*> metas;
  for (size_t i = 1; i < c.numInputs(); ++i) {
    if (!c.isTensorInput(i)) return {};
    metas.push_back(c.inputMetas(i).at(0));
  }
  return metas;
}

/// The einsum's labels for its node (equation input 0, operands Tensor[] input 1 or inputs 1..).
std::optional<EinsumLabels> einsumLabels(const RuleContext& c) {
  const auto& eq = c.input(0).constant;
  const std::string* text = eq ? std::get_if<std::string>(&*eq) : nullptr;
  if (!text || c.numInputs() < 2 || c.numOutputs() != 1 || !c.isTensorOutput(0)) return {};
  std::vector<int64_t> ranks;
  for (const ir::TensorMeta* m : einsumOperandMetas(c)) ranks.push_back(m->rank());
  if (ranks.empty()) return {};
  auto labels = parseEinsum(*text, ranks);
  if (!labels || static_cast<int64_t>(labels->output.size()) != c.outputRank(0)) return {};
  return labels;
}

/// aten::einsum.operands: each operand placed on its own. A label is cut in every operand that
/// has it (once, at its full size; an operand broadcast there, size 1, is whole), the others
/// whole; the output S(its position), or P(sum) when the label is summed away. The einsum is
/// linear in each operand: one P(sum) operand with the others whole gives P(sum).
std::vector<DimStrategy> einsumOperandsRule(const RuleContext& c, const EinsumLabels& labels) {
  const size_t n = labels.operands.size();
  std::vector<std::vector<int64_t>> sizes;
  for (const ir::TensorMeta* m : einsumOperandMetas(c)) sizes.push_back(ir::hintSizes(m->shape));
  const std::vector<int64_t> out_sizes = c.outputSizes(0);
  auto make = [&](const std::vector<Placement>& ops, Placement out) {
    DimStrategy s = emptyDim(c);
    for (size_t k = 0; k < n; ++k) s.inputs[k + 1] = ops[k];
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(std::vector<Placement>(n, R()), R()));
  std::set<int> seen;
  for (size_t k0 = 0; k0 < n; ++k0)
    for (int l : labels.operands[k0]) {
      if (!seen.insert(l).second) continue;
      int64_t size = 1;
      for (size_t k = 0; k < n; ++k)
        for (size_t d = 0; d < labels.operands[k].size(); ++d)
          if (labels.operands[k][d] == l) size = std::max(size, sizes[k][d]);
      std::vector<Placement> ops(n, R());
      bool ok = true, cut = false;
      for (size_t k = 0; k < n && ok; ++k) {
        const std::vector<int>& lk = labels.operands[k];
        const auto at = std::find(lk.begin(), lk.end(), l);
        if (at == lk.end()) continue;
        const auto d = static_cast<size_t>(at - lk.begin());
        ok = std::count(lk.begin(), lk.end(), l) == 1 && (sizes[k][d] == size || sizes[k][d] == 1);
        if (ok && sizes[k][d] == size) {
          ops[k] = S(static_cast<int64_t>(d));
          cut = true;
        }
      }
      if (!ok || !cut) continue;
      const auto o = std::find(labels.output.begin(), labels.output.end(), l);
      if (o == labels.output.end()) {
        res.push_back(make(ops, P()));
      } else {
        const auto od = static_cast<size_t>(o - labels.output.begin());
        if (out_sizes[od] != size) continue;
        res.push_back(make(ops, S(static_cast<int64_t>(od))));
      }
    }
  for (size_t k = 0; k < n; ++k) {
    std::vector<Placement> ops(n, R());
    ops[k] = P();
    res.push_back(make(ops, P()));
  }
  return res;
}

std::vector<DimStrategy> einsumRule(const RuleContext& c) {
  auto labels = einsumLabels(c);
  if (!labels) return {};
  if (einsumOperandForm(c)) return einsumOperandsRule(c, *labels);
  std::vector<std::vector<int64_t>> sizes;
  for (const ir::TensorMeta* m : c.inputMetas(1)) sizes.push_back(ir::hintSizes(m->shape));
  std::vector<int64_t> out_sizes = c.outputSizes(0);
  auto make = [&](Placement list, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[1] = list;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R()));
  // Label of dim d of operand 0 sharded when every operand has it there, once, with one size
  // or size 1 (an operand broadcast there is whole under the list's cut: layout::elementPlacement).
  const std::vector<int>& first = labels->operands[0];
  for (size_t d = 0; d < first.size(); ++d) {
    int l = first[d];
    int64_t n = 1;
    for (size_t k = 0; k < labels->operands.size(); ++k)
      if (d < sizes[k].size()) n = std::max(n, sizes[k][d]);
    bool ok = true;
    for (size_t k = 0; k < labels->operands.size() && ok; ++k) {
      const std::vector<int>& ops = labels->operands[k];
      ok = d < ops.size() && ops[d] == l && std::count(ops.begin(), ops.end(), l) == 1 &&
           (sizes[k][d] == n || sizes[k][d] == 1);
    }
    if (!ok) continue;
    auto o = std::find(labels->output.begin(), labels->output.end(), l);
    if (o == labels->output.end()) {
      res.push_back(make(S(static_cast<int64_t>(d)), P()));
    } else {
      int64_t od = o - labels->output.begin();
      if (out_sizes[static_cast<size_t>(od)] != n) continue;
      res.push_back(make(S(static_cast<int64_t>(d)), S(od)));
    }
  }
  if (labels->operands.size() == 1) res.push_back(make(P(), P()));
  return res;
}

/// 2 (1 for one operand) * the product of every label's local size: the naive einsum loop.
Work einsumWork(const RuleContext& c, const LocalShapes& l) {
  Work w = defaultWork(c, l);
  auto labels = einsumLabels(c);
  if (!labels) return w;
  // The operands' local shapes: the list's elements, or inputs 1.. of the operand form.
  std::vector<std::vector<int64_t>> local;
  if (einsumOperandForm(c)) {
    for (size_t i = 1; i < l.inputs.size(); ++i)
      if (!l.inputs[i].empty()) local.push_back(l.inputs[i][0]);
  } else if (l.inputs.size() >= 2) {
    local = l.inputs[1];
  }
  if (local.size() != labels->operands.size()) return w;
  std::map<int, int64_t> size;
  for (size_t k = 0; k < labels->operands.size(); ++k)
    for (size_t d = 0; d < labels->operands[k].size() && d < local[k].size(); ++d) {
      int64_t& s = size[labels->operands[k][d]];
      s = std::max(s, local[k][d]);
    }
  double flops = labels->operands.size() > 1 ? 2 : 1;
  for (const auto& [label, n] : size) flops *= static_cast<double>(n);
  w.flops = flops;
  return w;
}

WorkFn contractionOn(size_t lhs) {
  return [lhs](const RuleContext& c, const LocalShapes& l) {
    return contractionWork(c, l, lhs, {-1});
  };
}

}  // namespace

void registerMatrixRules(Registry& r) {
  using cost::OpFamily;
  r.add("aten::addmm", addmmRule, OpFamily::kContraction, contractionOn(1));
  r.entry("aten::addmm")->backward_kernels = 3;  // both operands' mm and the bias's sum
  r.add("aten::baddbmm", addmmRule, OpFamily::kContraction, contractionOn(1));
  r.add("aten::bmm", matmulRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::dot", matmulRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::einsum", einsumRule, OpFamily::kContraction, einsumWork);
  r.add("aten::linear", linearRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::matmul", matmulRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::mm", matmulRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::mv", matmulRule, OpFamily::kContraction, contractionOn(0));
  r.add("aten::scaled_dot_product_attention", sdpaRule, OpFamily::kAttention, sdpaWork);
  for (const char* op : {"aten::addmm", "aten::baddbmm"}) r.entry(op)->contraction_lhs = 1;
  for (const char* op :
       {"aten::bmm", "aten::dot", "aten::linear", "aten::matmul", "aten::mm", "aten::mv"})
    r.entry(op)->contraction_lhs = 0;
  // linear(input, weight, bias?): the Megatron baseline's column/row-parallel linear.
  r.entry("aten::linear")->tp = TpUse{TpUse::Kind::kLinear, /*weight=*/1, /*bias=*/2};
  // A contraction split into a Partial sum with a Replicate bias adds it on one rank.
  for (const char* op : {"aten::addmm", "aten::baddbmm", "aten::linear"})
    r.entry(op)->local_rewrite = detail::rewriteAddendOnce;

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  const ir::DType f = ir::DType::kF32;
  samples({"aten::mm"},
          {{"", {S::f32({5, 6}), S::f32({6, 7})}}, {"", {S::f32({4, 3}), S::f32({3, 5})}}});
  samples({"aten::bmm"}, {{"", {S::f32({3, 5, 6}), S::f32({3, 6, 4})}}});
  samples({"aten::matmul"}, {{"", {S::f32({5, 6}), S::f32({6, 7})}},
                             {"", {S::f32({2, 5, 6}), S::f32({6, 3})}},
                             {"", {S::f32({2, 5, 6}), S::f32({2, 6, 3})}},
                             {"", {S::f32({6}), S::f32({3, 6, 5})}}});
  samples({"aten::mv"}, {{"", {S::f32({5, 6}), S::f32({6})}}});
  samples({"aten::dot"}, {{"", {S::f32({7}), S::f32({7})}}});
  samples({"aten::linear"}, {{"", {S::f32({2, 5, 6}), S::f32({7, 6}), S::f32({7})}},
                             {"", {S::f32({5, 6}), S::f32({3, 6}), S::none()}}});
  samples({"aten::addmm"},
          {{"", {S::f32({7}), S::f32({5, 6}), S::f32({6, 7})}},
           {"", {S::f32({5, 7}), S::f32({5, 6}), S::f32({6, 7}), S::of(0.5), S::of(2.0)}}});
  samples({"aten::baddbmm"},
          {{"", {S::f32({3, 5, 4}), S::f32({3, 5, 6}), S::f32({3, 6, 4})}},
           {"", {S::f32({4}), S::f32({3, 5, 6}), S::f32({3, 6, 4}), S::of(0.5), S::of(2.0)}}});
  samples({"aten::einsum"},
          {{"", {S::of("bij,bjk->bik"), S::list(f, {{2, 5, 6}, {2, 6, 3}})}},
           {"", {S::of("ij,kj->ik"), S::list(f, {{5, 6}, {7, 6}})}},
           {"", {S::of("bhqd,bhkd->bhqk"), S::list(f, {{2, 3, 5, 4}, {2, 3, 6, 4}})}}});
  samples({"aten::scaled_dot_product_attention"},
          {{"", {S::f32({2, 3, 5, 4}), S::f32({2, 3, 6, 4}), S::f32({2, 3, 6, 4})}},
           {"",
            {S::f32({2, 3, 5, 4}), S::f32({2, 3, 5, 4}), S::f32({2, 3, 5, 4}), S::none(),
             S::of(0.0), S::of(true)}}});
}

}  // namespace apc::strategy
