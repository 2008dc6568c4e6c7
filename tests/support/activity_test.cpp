//===- tests/support/activity_test.cpp - apc::isOutOfMemory ----------------===//
#include "apc/support/activity.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

namespace apc {
namespace {

TEST(OutOfMemory, AllocationFailuresAreOutOfMemory) {
  EXPECT_TRUE(isOutOfMemory(std::bad_alloc()));
  EXPECT_TRUE(isOutOfMemory(std::bad_array_new_length()));
  // c10::alloc_cpu's CAFFE_ENFORCE messages (LibTorch 2.13 on Linux), with the backtrace line
  // c10::Error appends, and the allocator's phrase alone (a TORCH_CHECK).
  EXPECT_TRUE(isOutOfMemory(std::runtime_error(
      "[enforce fail at alloc_cpu.cpp:121] err == 0. DefaultCPUAllocator: can't allocate memory: "
      "you tried to allocate 1000000000 bytes. Error code 12 (Cannot allocate memory)\n"
      "Exception raised from alloc_cpu at /__w/pytorch/pytorch/c10/core/impl/alloc_cpu.cpp:121")));
  EXPECT_TRUE(isOutOfMemory(std::runtime_error(
      "[enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: not enough memory: you "
      "tried to allocate 8 bytes.")));
  EXPECT_TRUE(isOutOfMemory(std::runtime_error(
      "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes.")));
}

// The fuzz_pt finding: TorchScript's ErrorReport quotes the archive's text, here a type name the
// fuzzer spliced the allocator's phrase into. Taken for out of memory, the importer rethrew it out
// of its handler instead of wording it as an unreadable archive.
TEST(OutOfMemory, AnErrorQuotingThePhraseIsNot) {
  EXPECT_FALSE(isOutOfMemory(
      std::runtime_error("\nUnknown type name 'torch._utils._rebuDefaultCPUAllocator':\n"
                         "torch._utils._rebuDefaultCPUAllocator: can't allocate memoryatStorage\n"
                         "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE\n")));
  EXPECT_FALSE(isOutOfMemory(
      std::runtime_error("Unknown type 'DefaultCPUAllocator: not enough memory' in the archive")));
  // The phrase on a later line of an enforce message from another file.
  EXPECT_FALSE(
      isOutOfMemory(std::runtime_error("[enforce fail at inline_container.cc:9] x. bad record\n"
                                       "DefaultCPUAllocator: not enough memory")));
  // An allocator enforce whose first line lacks the phrase.
  EXPECT_FALSE(isOutOfMemory(
      std::runtime_error("[enforce fail at alloc_cpu.cpp:1] nbytes >= 0. negative size\n"
                         "DefaultCPUAllocator: can't allocate memory")));
  EXPECT_FALSE(isOutOfMemory(std::runtime_error("")));
}

}  // namespace
}  // namespace apc
