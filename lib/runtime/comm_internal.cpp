//===- lib/runtime/comm_internal.cpp - Shared pieces of the communicators ----===//
//
// Group names, torch.chunk arithmetic, failure texts, the stacked-piece reduction used by the
// composed reduce-scatter and 16-bit all-reduce, the communicator of a one-rank group, and the
// counters' arithmetic.
//
//===----------------------------------------------------------------------===//
#include "comm_internal.h"

#include <algorithm>
#include <atomic>

#include <ATen/core/Tensor.h>

#include "apc/mesh/placement.h"

namespace apc::runtime::detail {

std::string groupName(const mesh::DeviceMesh& mesh, int dim, const std::vector<int64_t>& ranks) {
  std::string s;
  if (dim < 0) {
    s = "world";
  } else {
    s = "mesh dim " + std::to_string(dim);
    if (static_cast<size_t>(dim) < mesh.names().size()) s += " (" + mesh.names()[dim] + ")";
  }
  s += " ranks {";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    if (ranks.size() > 16 && i == 8) {
      s += "...," + std::to_string(ranks.back());
      break;
    }
    s += std::to_string(ranks[i]);
  }
  return s + "}";
}

std::vector<int64_t> chunkSizes(int64_t n, int p) {
  std::vector<int64_t> sizes(p);
  for (int q = 0; q < p; ++q) sizes[q] = mesh::chunkSize(n, p, q);
  return sizes;
}

std::string firstLine(std::string_view text) {
  text = text.substr(0, text.find('\n'));
  // Gloo prefixes its messages with the source location: "[/build/.../pair.cc:598] Connection ...".
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find("] ");
    if (close != std::string_view::npos &&
        text.substr(0, close).find(':') != std::string_view::npos)
      text = text.substr(close + 2);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r')) text.remove_suffix(1);
  return std::string(text);
}

std::string describeFailure(const std::string& group, const char* op, std::string_view message,
                            std::chrono::milliseconds timeout) {
  std::string line = firstLine(message);
  bool timed_out =
      line.find("imed out") != std::string::npos || line.find("imeout") != std::string::npos;
  if (timed_out)
    return group + ": " + op + " timed out after " + std::to_string(timeout.count()) + " ms";
  // A peer that exited (its own error says why) shows up as a closed connection, with Gloo's
  // advice and an emoji: one plain line instead, so that the first failing rank's cause stands
  // out among the others' lines.
  for (const char* closed :
       {"Connection closed by peer", "Connection reset by peer", "Broken pipe"})
    if (line.find(closed) != std::string::npos)
      return group + ": " + op +
             " failed: a peer rank closed its connection (it exited: its own error is the cause)";
  return group + ": " + op + " failed: " + line;
}

void throwUsage(const std::string& group, const char* op, const std::string& what) {
  throw CommError(group + ": " + op + ": " + what);
}

int64_t normaliseDim(const std::string& group, const char* op, int64_t dim, int64_t ndim) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    throwUsage(
        group, op,
        "dim " + std::to_string(dim) + " out of range for a " + std::to_string(ndim) + "-d tensor");
  return d;
}

void checkPieceSizes(const std::string& group, const char* op, const at::Tensor& local, int64_t dim,
                     const std::vector<int64_t>& sizes, int index) {
  if (static_cast<int>(sizes.size()) <= index)
    throwUsage(group, op,
               std::to_string(sizes.size()) + " piece sizes for a group of more members");
  for (int64_t s : sizes)
    if (s < 0) throwUsage(group, op, "negative piece size " + std::to_string(s));
  if (local.size(dim) != sizes[index])
    throwUsage(group, op,
               "local size " + std::to_string(local.size(dim)) + " along dim " +
                   std::to_string(dim) + " but sizes[" + std::to_string(index) + "] is " +
                   std::to_string(sizes[index]));
}

at::Tensor reduceStacked(const at::Tensor& stacked, mesh::ReduceOp op, int64_t group_size) {
  at::ScalarType dtype = stacked.scalar_type();
  bool low = dtype == at::kBFloat16 || dtype == at::kHalf;
  // Sums accumulate in f32 for 16-bit floats (piece by piece into an f32 accumulator, no f32
  // copy of the whole stack) and in the tensor's own type otherwise; max and min are exact in any
  // type.
  at::ScalarType acc = low ? at::kFloat : dtype;
  auto sum = [&] {
    if (!low) return stacked.sum(0);
    at::Tensor r = stacked[0].to(acc);
    for (int64_t j = 1; j < stacked.size(0); ++j) r.add_(stacked[j]);
    return r;
  };
  at::Tensor r;
  switch (op) {
    case mesh::ReduceOp::kSum:
      r = sum();
      break;
    case mesh::ReduceOp::kAvg:
      r = sum();
      r = at::isFloatingType(acc) ? r.div_(static_cast<double>(group_size))
                                  : r.div(group_size, "floor");
      break;
    case mesh::ReduceOp::kMax:
      r = stacked.amax(0);
      break;
    case mesh::ReduceOp::kMin:
      r = stacked.amin(0);
      break;
  }
  return r.scalar_type() == dtype ? r : r.to(dtype);
}

namespace {

std::atomic<bool> g_synchronized_comm_timing{false};
std::atomic<int64_t> g_injected_latency_ms{0};

/// The handle of a collective that already ran (the default allReduceAsync).
class DoneCollective final : public PendingCollective {
 public:
  explicit DoneCollective(at::Tensor result) : result_(std::move(result)) {}
  at::Tensor wait() override { return result_; }

 private:
  at::Tensor result_;
};

/// A group of one rank: each collective is the identity on a copy (the same contract as the real
/// communicators: results never alias their inputs).
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}
  int index() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  at::Tensor allGather(const at::Tensor& local, int64_t dim,
                       const std::vector<int64_t>& sizes) override {
    int64_t d = normaliseDim(name_, "all-gather", dim, local.dim());
    checkPieceSizes(name_, "all-gather", local, d, sizes, 0);
    count(CommKind::kAllGather);
    return local.clone(at::MemoryFormat::Contiguous);
  }
  void allReduce(at::Tensor& t, mesh::ReduceOp op) override { count(CommKind::kAllReduce); }
  at::Tensor reduceScatter(const at::Tensor& full, int64_t dim, mesh::ReduceOp op) override {
    normaliseDim(name_, "reduce-scatter", dim, full.dim());
    count(CommKind::kReduceScatter);
    return full.clone(at::MemoryFormat::Contiguous);
  }
  at::Tensor allToAll(const at::Tensor& local, int64_t gather_dim, int64_t shard_dim,
                      const std::vector<int64_t>& gather_sizes) override {
    int64_t g = normaliseDim(name_, "all-to-all", gather_dim, local.dim());
    normaliseDim(name_, "all-to-all", shard_dim, local.dim());
    checkPieceSizes(name_, "all-to-all", local, g, gather_sizes, 0);
    count(CommKind::kAllToAll);
    return local.clone(at::MemoryFormat::Contiguous);
  }
  void broadcast(at::Tensor& t, int root_index) override {
    if (root_index != 0) throwUsage(name_, "broadcast", "root index out of range");
    count(CommKind::kBroadcast);
  }
  void barrier() override { count(CommKind::kBarrier); }

 private:
  void count(CommKind kind) {
    ++stats_.calls;
    ++stats_.of(kind).calls;
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> makeLocalCommunicator(std::string name) {
  return std::make_unique<LocalCommunicator>(std::move(name));
}

}  // namespace apc::runtime::detail

namespace apc::runtime {

const char* commKindName(CommKind kind) {
  switch (kind) {
    case CommKind::kAllGather:
      return "all-gather";
    case CommKind::kAllReduce:
      return "all-reduce";
    case CommKind::kReduceScatter:
      return "reduce-scatter";
    case CommKind::kAllToAll:
      return "all-to-all";
    case CommKind::kBroadcast:
      return "broadcast";
    case CommKind::kBarrier:
      return "barrier";
  }
  return "collective";
}

CommStats& CommStats::operator+=(const CommStats& o) {
  calls += o.calls;
  bytes_sent += o.bytes_sent;
  seconds += o.seconds;
  in_flight_seconds += o.in_flight_seconds;
  async_calls += o.async_calls;
  busy_seconds += o.busy_seconds;
  for (size_t k = 0; k < kNumCommKinds; ++k) {
    by_kind[k].calls += o.by_kind[k].calls;
    by_kind[k].bytes_sent += o.by_kind[k].bytes_sent;
    by_kind[k].seconds += o.by_kind[k].seconds;
    by_kind[k].in_flight_seconds += o.by_kind[k].in_flight_seconds;
    by_kind[k].async_calls += o.by_kind[k].async_calls;
  }
  return *this;
}

CommStats& CommStats::operator-=(const CommStats& o) {
  calls -= o.calls;
  bytes_sent -= o.bytes_sent;
  seconds -= o.seconds;
  in_flight_seconds -= o.in_flight_seconds;
  async_calls -= o.async_calls;
  busy_seconds -= o.busy_seconds;
  for (size_t k = 0; k < kNumCommKinds; ++k) {
    by_kind[k].calls -= o.by_kind[k].calls;
    by_kind[k].bytes_sent -= o.by_kind[k].bytes_sent;
    by_kind[k].seconds -= o.by_kind[k].seconds;
    by_kind[k].in_flight_seconds -= o.by_kind[k].in_flight_seconds;
    by_kind[k].async_calls -= o.by_kind[k].async_calls;
  }
  return *this;
}

void setSynchronizedCommTiming(bool on) {
  detail::g_synchronized_comm_timing.store(on);
}

bool synchronizedCommTiming() {
  return detail::g_synchronized_comm_timing.load();
}

void setInjectedCommLatency(std::chrono::milliseconds latency) {
  detail::g_injected_latency_ms.store(std::max<int64_t>(0, latency.count()));
}

std::chrono::milliseconds injectedCommLatency() {
  return std::chrono::milliseconds(detail::g_injected_latency_ms.load());
}

void Communicator::markBusy(std::chrono::steady_clock::time_point issued,
                            std::chrono::steady_clock::time_point done) {
  if (done <= issued) return;
  auto length = [](const auto& iv) {
    return std::chrono::duration<double>(iv.second - iv.first).count();
  };
  // Merge [issued, done] with every interval it touches.
  auto first = std::lower_bound(busy_.begin(), busy_.end(), issued,
                                [](const auto& iv, const auto& t) { return iv.second < t; });
  auto last = first;
  auto merged = std::make_pair(issued, done);
  double before = 0;
  while (last != busy_.end() && last->first <= done) {
    before += length(*last);
    merged.first = std::min(merged.first, last->first);
    merged.second = std::max(merged.second, last->second);
    ++last;
  }
  stats_.busy_seconds += length(merged) - before;
  first = busy_.erase(first, last);
  busy_.insert(first, merged);
  constexpr size_t kMaxBusy = 4096;
  if (busy_.size() > kMaxBusy) busy_.erase(busy_.begin(), busy_.begin() + kMaxBusy / 2);
}

std::unique_ptr<PendingCollective> Communicator::allReduceAsync(at::Tensor& t, mesh::ReduceOp op) {
  allReduce(t, op);
  return std::make_unique<detail::DoneCollective>(t);
}

std::unique_ptr<PendingCollective> Communicator::allGatherAsync(const at::Tensor& local,
                                                                int64_t dim,
                                                                const std::vector<int64_t>& sizes) {
  return std::make_unique<detail::DoneCollective>(allGather(local, dim, sizes));
}

std::unique_ptr<PendingCollective> Communicator::reduceScatterAsync(const at::Tensor& full,
                                                                    int64_t dim,
                                                                    mesh::ReduceOp op) {
  return std::make_unique<detail::DoneCollective>(reduceScatter(full, dim, op));
}

}  // namespace apc::runtime
