//===- lib/runtime/nccl_comm.cpp - Communicator calling NCCL directly -------===//
//
// Built only when CMake finds CUDA and NCCL (APC_HAVE_NCCL); it runs only with a CUDA LibTorch
// (World::create refuses Backend::kNccl when at::hasCUDA() is false). Debian's LibTorch has no
// ProcessGroupNCCL, so this calls NCCL itself:
//
//   set-up        member 0 makes an ncclUniqueId and puts it in the group's store; every member
//                 reads it (waiting at most the set-up timeout), selects CUDA device LOCAL_RANK and
//                 calls ncclCommInitRankConfig with blocking = 0, polled to completion
//   all-gather    pad the local to the largest piece, ncclAllGather (bytes), trim, concatenate
//   all-reduce    ncclAllReduce in place (avg: ncclAvg for floating types, sum + floor division
//                 for integers); bf16 and f16 reduce natively
//   reduce-scatter  move the dim to the front, pad it to p equal pieces, ncclReduceScatter, trim
//   all-to-all    ncclSend/ncclRecv of the torch.chunk pieces inside ncclGroupStart/End
//   broadcast     ncclBroadcast (bytes)
//   barrier       a one-element all-reduce
//
// Everything is enqueued on the current CUDA stream of the device (c10::cuda's, when the LibTorch
// has CUDA; else the legacy default stream). Timeouts: after enqueueing, the call records an
// event and polls cudaEventQuery and ncclCommGetAsyncError until the collective is done, an error
// appears (CommError "<group>: <op> failed: NCCL <error>: <last error>"), or the timeout passes
// (ncclCommAbort, then CommError "<group>: <op> timed out after <ms> ms"). Every collective thus
// completes before it returns (like NCCL_BLOCKING_WAIT in PyTorch): simple and bounded, at the
// price of host/device overlap. After an abort the communicator refuses further calls.
//
// Bytes counted: as in gloo_comm.cpp (all-gather (p-1) * padded local, all-reduce 2 (p-1)/p n,
// reduce-scatter (p-1) * padded piece, all-to-all local - own piece, broadcast root (p-1) n).
//
//===----------------------------------------------------------------------===//
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef APC_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "comm_internal.h"

namespace apc::runtime::detail {
namespace {

using Clock = std::chrono::steady_clock;

int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

/// NCCL's type for a reduction of `t`; throws for types NCCL cannot reduce.
ncclDataType_t reduceType(const std::string& group, const char* op, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    default:
      throwUsage(group, op, std::string("NCCL cannot reduce ") + c10::toString(t));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, int index, int size, int device,
                   std::chrono::milliseconds timeout)
      : name_(std::move(name)), index_(index), size_(size), device_(device), timeout_(timeout) {}

  ~NcclCommunicator() override {
    // Abort rather than destroy: it never waits for peers that may be gone.
    if (comm_ && !aborted_) ncclCommAbort(comm_);
    if (event_) cudaEventDestroy(event_);
  }

  void init(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds setup_timeout) {
    const char* what = "group set-up";
    ncclUniqueId id;
    try {
      if (index_ == 0) {
        check(what, ncclGetUniqueId(&id), /*enqueued=*/false);
        std::vector<uint8_t> bytes(sizeof id);
        std::memcpy(bytes.data(), &id, sizeof id);
        store->set("nccl_unique_id", bytes);
      } else {
        store->wait({"nccl_unique_id"}, setup_timeout);
        std::vector<uint8_t> bytes = store->get("nccl_unique_id");
        if (bytes.size() != sizeof id) throw CommError(name_ + ": " + what + ": bad NCCL id");
        std::memcpy(&id, bytes.data(), sizeof id);
      }
    } catch (const c10::Error& e) {
      throw CommError(describeFailure(name_, what, e.what_without_backtrace(), setup_timeout));
    }
    cuda(what, cudaSetDevice(device_));
    cuda(what, cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(what, ncclCommInitRankConfig(&comm_, size_, id, index_, &config), false);
    wait(what, /*with_event=*/false, setup_timeout);
  }

  int index() const override { return index_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  at::Tensor allGather(const at::Tensor& local, int64_t dim,
                       const std::vector<int64_t>& sizes) override {
    const char* what = "all-gather";
    int64_t d = normaliseDim(name_, what, dim, local.dim());
    checkPieceSizes(name_, what, local, d, sizes, index_);
    ++stats_.calls;
    std::vector<int64_t> out_shape = local.sizes().vec();
    int64_t total = 0, most = 0;
    for (int k = 0; k < size_; ++k) {
      total += sizes[k];
      most = std::max(most, sizes[k]);
    }
    out_shape[d] = total;
    std::vector<int64_t> padded_shape = local.sizes().vec();
    padded_shape[d] = most;
    int64_t padded_numel = 1;
    for (int64_t s : padded_shape) padded_numel *= s;
    if (padded_numel == 0) return at::empty(out_shape, local.options());
    at::Tensor padded = local.contiguous();
    if (local.size(d) < most) {
      padded = at::zeros(padded_shape, local.options());
      padded.narrow(d, 0, local.size(d)).copy_(local);
    }
    std::vector<int64_t> gathered_shape = padded_shape;
    gathered_shape.insert(gathered_shape.begin(), size_);
    at::Tensor gathered = at::empty(gathered_shape, local.options());
    prepare(what);
    check(what, ncclAllGather(padded.data_ptr(), gathered.data_ptr(), bytesOf(padded), ncclUint8,
                              comm_, stream()));
    wait(what, true, timeout_);
    stats_.bytes_sent += (size_ - 1) * bytesOf(padded);
    std::vector<at::Tensor> pieces;
    for (int k = 0; k < size_; ++k) pieces.push_back(gathered[k].narrow(d, 0, sizes[k]));
    return at::cat(pieces, d);
  }

  void allReduce(at::Tensor& t, mesh::ReduceOp op) override {
    const char* what = "all-reduce";
    ++stats_.calls;
    if (t.numel() == 0) return;
    ncclDataType_t type = reduceType(name_, what, t.scalar_type());
    bool floating = at::isFloatingType(t.scalar_type());
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    prepare(what);
    check(what, ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), type,
                              redOp(op, floating), comm_, stream()));
    wait(what, true, timeout_);
    stats_.bytes_sent += 2 * (size_ - 1) * bytesOf(buf) / size_;
    if (op == mesh::ReduceOp::kAvg && !floating) buf.copy_(buf.div(size_, "floor"));
    if (!buf.is_same(t)) t.copy_(buf);
  }

  at::Tensor reduceScatter(const at::Tensor& full, int64_t dim, mesh::ReduceOp op) override {
    const char* what = "reduce-scatter";
    int64_t d = normaliseDim(name_, what, dim, full.dim());
    ++stats_.calls;
    int64_t n = full.size(d);
    int64_t chunk = (n + size_ - 1) / size_;
    int64_t mine = std::vector<int64_t>(chunkSizes(n, size_))[index_];
    std::vector<int64_t> out_shape = full.sizes().vec();
    out_shape[d] = mine;
    if (full.numel() == 0) return at::empty(out_shape, full.options());
    ncclDataType_t type = reduceType(name_, what, full.scalar_type());
    bool floating = at::isFloatingType(full.scalar_type());
    at::Tensor moved = full.movedim(d, 0);
    std::vector<int64_t> padded_shape = moved.sizes().vec();
    padded_shape[0] = chunk * size_;
    at::Tensor send = at::zeros(padded_shape, full.options());
    send.narrow(0, 0, n).copy_(moved);
    std::vector<int64_t> recv_shape = padded_shape;
    recv_shape[0] = chunk;
    at::Tensor recv = at::empty(recv_shape, full.options());
    prepare(what);
    check(what, ncclReduceScatter(send.data_ptr(), recv.data_ptr(), recv.numel(), type,
                                  redOp(op, floating), comm_, stream()));
    wait(what, true, timeout_);
    stats_.bytes_sent += (size_ - 1) * bytesOf(recv);
    if (op == mesh::ReduceOp::kAvg && !floating) recv = recv.div(size_, "floor");
    return recv.narrow(0, 0, mine).movedim(0, d).contiguous();
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
    std::vector<int64_t> out_shape = local.sizes().vec();
    out_shape[s] = pieces[index_];
    int64_t gathered = 0;
    for (int64_t k : gather_sizes) gathered += k;
    out_shape[g] = gathered;
    std::vector<at::Tensor> sends, recvs;
    int64_t offset = 0;
    for (int q = 0; q < size_; ++q) {
      sends.push_back(local.narrow(s, offset, pieces[q]).contiguous());
      offset += pieces[q];
      std::vector<int64_t> shape = out_shape;
      shape[g] = gather_sizes[q];
      recvs.push_back(at::empty(shape, local.options()));
    }
    prepare(what);
    check(what, ncclGroupStart());
    for (int q = 0; q < size_; ++q) {
      if (q == index_) continue;
      if (sends[q].numel() > 0)
        check(what,
              ncclSend(sends[q].data_ptr(), bytesOf(sends[q]), ncclUint8, q, comm_, stream()));
      if (recvs[q].numel() > 0)
        check(what,
              ncclRecv(recvs[q].data_ptr(), bytesOf(recvs[q]), ncclUint8, q, comm_, stream()));
    }
    check(what, ncclGroupEnd());
    wait(what, true, timeout_);
    recvs[index_].copy_(sends[index_]);
    stats_.bytes_sent += bytesOf(local) - bytesOf(sends[index_]);
    return at::cat(recvs, g);
  }

  void broadcast(at::Tensor& t, int root_index) override {
    const char* what = "broadcast";
    if (root_index < 0 || root_index >= size_)
      throwUsage(name_, what, "root index " + std::to_string(root_index) + " out of range");
    ++stats_.calls;
    if (t.numel() == 0) return;
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    prepare(what);
    check(what, ncclBroadcast(buf.data_ptr(), buf.data_ptr(), bytesOf(buf), ncclUint8, root_index,
                              comm_, stream()));
    wait(what, true, timeout_);
    if (index_ == root_index) stats_.bytes_sent += (size_ - 1) * bytesOf(buf);
    if (!buf.is_same(t)) t.copy_(buf);
  }

  void barrier() override {
    const char* what = "barrier";
    ++stats_.calls;
    at::Tensor one =
        at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    prepare(what);
    check(what,
          ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream()));
    wait(what, true, timeout_);
  }

 private:
  static ncclRedOp_t redOp(mesh::ReduceOp op, bool floating) {
    switch (op) {
      case mesh::ReduceOp::kMax:
        return ncclMax;
      case mesh::ReduceOp::kMin:
        return ncclMin;
      case mesh::ReduceOp::kAvg:
        return floating ? ncclAvg : ncclSum;
      default:
        return ncclSum;
    }
  }

  cudaStream_t stream() const {
#ifdef APC_TORCH_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
    return nullptr;
#endif
  }

  void prepare(const char* what) {
    if (aborted_) throw CommError(name_ + ": " + what + " failed: the group was aborted earlier");
    cuda(what, cudaSetDevice(device_));
  }

  [[noreturn]] void fail(const char* what, const std::string& message,
                         std::chrono::milliseconds timeout) {
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    throw CommError(describeFailure(name_, what, message, timeout));
  }

  void cuda(const char* what, cudaError_t e) {
    if (e != cudaSuccess) fail(what, std::string("CUDA ") + cudaGetErrorString(e), timeout_);
  }

  /// Checks an NCCL call; ncclInProgress (non-blocking communicator) is fine, wait() finishes it.
  void check(const char* what, ncclResult_t r, bool enqueued = true) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string last = comm_ ? ncclGetLastError(comm_) : "";
    fail(what, std::string("NCCL ") + ncclGetErrorString(r) + (last.empty() ? "" : ": " + last),
         timeout_);
  }

  /// Polls until the communicator has finished enqueueing (a non-blocking communicator may
  /// return ncclInProgress before the kernels are on the stream), then, `with_event`, records an
  /// event and polls it until the work is done; fails on an asynchronous error or after `timeout`.
  void wait(const char* what, bool with_event, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    bool recorded = false;
    for (int spin = 0;; ++spin) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        std::string last = ncclGetLastError(comm_);
        fail(what,
             std::string("NCCL ") + ncclGetErrorString(async) + (last.empty() ? "" : ": " + last),
             timeout);
      }
      if (async == ncclSuccess) {
        if (!with_event) return;
        if (!recorded) {
          cuda(what, cudaEventRecord(event_, stream()));
          recorded = true;
        }
        cudaError_t e = cudaEventQuery(event_);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) cuda(what, e);
      }
      if (Clock::now() > deadline) fail(what, "timed out", timeout);
      if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::string name_;
  int index_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t event_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Communicator> makeNcclCommunicator(std::string name,
                                                   const c10::intrusive_ptr<c10d::Store>& store,
                                                   int index, int size, int device,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::milliseconds setup_timeout) {
  auto comm = std::make_unique<NcclCommunicator>(std::move(name), index, size, device, timeout);
  comm->init(store, setup_timeout);
  return comm;
}

}  // namespace apc::runtime::detail
