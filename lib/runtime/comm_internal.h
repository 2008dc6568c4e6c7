//===- lib/runtime/comm_internal.h - Shared pieces of the communicators ---*- C++ -*-===//
//
// Private to lib/runtime: group names, torch.chunk piece arithmetic, the one-line CommError text,
// the communicator of a one-rank group (every collective is a local copy), and the factories of the
// Gloo and NCCL communicators that World::create calls.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "apc/runtime/comm.h"

namespace c10d {
class Backend;
class Store;
}  // namespace c10d
namespace gloo::transport {
class Device;
}

namespace apc::runtime::detail {

/// "mesh dim 1 (tp) ranks {4,5,6,7}"; `dim` < 0 names the world group: "world ranks {0,1,2,3}".
std::string groupName(const mesh::DeviceMesh& mesh, int dim, const std::vector<int64_t>& ranks);

/// torch.chunk piece sizes of a dim of length `n` cut into `p` pieces.
std::vector<int64_t> chunkSizes(int64_t n, int p);

/// The first line of an exception text, without Gloo's "[file.cc:123] " location prefix.
std::string firstLine(std::string_view text);

/// "<group>: <op> timed out after <ms> ms" when `message` is a timeout, else
/// "<group>: <op> failed: <first line of message>".
std::string describeFailure(const std::string& group, const char* op, std::string_view message,
                            std::chrono::milliseconds timeout);

/// Throws CommError("<group>: <op>: <what>") for a caller's mistake (bad sizes, bad dims).
[[noreturn]] void throwUsage(const std::string& group, const char* op, const std::string& what);

/// Checks `sizes` (one per member, `local` is member `index`'s piece along `dim`).
void checkPieceSizes(const std::string& group, const char* op, const at::Tensor& local, int64_t dim,
                     const std::vector<int64_t>& sizes, int index);

/// Normalises a possibly negative dim of a tensor of rank `ndim`; throws CommError when out of
/// range.
int64_t normaliseDim(const std::string& group, const char* op, int64_t dim, int64_t ndim);

/// Reduces `stacked` (pieces along dim 0) with `op` into one piece, accumulating 16-bit floats in
/// f32; the result has `stacked`'s dtype. `group_size` divides for kAvg.
at::Tensor reduceStacked(const at::Tensor& stacked, mesh::ReduceOp op, int64_t group_size);

/// The communicator of a group of one rank: no communication, results are copies.
std::unique_ptr<Communicator> makeLocalCommunicator(std::string name);

/// The communicator of a group over a c10d backend (ProcessGroupGloo or ProcessGroupNCCL): every
/// collective is one c10d call waited on with `timeout` (lib/runtime/c10d_comm.cpp). `wire` is the
/// device the backend moves tensors on (CPU for Gloo, the rank's CUDA device for NCCL): a tensor
/// handed over on another device is staged through it.
std::unique_ptr<Communicator> makeC10dCommunicator(std::string name,
                                                   c10::intrusive_ptr<c10d::Backend> backend,
                                                   int index, int size,
                                                   std::chrono::milliseconds timeout,
                                                   c10::Device wire = c10::Device(c10::kCPU));

/// The Gloo transport device shared by the groups of one World: GLOO_SOCKET_IFNAME's interface when
/// set, else loopback when the master address is a loopback one, else the host's own address.
/// Throws CommError.
std::shared_ptr<gloo::transport::Device> makeGlooDevice(const std::string& master_addr);

/// Gloo communicator over c10d::ProcessGroupGloo; rendezvous through `store` (a PrefixStore unique
/// to the group). Throws CommError naming the group when the set-up fails.
std::unique_ptr<Communicator> makeGlooCommunicator(
    std::string name, const c10::intrusive_ptr<c10d::Store>& store, int index, int size,
    const std::shared_ptr<gloo::transport::Device>& device, std::chrono::milliseconds timeout);

#ifdef APC_HAVE_NCCL
/// NCCL communicator on CUDA device `device`; the unique id travels through `store`. Throws
/// CommError naming the group when the set-up fails or takes longer than `setup_timeout`.
std::unique_ptr<Communicator> makeNcclCommunicator(std::string name,
                                                   const c10::intrusive_ptr<c10d::Store>& store,
                                                   int index, int size, int device,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::milliseconds setup_timeout);
#endif

}  // namespace apc::runtime::detail
