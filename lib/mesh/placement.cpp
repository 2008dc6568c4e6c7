//===- lib/mesh/placement.cpp - Placement text forms and chunk arithmetic -===//
#include "apc/mesh/placement.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>

#include "apc/support/strings.h"

namespace apc::mesh {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "sum";
}

std::string Placement::toString() const {
  switch (kind_) {
    case Kind::kReplicate:
      return "R";
    case Kind::kShard:
      return "S(" + std::to_string(dim_) + ")";
    case Kind::kPartial:
      return op_ == ReduceOp::kSum ? "P" : std::string("P(") + reduceOpName(op_) + ")";
  }
  return "?";
}

bool Placement::operator<(const Placement& o) const {
  auto key = [](const Placement& p) {
    return std::make_tuple(static_cast<int>(p.kind_), p.isShard() ? p.dim_ : 0,
                           p.isPartial() ? static_cast<int>(p.op_) : 0);
  };
  return key(*this) < key(o);
}

Expected<Placement> Placement::parse(std::string_view text) {
  std::string_view t = trim(text);
  auto bad = [&]() {
    return parseError("unknown placement '" + std::string(text) +
                      "' (expected S(<dim>), R or P, like S(0), R, P(max))");
  };
  if (t == "R" || t == "Replicate" || t == "Replicate()") return replicate();
  if (t == "P" || t == "Partial" || t == "Partial()") return partial();
  auto inner = [&](std::string_view prefix) -> std::optional<std::string_view> {
    if (t.size() > prefix.size() + 1 && t.substr(0, prefix.size()) == prefix &&
        t[prefix.size()] == '(' && t.back() == ')')
      return trim(t.substr(prefix.size() + 1, t.size() - prefix.size() - 2));
    return std::nullopt;
  };
  for (std::string_view prefix : {"S", "Shard"}) {
    if (auto arg = inner(prefix)) {
      auto d = !arg->empty() && arg->front() == '-' ? std::nullopt : parseInt(*arg);
      if (!d || *d < 0 || *d > std::numeric_limits<int>::max()) return bad();
      return shard(static_cast<int>(*d));
    }
  }
  for (std::string_view prefix : {"P", "Partial"}) {
    if (auto arg = inner(prefix)) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg})
        if (*arg == reduceOpName(op)) return partial(op);
      return bad();
    }
  }
  return bad();
}

std::string toString(const PlacementTuple& t) {
  return joinMap(t, ",", [](const Placement& p) { return p.toString(); });
}

std::string toCompactString(const PlacementTuple& t) {
  return joinMap(t, "", [](const Placement& p) { return p.toString(); });
}

std::string toSignatureString(const std::vector<std::optional<PlacementTuple>>& inputs,
                              const std::vector<std::optional<PlacementTuple>>& outputs) {
  auto list = [](const std::vector<std::optional<PlacementTuple>>& ts) {
    std::string s;
    for (const auto& t : ts) {
      if (!t) continue;
      if (!s.empty()) s += ",";
      s += toCompactString(*t);
    }
    return s;
  };
  return list(inputs) + " -> " + list(outputs);
}

namespace {

/// Splits the printed form "S(0)P(max)R" into its placements' texts; nullopt when `t` is not a
/// run of S(..), P(..), P and R.
std::optional<std::vector<std::string_view>> splitCompact(std::string_view t) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < t.size()) {
    size_t end = i + 1;
    if ((t[i] == 'S' || t[i] == 'P') && i + 1 < t.size() && t[i + 1] == '(') {
      end = t.find(')', i);
      if (end == std::string_view::npos) return std::nullopt;
      ++end;
    } else if (t[i] != 'R' && t[i] != 'P') {
      return std::nullopt;
    }
    out.push_back(t.substr(i, end - i));
    i = end;
  }
  return out;
}

}  // namespace

Expected<PlacementTuple> parsePlacementTuple(std::string_view text) {
  std::string_view t = trim(text);
  if (!t.empty() && t.front() == '[') {
    if (t.back() != ']')
      return parseError("unbalanced '[' in placement list '" + std::string(text) + "'");
    t = t.substr(1, t.size() - 2);
  }
  if (trim(t).empty()) return parseError("empty placement list '" + std::string(text) + "'");
  // Split on commas outside parentheses.
  PlacementTuple out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= t.size(); ++i) {
    if (i == t.size() || (t[i] == ',' && depth == 0)) {
      std::string_view piece = trim(t.substr(start, i - start));
      Expected<Placement> p = Placement::parse(piece);
      // The printed form: several placements concatenated ("S(0)R").
      auto parts = p.ok() ? std::nullopt : splitCompact(piece);
      if (parts && parts->size() > 1) {
        for (std::string_view part : *parts) {
          APC_ASSIGN_OR_RETURN(Placement q, Placement::parse(part));
          out.push_back(q);
        }
      } else {
        if (!p.ok()) return p.error();
        out.push_back(*p);
      }
      start = i + 1;
    } else if (t[i] == '(') {
      ++depth;
    } else if (t[i] == ')') {
      --depth;
    }
  }
  return out;
}

PlacementTuple replicated(size_t mesh_ndim) {
  return PlacementTuple(mesh_ndim, Placement::replicate());
}

Status checkPlacementTuple(const PlacementTuple& t, int64_t tensor_rank, size_t mesh_ndim) {
  if (t.size() != mesh_ndim)
    return invalidArgument("placement " + toCompactString(t) + " has " + std::to_string(t.size()) +
                           (t.size() == 1 ? " entry" : " entries") + " but the mesh has " +
                           std::to_string(mesh_ndim) + " dims");
  for (const Placement& p : t)
    if (p.isShard() && p.dim() >= tensor_rank)
      return invalidArgument("placement " + p.toString() +
                             " is out of range for a tensor of rank " +
                             std::to_string(tensor_rank));
  return Status::success();
}

int64_t shardFactor(const PlacementTuple& t, const std::vector<int64_t>& mesh_shape, int dim) {
  int64_t f = 1;
  for (size_t i = 0; i < t.size() && i < mesh_shape.size(); ++i)
    if (t[i].isShard(dim)) f *= mesh_shape[i];
  return f;
}

int64_t chunkSize(int64_t size, int64_t pieces, int64_t index) {
  int64_t chunk = (size + pieces - 1) / pieces;
  return std::clamp<int64_t>(size - index * chunk, 0, chunk);
}

int64_t chunkOffset(int64_t size, int64_t pieces, int64_t index) {
  int64_t chunk = (size + pieces - 1) / pieces;
  return std::min(size, index * chunk);
}

bool cutsIntoNonEmptyPieces(int64_t size, const std::vector<int64_t>& pieces) {
  std::vector<int64_t> sizes = {size};  // the distinct piece sizes at the current level
  for (int64_t p : pieces) {
    if (p <= 1) continue;
    std::vector<int64_t> next;
    for (int64_t s : sizes) {
      // chunkSize's pieces: all `c` but the last, the smallest.
      const int64_t c = chunkSize(s, p, 0);
      const int64_t last = chunkSize(s, p, p - 1);
      if (last <= 0) return false;
      next.push_back(c);
      if (last != c) next.push_back(last);
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    sizes = std::move(next);
  }
  return true;
}

}  // namespace apc::mesh
