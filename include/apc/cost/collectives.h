//===- apc/cost/collectives.h - Alpha-beta cost of collectives ------------===//
//
// Ring-algorithm alpha-beta costs of the collectives over the p ranks of one mesh dim, whose link
// has latency alpha (LinkParams::latency_us, microseconds per step) and bandwidth beta
// (LinkParams::bandwidth_gbps, GB/s = 1e9 bytes per second per rank). `full_bytes` (n) is always
// the size of the FULL tensor as seen along that mesh dim: the gathered result of an all-gather,
// the input of a reduce-scatter, the (same-sized) input and output of an all-reduce or all-to-all.
//   all-gather, reduce-scatter  (p-1) alpha + (p-1)/p   n/beta
//   all-reduce                  2 (p-1) alpha + 2 (p-1)/p n/beta
//   all-to-all                  (p-1) alpha + (p-1)/p^2 n/beta
// n/beta in microseconds is n / (bandwidth_gbps * 1e3). A group of one rank costs 0. A link whose
// bandwidth is not positive or whose latency is negative prices every collective at +infinity.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>

#include "apc/mesh/device_mesh.h"

namespace apc::cost {

enum class CollectiveKind : uint8_t { kNone, kAllGather, kReduceScatter, kAllReduce, kAllToAll };

/// "none", "all-gather", "reduce-scatter", "all-reduce", "all-to-all".
const char* collectiveName(CollectiveKind kind);

/// Each returns microseconds for `group_size` ranks over `link`, with `full_bytes` as above.
double allGatherUs(const mesh::LinkParams& link, int64_t group_size, double full_bytes);
double reduceScatterUs(const mesh::LinkParams& link, int64_t group_size, double full_bytes);
double allReduceUs(const mesh::LinkParams& link, int64_t group_size, double full_bytes);
double allToAllUs(const mesh::LinkParams& link, int64_t group_size, double full_bytes);

/// Dispatches on `kind`; kNone costs 0.
double collectiveUs(CollectiveKind kind, const mesh::LinkParams& link, int64_t group_size,
                    double full_bytes);

}  // namespace apc::cost
