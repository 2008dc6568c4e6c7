//===- lib/runtime/c10d_comm.cpp - Communicator over a c10d process group -===//
//
// One c10d backend per group (ProcessGroupGloo on CPU; ProcessGroupNCCL on CUDA, made in
// nccl_backend.cpp), created over a PrefixStore unique to the group. Every collective is one c10d
// call through the common c10d::Backend interface, so Gloo and NCCL share this code path:
//
//   collective       c10d call                                    bytes counted (this rank)
//   all-gather       _allgather_base (allgather_into_tensor) of   (p-1) * padded local bytes
//                    the locals with the dim moved to the front    (ring all-gather)
//                    and padded to the largest piece; trim, cat
//   all-reduce       allreduce (SUM/MAX/MIN/AVG; integer AVG is   2 (p-1)/p * bytes
//                    SUM then floor division, as torch does)
//   reduce-scatter   _reduce_scatter_base (reduce_scatter_tensor) (p-1) * padded piece bytes
//                    of the dim moved to the front and padded to  = (p-1)/p n when even
//                    p equal torch.chunk pieces; trim (Gloo: below)
//   all-to-all       alltoall_base with uneven split sizes        local bytes - own piece bytes
//   broadcast        broadcast                                    root: (p-1) * bytes, others 0
//   barrier          barrier                                      0
//
// On Gloo the reduce-scatter is an allreduce of that buffer (a copy when it is the caller's), then
// this member's piece: what Gloo's own _reduce_scatter_base does, but on the communicator's buffer,
// where Gloo clones it inside a Work of its own that its worker thread could free after the call
// returned (see releaseWork). The bytes counted stay the reduce-scatter's.
//
// The counted bytes are those of the algorithm run on the buffers handed to c10d (padding
// included), so for even pieces they equal the formulas of apc/cost/collectives.h. Gloo in
// LibTorch 2.13 reduces and moves f32, f64, f16, bf16, integers and bool natively (measured: see
// docs/TOOLCHAIN.md); only int16 is missing from its type switch, so int16 travels viewed as f16
// where nothing is reduced.
//
// A tensor on another device than the backend's own (the host scalars of the runtime's and the
// trainer's checks, a checkpoint's digests, on an NCCL group, which takes only CUDA tensors) is
// staged: the collective runs on a copy on the backend's device and the result comes back.
//
// Timeouts: the group's Options carry the timeout (the backend's own per-operation deadline) and
// every Work is waited on with the same timeout; either way a CommError "<group>: <op> timed out
// after <ms> ms". A peer that died shows up as Gloo's "Connection closed by peer" (the process
// ignores SIGPIPE, see world.cpp) and becomes "<group>: <op> failed: <Gloo's first line>". After a
// CommError the group is unusable: the caller is expected to exit.
//
// allReduceAsync, allGatherAsync and reduceScatterAsync issue the same c10d calls and return the
// Work in a PendingCollective, waited on later with the same timeout and the same error text. Its
// time in flight runs from the issue to the completion that a callback on the Work's future stamps
// (Gloo's worker thread marks it when the collective is done; on NCCL it is when the stream work
// was enqueued, so the figure is a lower bound there); the exposed time is the issue plus the wait.
// setInjectedCommLatency (a test hook)
// makes every collective complete no earlier than a latency after its issue.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "apc/support/activity.h"
#include "comm_internal.h"

namespace apc::runtime::detail {
namespace {

/// A view of `t` whose dtype the backend can move without reducing it (same bytes): Gloo's type
/// switch has no int16.
at::Tensor wireView(const at::Tensor& t) {
  return t.scalar_type() == at::kShort ? t.view(at::kHalf) : t;
}

bool isFloating(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type());
}

/// The c10d reduction of `op` for `t`. Avg of integers is a sum here; the caller floors.
c10d::ReduceOp c10dOp(mesh::ReduceOp op, const at::Tensor& t) {
  switch (op) {
    case mesh::ReduceOp::kMax:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case mesh::ReduceOp::kMin:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case mesh::ReduceOp::kAvg:
      return c10d::ReduceOp(isFloating(t) ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
    case mesh::ReduceOp::kSum:
      break;
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

/// Integer avg: the backend summed; floor-divide as torch's integer division does.
void finishIntegerAvg(at::Tensor& t, mesh::ReduceOp op, int size) {
  if (op == mesh::ReduceOp::kAvg && !isFloating(t)) t.copy_(t.div(size, "floor"));
}

int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

/// Waits until every kernel queued on a CUDA device has finished.
void synchronizeDevice(const c10::Device& device) {
  at::detail::getCUDAHooks().deviceSynchronize(device.index());
}

/// `t` with dim `d` moved to the front, contiguous, and that dim zero-padded to `rows`.
at::Tensor frontPadded(const at::Tensor& t, int64_t d, int64_t rows) {
  at::Tensor front = t.movedim(d, 0);
  if (front.size(0) == rows) return front.contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = rows;
  at::Tensor padded = at::zeros(shape, t.options());
  padded.narrow(0, 0, front.size(0)).copy_(front);
  return padded;
}

/// `send` to be reduced in place: itself when it is a buffer of its own (frontPadded moved or
/// padded `caller`), else a copy, so that the caller's tensor is left as it was.
at::Tensor ownedCopy(const at::Tensor& send, const at::Tensor& caller) {
  if (send.storage().is_alias_of(caller.storage())) return send.clone();
  return send;
}

/// An all-gather of `local` along dim `d` whose members hold `sizes[k]` rows: the result's shape,
/// the largest piece (every member sends `most` rows, front-padded), and whether nothing moves.
struct GatherLayout {
  std::vector<int64_t> out_shape;
  int64_t most = 0;
  bool empty = false;
};

GatherLayout gatherLayout(const at::Tensor& local, int64_t d, const std::vector<int64_t>& sizes) {
  GatherLayout l;
  l.out_shape = local.sizes().vec();
  int64_t total = 0;
  for (int64_t s : sizes) {
    total += s;
    l.most = std::max(l.most, s);
  }
  l.out_shape[d] = total;
  int64_t row = 1;  // elements per unit of dim d
  for (int64_t i = 0; i < local.dim(); ++i)
    if (i != d) row *= local.size(i);
  l.empty = l.most == 0 || row == 0;
  return l;
}

/// The gathered tensor from the buffer of `sizes.size()` padded pieces of `most` rows each. When
/// no piece is padded the buffer is the result along dim 0 as it is (a gather along dim 0 copies
/// nothing more; along another dim, only the move of that dim back into place).
at::Tensor assembleGather(const at::Tensor& gathered, int64_t d, const std::vector<int64_t>& sizes,
                          int64_t most) {
  if (std::all_of(sizes.begin(), sizes.end(), [most](int64_t s) { return s == most; }))
    return gathered.movedim(0, d).contiguous();
  std::vector<at::Tensor> pieces;
  for (size_t k = 0; k < sizes.size(); ++k)
    pieces.push_back(gathered.narrow(0, static_cast<int64_t>(k) * most, sizes[k]));
  return at::cat(pieces, 0).movedim(0, d).contiguous();
}

/// A reduce-scatter of `full` along dim `d` over `size` members: this member's rows, the padded
/// piece size (torch.chunk's pieces are runs of `chunk` rows but the last ones: padding the dim to
/// size * chunk rows makes them equal), and this member's output shape.
struct ScatterLayout {
  int64_t mine = 0, chunk = 0;
  std::vector<int64_t> out_shape;
};

ScatterLayout scatterLayout(const at::Tensor& full, int64_t d, int size, int index) {
  ScatterLayout l;
  std::vector<int64_t> pieces = chunkSizes(full.size(d), size);
  l.mine = pieces[static_cast<size_t>(index)];
  l.chunk = *std::max_element(pieces.begin(), pieces.end());
  l.out_shape = full.sizes().vec();
  l.out_shape[d] = l.mine;
  return l;
}

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(std::string name, c10::intrusive_ptr<c10d::Backend> pg, int index, int size,
                   std::chrono::milliseconds timeout, c10::Device wire)
      : name_(std::move(name)),
        pg_(std::move(pg)),
        index_(index),
        size_(size),
        timeout_(timeout),
        wire_(wire) {}

  int index() const override { return index_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  at::Tensor allGather(const at::Tensor& local, int64_t dim,
                       const std::vector<int64_t>& sizes) override {
    if (offWire(local)) return allGather(local.to(wire_), dim, sizes).to(local.device());
    const char* op = "all-gather";
    int64_t d = normaliseDim(name_, op, dim, local.dim());
    checkPieceSizes(name_, op, local, d, sizes, index_);
    count(CommKind::kAllGather);
    const GatherLayout l = gatherLayout(local, d, sizes);
    if (l.empty) return at::empty(l.out_shape, local.options());
    const int64_t most = l.most;
    at::Tensor padded = frontPadded(local, d, most);
    std::vector<int64_t> gathered_shape = padded.sizes().vec();
    gathered_shape[0] = most * size_;
    at::Tensor gathered = at::empty(gathered_shape, local.options());
    at::Tensor out = wireView(gathered), in = wireView(padded);
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    run(CommKind::kAllGather, op, in, [&] { return pg_->_allgather_base(out, in, opts); });
    addBytes(CommKind::kAllGather, (size_ - 1) * bytesOf(padded));
    return assembleGather(gathered, d, sizes, most);
  }

  void allReduce(at::Tensor& t, mesh::ReduceOp op) override {
    if (offWire(t)) {
      at::Tensor staged = t.to(wire_);
      allReduce(staged, op);
      t.copy_(staged);
      return;
    }
    const char* what = "all-reduce";
    count(CommKind::kAllReduce);
    if (t.numel() == 0) return;
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    std::vector<at::Tensor> tensors{buf};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10dOp(op, buf);
    opts.timeout = timeout_;
    run(CommKind::kAllReduce, what, buf, [&] { return pg_->allreduce(tensors, opts); });
    addBytes(CommKind::kAllReduce, 2 * (size_ - 1) * bytesOf(buf) / size_);
    finishIntegerAvg(buf, op, size_);
    if (!buf.is_same(t)) t.copy_(buf);
  }

  at::Tensor reduceScatter(const at::Tensor& full, int64_t dim, mesh::ReduceOp op) override {
    if (offWire(full)) return reduceScatter(full.to(wire_), dim, op).to(full.device());
    const char* what = "reduce-scatter";
    int64_t d = normaliseDim(name_, what, dim, full.dim());
    count(CommKind::kReduceScatter);
    const ScatterLayout l = scatterLayout(full, d, size_, index_);
    const int64_t mine = l.mine, chunk = l.chunk;
    if (full.numel() == 0) return at::empty(l.out_shape, full.options());
    at::Tensor send = frontPadded(full, d, chunk * size_);
    at::Tensor recv;
    if (wire_.is_cpu()) {
      at::Tensor buf = ownedCopy(send, full);
      std::vector<at::Tensor> tensors = {buf};
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10dOp(op, full);
      opts.timeout = timeout_;
      run(CommKind::kReduceScatter, what, buf, [&] { return pg_->allreduce(tensors, opts); });
      recv = buf.narrow(0, index_ * chunk, chunk).clone();
    } else {
      std::vector<int64_t> recv_shape = send.sizes().vec();
      recv_shape[0] = chunk;
      recv = at::empty(recv_shape, full.options());
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = c10dOp(op, full);
      opts.timeout = timeout_;
      run(CommKind::kReduceScatter, what, send,
          [&] { return pg_->_reduce_scatter_base(recv, send, opts); });
    }
    addBytes(CommKind::kReduceScatter, (size_ - 1) * bytesOf(recv));
    finishIntegerAvg(recv, op, size_);
    return recv.narrow(0, 0, mine).movedim(0, d).contiguous();
  }

  at::Tensor allToAll(const at::Tensor& local, int64_t gather_dim, int64_t shard_dim,
                      const std::vector<int64_t>& gather_sizes) override {
    if (offWire(local))
      return allToAll(local.to(wire_), gather_dim, shard_dim, gather_sizes).to(local.device());
    const char* what = "all-to-all";
    int64_t g = normaliseDim(name_, what, gather_dim, local.dim());
    int64_t s = normaliseDim(name_, what, shard_dim, local.dim());
    if (g == s) throwUsage(name_, what, "gather dim and shard dim are both " + std::to_string(g));
    checkPieceSizes(name_, what, local, g, gather_sizes, index_);
    count(CommKind::kAllToAll);
    std::vector<int64_t> pieces = chunkSizes(local.size(s), size_);
    int64_t inner = 1;  // elements per unit of the gather dim in an arriving piece
    for (int64_t i = 0; i < local.dim(); ++i)
      if (i != g) inner *= i == s ? pieces[index_] : local.size(i);
    std::vector<int64_t> in_splits(size_), out_splits(size_);
    std::vector<at::Tensor> send_pieces;
    int64_t offset = 0;
    for (int q = 0; q < size_; ++q) {
      at::Tensor piece = local.narrow(s, offset, pieces[q]);
      offset += pieces[q];
      in_splits[q] = piece.numel();
      send_pieces.push_back(piece.contiguous().view(-1));
      out_splits[q] = gather_sizes[q] * inner;
    }
    int64_t out_total = 0;
    for (int64_t n : out_splits) out_total += n;
    std::vector<int64_t> out_shape = local.sizes().vec();
    out_shape[s] = pieces[index_];
    int64_t gathered = 0;
    for (int64_t n : gather_sizes) gathered += n;
    out_shape[g] = gathered;
    // Skip only when no member moves anything (the same decision on every member: the sizes
    // of the other dims, and the full shard dim, are the same everywhere).
    int64_t moved = gathered;
    for (int64_t i = 0; i < local.dim(); ++i)
      if (i != g) moved *= local.size(i);
    if (moved == 0) return at::empty(out_shape, local.options());
    at::Tensor send = at::cat(send_pieces, 0);
    at::Tensor recv = at::empty({out_total}, local.options());
    at::Tensor out = wireView(recv), in = wireView(send);
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    // c10d takes the split sizes by non-const reference and Gloo moves them into its work
    // object: hand it copies.
    std::vector<int64_t> out_copy = out_splits, in_copy = in_splits;
    run(CommKind::kAllToAll, what, in,
        [&] { return pg_->alltoall_base(out, in, out_copy, in_copy, opts); });
    addBytes(CommKind::kAllToAll,
             (local.numel() - in_splits[index_]) * static_cast<int64_t>(local.element_size()));
    std::vector<at::Tensor> arrivals;
    int64_t at_elem = 0;
    for (int k = 0; k < size_; ++k) {
      std::vector<int64_t> shape = out_shape;
      shape[g] = gather_sizes[k];
      arrivals.push_back(recv.narrow(0, at_elem, out_splits[k]).view(shape));
      at_elem += out_splits[k];
    }
    return at::cat(arrivals, g);
  }

  void broadcast(at::Tensor& t, int root_index) override {
    if (offWire(t)) {
      at::Tensor staged = t.to(wire_);
      broadcast(staged, root_index);
      t.copy_(staged);
      return;
    }
    const char* what = "broadcast";
    if (root_index < 0 || root_index >= size_)
      throwUsage(name_, what, "root index " + std::to_string(root_index) + " out of range");
    count(CommKind::kBroadcast);
    if (t.numel() == 0) return;
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    std::vector<at::Tensor> tensors{wireView(buf)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root_index;
    opts.timeout = timeout_;
    run(CommKind::kBroadcast, what, buf, [&] { return pg_->broadcast(tensors, opts); });
    if (index_ == root_index) addBytes(CommKind::kBroadcast, (size_ - 1) * bytesOf(buf));
    if (!buf.is_same(t)) t.copy_(buf);
  }

  std::unique_ptr<PendingCollective> allReduceAsync(at::Tensor& t, mesh::ReduceOp op) override {
    if (offWire(t)) {
      // Reduced on the wire's device; the wait copies the result back into `t`.
      at::Tensor staged = t.to(wire_);
      return std::make_unique<CopiedBack>(allReduceAsync(staged, op), t);
    }
    const char* what = "all-reduce";
    if (!t.is_contiguous())
      throwUsage(name_, what, "an asynchronous all-reduce needs a contiguous tensor");
    count(CommKind::kAllReduce);
    const int size = size_;
    auto pending = std::make_unique<Pending>(*this, CommKind::kAllReduce, what, [t, op, size] {
      at::Tensor r = t;
      finishIntegerAvg(r, op, size);
      return r;
    });
    if (t.numel() == 0) return pending;
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10dOp(op, t);
    opts.timeout = timeout_;
    issue(*pending, [&] { return pg_->allreduce(tensors, opts); });
    addBytes(CommKind::kAllReduce, 2 * (size_ - 1) * bytesOf(t) / size_);
    return pending;
  }

  std::unique_ptr<PendingCollective> reduceScatterAsync(const at::Tensor& full, int64_t dim,
                                                        mesh::ReduceOp op) override {
    if (offWire(full))
      return std::make_unique<CopiedBack>(reduceScatterAsync(full.to(wire_), dim, op), at::Tensor(),
                                          full.device());
    const char* what = "reduce-scatter";
    int64_t d = normaliseDim(name_, what, dim, full.dim());
    count(CommKind::kReduceScatter);
    const ScatterLayout l = scatterLayout(full, d, size_, index_);
    const int64_t mine = l.mine, chunk = l.chunk;
    if (full.numel() == 0) {
      at::Tensor empty = at::empty(l.out_shape, full.options());
      return std::make_unique<Pending>(*this, CommKind::kReduceScatter, what,
                                       [empty] { return empty; });
    }
    at::Tensor send = frontPadded(full, d, chunk * size_);
    const int size = size_;
    const int64_t piece_bytes = bytesOf(send) / size_;
    if (wire_.is_cpu()) {
      // Gloo: an allreduce of a buffer of ours, then this member's piece (see reduceScatter).
      at::Tensor buf = ownedCopy(send, full);
      const int64_t from = index_ * chunk;
      auto pending = std::make_unique<Pending>(
          *this, CommKind::kReduceScatter, what, [buf, op, size, mine, d, from, chunk] {
            at::Tensor r = buf.narrow(0, from, chunk).clone();
            finishIntegerAvg(r, op, size);
            return r.narrow(0, 0, mine).movedim(0, d).contiguous();
          });
      std::vector<at::Tensor> tensors = {buf};
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10dOp(op, full);
      opts.timeout = timeout_;
      issue(*pending, [&] { return pg_->allreduce(tensors, opts); });
      addBytes(CommKind::kReduceScatter, (size_ - 1) * piece_bytes);
      return pending;
    }
    std::vector<int64_t> recv_shape = send.sizes().vec();
    recv_shape[0] = chunk;
    at::Tensor recv = at::empty(recv_shape, full.options());
    auto pending = std::make_unique<Pending>(
        *this, CommKind::kReduceScatter, what, [recv, send, op, size, mine, d] {
          at::Tensor r = recv;
          finishIntegerAvg(r, op, size);
          return r.narrow(0, 0, mine).movedim(0, d).contiguous();
        });
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10dOp(op, full);
    opts.timeout = timeout_;
    issue(*pending, [&] { return pg_->_reduce_scatter_base(recv, send, opts); });
    addBytes(CommKind::kReduceScatter, (size_ - 1) * piece_bytes);
    return pending;
  }

  std::unique_ptr<PendingCollective> allGatherAsync(const at::Tensor& local, int64_t dim,
                                                    const std::vector<int64_t>& sizes) override {
    if (offWire(local))
      return std::make_unique<CopiedBack>(allGatherAsync(local.to(wire_), dim, sizes), at::Tensor(),
                                          local.device());
    const char* op = "all-gather";
    int64_t d = normaliseDim(name_, op, dim, local.dim());
    checkPieceSizes(name_, op, local, d, sizes, index_);
    count(CommKind::kAllGather);
    const GatherLayout l = gatherLayout(local, d, sizes);
    if (l.empty) {
      at::Tensor empty = at::empty(l.out_shape, local.options());
      return std::make_unique<Pending>(*this, CommKind::kAllGather, op, [empty] { return empty; });
    }
    const int64_t most = l.most;
    at::Tensor padded = frontPadded(local, d, most);
    std::vector<int64_t> gathered_shape = padded.sizes().vec();
    gathered_shape[0] = most * size_;
    at::Tensor gathered = at::empty(gathered_shape, local.options());
    auto pending = std::make_unique<Pending>(
        *this, CommKind::kAllGather, op,
        [gathered, padded, sizes, most, d] { return assembleGather(gathered, d, sizes, most); });
    at::Tensor out = wireView(gathered), in = wireView(padded);
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    issue(*pending, [&] { return pg_->_allgather_base(out, in, opts); });
    addBytes(CommKind::kAllGather, (size_ - 1) * bytesOf(padded));
    return pending;
  }

  void barrier() override {
    count(CommKind::kBarrier);
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    run(CommKind::kBarrier, "barrier", at::Tensor(), [&] { return pg_->barrier(opts); });
  }

 private:
  /// A tensor on another device than the backend's (a host tensor on an NCCL group: NCCL takes
  /// only CUDA tensors): the collective runs on a copy on the wire's device.
  bool offWire(const at::Tensor& t) const { return t.defined() && t.device() != wire_; }

  /// The handle of a collective run on a staged copy: wait() copies the result into `into` (an
  /// in-place all-reduce) or moves it to `device`.
  struct CopiedBack final : PendingCollective {
    CopiedBack(std::unique_ptr<PendingCollective> inner, at::Tensor into,
               c10::Device device = c10::Device(c10::kCPU))
        : inner(std::move(inner)), into(std::move(into)), device(device) {}
    at::Tensor wait() override {
      if (!result.defined()) {
        at::Tensor r = inner->wait();
        result = into.defined() ? into.copy_(r) : r.to(device);
      }
      return result;
    }
    std::unique_ptr<PendingCollective> inner;
    at::Tensor into, result;
    c10::Device device;
  };

  void count(CommKind kind) {
    ++stats_.calls;
    ++stats_.of(kind).calls;
  }
  void addBytes(CommKind kind, int64_t bytes) {
    stats_.bytes_sent += bytes;
    stats_.of(kind).bytes_sent += bytes;
  }
  /// Adds `blocked` seconds of exposed time and `in_flight` seconds of time in flight.
  void addSeconds(CommKind kind, double blocked, double in_flight) {
    stats_.seconds += blocked;
    stats_.of(kind).seconds += blocked;
    stats_.in_flight_seconds += in_flight;
    stats_.of(kind).in_flight_seconds += in_flight;
  }
  static double seconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
  }

  /// Drops a waited Work once Gloo's worker thread has let go of it. Gloo marks a Work completed
  /// before its worker drops its own reference, and the tensors the Work holds (the call's
  /// buffers, a flat copy) are freed by whichever reference goes last: on the worker thread, at a
  /// time that varied from run to run, and the step's peak memory with it (hf_llama_tiny's fsdp
  /// plan measured 3.15 or 3.56 MiB, mlp_stack's 8.9 or 10.4). Here they are freed by the caller,
  /// when the collective returns, where the memory model frees them. Gloo only (a CPU wire):
  /// NCCL's watchdog keeps its Works for a while, and CUDA memory is freed in stream order
  /// anyway. Bounded: a backend that holds its reference past 2 s (a LibTorch that keeps its Works;
  /// a loaded machine's descheduled worker lets go in microseconds to milliseconds) is left to it,
  /// and from then on not waited for.
  void releaseWork(c10::intrusive_ptr<c10d::Work>& work) {
    if (!work) return;
    if (wire_.is_cpu() && !keeps_works_) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (work.use_count() > 1) {
        if (std::chrono::steady_clock::now() > until) {
          keeps_works_ = true;
          break;
        }
        std::this_thread::yield();
      }
    }
    work.reset();
  }

  /// An asynchronous collective: c10d's Work, what turns its buffers into the result, and when it
  /// was issued. Completion is stamped by a callback on the Work's future (on the backend's
  /// thread) when the backend has one, else taken as the end of the wait. Without a Work (nothing
  /// to move) wait() only returns the result.
  struct Pending final : PendingCollective {
    Pending(C10dCommunicator& comm, CommKind kind, const char* what,
            std::function<at::Tensor()> finish)
        : comm(comm),
          kind(kind),
          what(what),
          finish(std::move(finish)),
          issued(std::chrono::steady_clock::now()) {}

    void watchCompletion() {
      try {
        c10::intrusive_ptr<c10::ivalue::Future> future = work->getFuture();
        if (!future) return;
        std::shared_ptr<std::atomic<int64_t>> stamp = done_ns;
        future->addCallback([stamp](c10::ivalue::Future&) {
          stamp->store(std::chrono::steady_clock::now().time_since_epoch().count());
        });
      } catch (const std::exception&) {
        // No future on this backend: completion is the end of the wait.
      }
    }

    at::Tensor wait() override {
      if (waited) return result;
      waited = true;
      if (work) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto latency = injectedCommLatency();
        if (latency.count() > 0) std::this_thread::sleep_until(issued + latency);
        try {
          work->wait(comm.timeout_);
        } catch (const c10::Error& e) {
          rethrowIfOutOfMemory(e);
          throw CommError(
              describeFailure(comm.name_, what, e.what_without_backtrace(), comm.timeout_));
        } catch (const std::exception& e) {
          rethrowIfOutOfMemory(e);
          throw CommError(describeFailure(comm.name_, what, e.what(), comm.timeout_));
        }
        const auto t1 = std::chrono::steady_clock::now();
        // Completed when the backend said so, but not before the injected latency ran out.
        auto done = t1;
        if (const int64_t ns = done_ns->load(); ns > 0)
          done = std::min(
              t1, std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(ns)));
        done = std::max(done, std::min(t1, issued + latency));
        comm.addSeconds(kind, seconds(t1 - t0), seconds(done - issued));
        comm.markBusy(issued, done);
      }
      comm.releaseWork(work);
      result = finish();
      finish = nullptr;  // drops the buffers it held
      return result;
    }

    C10dCommunicator& comm;
    CommKind kind;
    const char* what;
    std::function<at::Tensor()> finish;
    at::Tensor result;
    c10::intrusive_ptr<c10d::Work> work;
    std::chrono::steady_clock::time_point issued;
    std::shared_ptr<std::atomic<int64_t>> done_ns = std::make_shared<std::atomic<int64_t>>(0);
    bool waited = false;
  };

  /// Issues `pending`'s collective (`start` returns its Work) and counts it as asynchronous; the
  /// issue's own time is exposed.
  template <typename Start>
  void issue(Pending& pending, Start&& start) {
    ++stats_.async_calls;
    ++stats_.of(pending.kind).async_calls;
    pending.issued = std::chrono::steady_clock::now();
    try {
      pending.work = start();
    } catch (const c10::Error& e) {
      rethrowIfOutOfMemory(e);
      throw CommError(describeFailure(name_, pending.what, e.what_without_backtrace(), timeout_));
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      throw CommError(describeFailure(name_, pending.what, e.what(), timeout_));
    }
    pending.watchCompletion();
    addSeconds(pending.kind, seconds(std::chrono::steady_clock::now() - pending.issued), 0);
  }

  /// Starts and waits for one collective; its wall time goes to the counters of `kind`. `ref`
  /// (a buffer of the call, undefined for a barrier) tells whether the device must be
  /// synchronized around it (setSynchronizedCommTiming).
  template <typename Start>
  void run(CommKind kind, const char* what, const at::Tensor& ref, Start&& start) {
    const bool sync = ref.defined() && ref.is_cuda() && synchronizedCommTiming();
    if (sync) synchronizeDevice(ref.device());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c10::intrusive_ptr<c10d::Work> work = start();
      work->wait(timeout_);
      releaseWork(work);
      if (sync) synchronizeDevice(ref.device());
      const auto latency = injectedCommLatency();
      if (latency.count() > 0) std::this_thread::sleep_until(t0 + latency);
    } catch (const c10::Error& e) {
      rethrowIfOutOfMemory(e);
      throw CommError(describeFailure(name_, what, e.what_without_backtrace(), timeout_));
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      throw CommError(describeFailure(name_, what, e.what(), timeout_));
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double dt = seconds(t1 - t0);
    addSeconds(kind, dt, dt);
    markBusy(t0, t1);
  }

  std::string name_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  int index_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::Device wire_;
  bool keeps_works_ = false;  // releaseWork gave up waiting once: the backend keeps its Works
};

}  // namespace

std::unique_ptr<Communicator> makeC10dCommunicator(std::string name,
                                                   c10::intrusive_ptr<c10d::Backend> backend,
                                                   int index, int size,
                                                   std::chrono::milliseconds timeout,
                                                   c10::Device wire) {
  return std::make_unique<C10dCommunicator>(std::move(name), std::move(backend), index, size,
                                            timeout, wire);
}

std::shared_ptr<gloo::transport::Device> makeGlooDevice(const std::string& master_addr) {
  try {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    if (master_addr.rfind("127.", 0) == 0 || master_addr == "localhost" || master_addr == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    throw CommError("cannot create the Gloo transport device: " +
                    firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    throw CommError("cannot create the Gloo transport device: " + firstLine(e.what()));
  }
}

std::unique_ptr<Communicator> makeGlooCommunicator(
    std::string name, const c10::intrusive_ptr<c10d::Store>& store, int index, int size,
    const std::shared_ptr<gloo::transport::Device>& device, std::chrono::milliseconds timeout) {
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(device);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, index, size, options);
    return makeC10dCommunicator(std::move(name), std::move(pg), index, size, timeout);
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(describeFailure(name, "group set-up", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(describeFailure(name, "group set-up", e.what(), timeout));
  }
}

}  // namespace apc::runtime::detail
