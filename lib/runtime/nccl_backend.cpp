//===- lib/runtime/nccl_backend.cpp - ProcessGroupNCCL for a group ----------===//
//
// Built only against a CUDA LibTorch (APC_HAVE_NCCL: CMake found c10_cuda and nccl.h). The group's
// collectives run through the same code as Gloo's (c10d_comm.cpp) over c10d::ProcessGroupNCCL:
// one code path for both backends instead of calling NCCL by hand.
//
// Set-up: the rank selects CUDA device LOCAL_RANK; the process group exchanges NCCL's unique id
// through the group's PrefixStore, like torch.distributed does. Timeouts: the group's Options carry
// the timeout and TORCH_NCCL_BLOCKING_WAIT=1 (unless the user set it) makes Work::wait throw when
// a collective outlives it instead of the watchdog ending the process, so a dead peer is a
// CommError like Gloo's, never a hang.
//
//===----------------------------------------------------------------------===//
#include <cstdlib>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "apc/support/activity.h"
#include "comm_internal.h"

namespace apc::runtime::detail {

std::unique_ptr<Communicator> makeNcclCommunicator(std::string name,
                                                   const c10::intrusive_ptr<c10d::Store>& store,
                                                   int index, int size, int device,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::milliseconds setup_timeout) {
  try {
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    if (device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
      throw CommError(name + ": group set-up failed: LOCAL_RANK " + std::to_string(device) +
                      " but this machine has " + std::to_string(c10::cuda::device_count()) +
                      " CUDA devices");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::max(timeout, setup_timeout);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, index, size, options);
    return makeC10dCommunicator(std::move(name), std::move(pg), index, size, timeout,
                                c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  } catch (const CommError&) {
    throw;
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(describeFailure(name, "group set-up", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(describeFailure(name, "group set-up", e.what(), timeout));
  }
}

}  // namespace apc::runtime::detail
