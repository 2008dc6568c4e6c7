//===- lib/cost/collectives.cpp - Alpha-beta cost of collectives ----------===//
//
// The formulas of apc/cost/collectives.h. They sit on the redistribution planner's hot path: no
// allocation, no branches beyond the degenerate cases.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/collectives.h"

#include <limits>

namespace apc::cost {

namespace {

// (p-1) alpha + fraction * n / beta, with the degenerate cases of the header.
double alphaBeta(const mesh::LinkParams& link, int64_t p, double steps, double fraction,
                 double full_bytes) {
  if (p <= 1) return 0.0;
  if (!(link.bandwidth_gbps > 0) || !(link.latency_us >= 0))
    return std::numeric_limits<double>::infinity();
  double n = full_bytes > 0 ? full_bytes : 0.0;
  return steps * link.latency_us + fraction * n / (link.bandwidth_gbps * 1e3);
}

}  // namespace

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kNone:
      return "none";
    case CollectiveKind::kAllGather:
      return "all-gather";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kAllToAll:
      return "all-to-all";
  }
  return "none";
}

double allGatherUs(const mesh::LinkParams& link, int64_t p, double full_bytes) {
  double pd = static_cast<double>(p);
  return alphaBeta(link, p, pd - 1, (pd - 1) / pd, full_bytes);
}

double reduceScatterUs(const mesh::LinkParams& link, int64_t p, double full_bytes) {
  return allGatherUs(link, p, full_bytes);
}

double allReduceUs(const mesh::LinkParams& link, int64_t p, double full_bytes) {
  return 2.0 * allGatherUs(link, p, full_bytes);
}

double allToAllUs(const mesh::LinkParams& link, int64_t p, double full_bytes) {
  double pd = static_cast<double>(p);
  return alphaBeta(link, p, pd - 1, (pd - 1) / (pd * pd), full_bytes);
}

double collectiveUs(CollectiveKind kind, const mesh::LinkParams& link, int64_t p,
                    double full_bytes) {
  switch (kind) {
    case CollectiveKind::kNone:
      return 0.0;
    case CollectiveKind::kAllGather:
      return allGatherUs(link, p, full_bytes);
    case CollectiveKind::kReduceScatter:
      return reduceScatterUs(link, p, full_bytes);
    case CollectiveKind::kAllReduce:
      return allReduceUs(link, p, full_bytes);
    case CollectiveKind::kAllToAll:
      return allToAllUs(link, p, full_bytes);
  }
  return 0.0;
}

}  // namespace apc::cost
