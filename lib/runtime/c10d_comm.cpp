//===- lib/runtime/gloo_comm.cpp - Communicator over c10d::ProcessGroupGloo -===//
//
// One ProcessGroupGloo per group, created over a PrefixStore unique to the group. What 1.13's
// Gloo lacks is composed from what it has:
//
//   collective       how                                          bytes counted (this rank)
//   all-gather       pad the local to the largest piece, list     (p-1) * padded local bytes
//                    all-gather, trim each piece, concatenate     (ring all-gather)
//   all-reduce       fp32/fp64/integers: Gloo all-reduce (ring)   2 (p-1)/p * bytes
//                    bf16/f16: reduce-scatter by alltoall_base    (p-1) * ceil(n/p) elements
//                    of the flattened tensor padded to p equal    for each of the two steps:
//                    pieces, local reduction in f32, downcast,    2 (p-1) ceil(n/p) * 2 bytes,
//                    list all-gather (the ring's steps, the       the bytes of a 16-bit ring
//                    16-bit bytes on the wire, f32 accumulation)
//   reduce-scatter   alltoall_base with the torch.chunk pieces    full bytes - own piece bytes
//                    as split sizes, local reduction of the p      = (p-1)/p n when even
//                    arrivals (f32 for 16-bit). Chosen over
//                    all-reduce + narrow, which sends 2 (p-1)/p n
//   all-to-all       alltoall_base with uneven split sizes        local bytes - own piece bytes
//   broadcast        Gloo broadcast                               root: (p-1) * bytes, others 0
//   barrier          Gloo barrier                                 0
//
// The counted bytes are those of the algorithm run on the buffers handed to Gloo (padding
// included), so for even pieces they equal the formulas of apc/cost/collectives.h. Avg is a sum
// divided by the group size (Gloo has no avg). Gloo moves bytes without looking at them, so bf16
// and 16-bit integers travel viewed as f16 and bool as uint8 (Gloo's type switch lacks them).
//
// Timeouts: the group's Options carry the timeout (Gloo's own per-operation deadline) and every
// Work is waited on with the same timeout; either way a CommError "<group>: <op> timed out after
// <ms> ms". A peer that died shows up as Gloo's "Connection closed by peer" (the process ignores
// SIGPIPE, see world.cpp) and becomes "<group>: <op> failed: <Gloo's first line>". After a
// CommError the group is unusable: the caller is expected to exit.
//
//===----------------------------------------------------------------------===//
#include <cstdlib>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm_internal.h"

namespace apc::runtime::detail {
namespace {

/// A view of `t` whose dtype Gloo can move (same bytes).
at::Tensor wireView(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16:
    case at::kShort:
      return t.view(at::kHalf);
    case at::kBool:
      return t.view(at::kByte);
    default:
      return t;
  }
}

c10d::ReduceOp glooOp(mesh::ReduceOp op) {
  switch (op) {
    case mesh::ReduceOp::kMax:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case mesh::ReduceOp::kMin:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    default:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}

int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::string name, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int index,
                   int size, std::chrono::milliseconds timeout)
      : name_(std::move(name)), pg_(std::move(pg)), index_(index), size_(size), timeout_(timeout) {}

  int index() const override { return index_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  at::Tensor allGather(const at::Tensor& local, int64_t dim,
                       const std::vector<int64_t>& sizes) override {
    const char* op = "all-gather";
    int64_t d = normaliseDim(name_, op, dim, local.dim());
    checkPieceSizes(name_, op, local, d, sizes, index_);
    ++stats_.calls;
    std::vector<int64_t> out_shape = local.sizes().vec();
    int64_t total = 0, most = 0;
    for (int k = 0; k < size_; ++k) {
      total += sizes[k];
      most = std::max(most, sizes[k]);
    }
    out_shape[d] = total;
    int64_t row = local.numel() / std::max<int64_t>(local.size(d), 1);
    if (local.size(d) == 0) {
      row = 1;
      for (int64_t i = 0; i < local.dim(); ++i)
        if (i != d) row *= local.size(i);
    }
    if (most == 0 || row == 0) return at::empty(out_shape, local.options());
    at::Tensor padded = local.contiguous();
    if (local.size(d) < most) {
      std::vector<int64_t> shape = local.sizes().vec();
      shape[d] = most;
      padded = at::zeros(shape, local.options());
      padded.narrow(d, 0, local.size(d)).copy_(local);
    }
    std::vector<at::Tensor> input{wireView(padded)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int k = 0; k < size_; ++k) output[0].push_back(at::empty_like(input[0]));
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    run(op, [&] { return pg_->allgather(output, input, opts); });
    stats_.bytes_sent += (size_ - 1) * bytesOf(padded);
    std::vector<at::Tensor> pieces;
    for (int k = 0; k < size_; ++k) {
      at::Tensor piece = output[0][k].view(local.scalar_type());
      pieces.push_back(sizes[k] == most ? piece : piece.narrow(d, 0, sizes[k]));
    }
    return at::cat(pieces, d);
  }

  void allReduce(at::Tensor& t, mesh::ReduceOp op) override {
    const char* what = "all-reduce";
    ++stats_.calls;
    if (t.numel() == 0) return;
    at::ScalarType dtype = t.scalar_type();
    if (dtype == at::kBFloat16 || dtype == at::kHalf) {
      allReduce16(t, op);
      return;
    }
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    std::vector<at::Tensor> tensors{buf};
    c10d::AllreduceOptions opts;
    opts.reduceOp = glooOp(op);
    opts.timeout = timeout_;
    run(what, [&] { return pg_->allreduce(tensors, opts); });
    stats_.bytes_sent += 2 * (size_ - 1) * bytesOf(buf) / size_;
    if (op == mesh::ReduceOp::kAvg) {
      if (at::isFloatingType(dtype))
        buf.div_(static_cast<double>(size_));
      else
        buf.copy_(buf.div(size_, "floor"));
    }
    if (!buf.is_same(t)) t.copy_(buf);
  }

  at::Tensor reduceScatter(const at::Tensor& full, int64_t dim, mesh::ReduceOp op) override {
    const char* what = "reduce-scatter";
    int64_t d = normaliseDim(name_, what, dim, full.dim());
    ++stats_.calls;
    std::vector<int64_t> pieces = chunkSizes(full.size(d), size_);
    int64_t mine = pieces[index_];
    std::vector<int64_t> out_shape = full.sizes().vec();
    out_shape[d] = mine;
    if (full.numel() == 0) return at::empty(out_shape, full.options());
    // Move d to the front so that the pieces are contiguous runs of rows of the send buffer.
    at::Tensor send = full.movedim(d, 0).contiguous();
    std::vector<int64_t> recv_shape = send.sizes().vec();
    recv_shape[0] = mine * size_;
    at::Tensor recv = at::empty(recv_shape, full.options());
    std::vector<int64_t> out_splits(size_, mine);
    alltoall(what, recv, send, out_splits, pieces);
    int64_t row = send.numel() / send.size(0);
    stats_.bytes_sent += (full.size(d) - mine) * row * static_cast<int64_t>(full.element_size());
    std::vector<int64_t> stacked_shape = recv_shape;
    stacked_shape[0] = mine;
    stacked_shape.insert(stacked_shape.begin(), size_);
    at::Tensor reduced = reduceStacked(recv.view(stacked_shape), op, size_);
    return reduced.movedim(0, d).contiguous();
  }

  at::Tensor allToAll(const at::Tensor& local, int64_t gather_dim, int64_t shard_dim,
                      const std::vector<int64_t>& gather_sizes) override {
    const char* what = "all-to-all";
    int64_t g = normaliseDim(name_, what, gather_dim, local.dim());
    int64_t s = normaliseDim(name_, what, shard_dim, local.dim());
    if (g == s) throwUsage(name_, what, "gather dim and shard dim are both " + std::to_string(g));
    checkPieceSizes(name_, what, local, g, gather_sizes, index_);
    ++stats_.calls;
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
    alltoall(what, recv, send, out_splits, in_splits);
    stats_.bytes_sent +=
        (local.numel() - in_splits[index_]) * static_cast<int64_t>(local.element_size());
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
    const char* what = "broadcast";
    if (root_index < 0 || root_index >= size_)
      throwUsage(name_, what, "root index " + std::to_string(root_index) + " out of range");
    ++stats_.calls;
    if (t.numel() == 0) return;
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    std::vector<at::Tensor> tensors{wireView(buf)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root_index;
    opts.timeout = timeout_;
    run(what, [&] { return pg_->broadcast(tensors, opts); });
    if (index_ == root_index) stats_.bytes_sent += (size_ - 1) * bytesOf(buf);
    if (!buf.is_same(t)) t.copy_(buf);
  }

  void barrier() override {
    ++stats_.calls;
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    run("barrier", [&] { return pg_->barrier(opts); });
  }

 private:
  /// bf16/f16 all-reduce: reduce-scatter (alltoall of p equal pieces of the padded flat tensor),
  /// f32 reduction, downcast, list all-gather.
  void allReduce16(at::Tensor& t, mesh::ReduceOp op) {
    const char* what = "all-reduce";
    int64_t n = t.numel();
    int64_t chunk = (n + size_ - 1) / size_;
    at::Tensor flat;
    if (chunk * size_ == n && t.is_contiguous()) {
      flat = t.view({-1});  // only read
    } else {
      flat = at::zeros({chunk * size_}, t.options());
      flat.narrow(0, 0, n).copy_(t.reshape({-1}));
    }
    at::Tensor recv = at::empty({chunk * size_}, t.options());
    std::vector<int64_t> splits(size_, chunk);
    alltoall(what, recv, flat, splits, splits);
    at::Tensor mine = reduceStacked(recv.view({size_, chunk}), op, size_).contiguous();
    std::vector<at::Tensor> input{wireView(mine)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int k = 0; k < size_; ++k) output[0].push_back(at::empty_like(input[0]));
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    run(what, [&] { return pg_->allgather(output, input, opts); });
    stats_.bytes_sent += 2 * (size_ - 1) * chunk * static_cast<int64_t>(t.element_size());
    // Straight into t's storage when it is contiguous (one pass), else through a gathered copy.
    at::Tensor dest = t.is_contiguous() ? t.view({-1}) : at::empty({n}, t.options());
    for (int k = 0; k < size_; ++k) {
      int64_t len = std::min(chunk, n - k * chunk);
      if (len <= 0) break;
      dest.narrow(0, k * chunk, len).copy_(output[0][k].view(t.scalar_type()).narrow(0, 0, len));
    }
    if (!t.is_contiguous()) t.copy_(dest.view(t.sizes()));
  }

  void alltoall(const char* what, at::Tensor& recv, const at::Tensor& send,
                std::vector<int64_t> out_splits, std::vector<int64_t> in_splits) {
    at::Tensor out = wireView(recv), in = wireView(send);
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    run(what, [&] { return pg_->alltoall_base(out, in, out_splits, in_splits, opts); });
  }

  template <typename Start>
  void run(const char* what, Start&& start) {
    try {
      c10::intrusive_ptr<c10d::Work> work = start();
      work->wait(timeout_);
    } catch (const c10::Error& e) {
      throw CommError(describeFailure(name_, what, e.what_without_backtrace(), timeout_));
    } catch (const std::exception& e) {
      throw CommError(describeFailure(name_, what, e.what(), timeout_));
    }
  }

  std::string name_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int index_;
  int size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::shared_ptr<gloo::transport::Device> makeGlooDevice(const std::string& master_addr) {
  try {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    if (master_addr.rfind("127.", 0) == 0 || master_addr == "localhost" || master_addr == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const c10::Error& e) {
    throw CommError("cannot create the Gloo transport device: " +
                    firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
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
    return std::make_unique<GlooCommunicator>(std::move(name), std::move(pg), index, size, timeout);
  } catch (const c10::Error& e) {
    throw CommError(describeFailure(name, "group set-up", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    throw CommError(describeFailure(name, "group set-up", e.what(), timeout));
  }
}

}  // namespace apc::runtime::detail
