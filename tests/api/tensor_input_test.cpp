//===- tests/api/tensor_input_test.cpp - Sample tensors as inputs ----------===//
//
// apc::sampleInput reads a tensor's sizes and dtype (meta tensors included); a nameless sample is
// the forward argument at its position, so AutoParallel plans the shapes of the sample tensors.
//
//===----------------------------------------------------------------------===//
#include "apc/api/tensor_input.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../common/run_command.h"
#include "apc/api/auto_parallel.h"

namespace apc {
namespace {

const std::string kToyModel = testing::kSamples + "toy_block.pt";

TEST(SampleInput, ShapeAndDtypeOfATensor) {
  at::Tensor t = at::empty({4, 7}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  frontend::InputSpec s = sampleInput(t, "tokens");
  EXPECT_EQ(s.name, "tokens");
  EXPECT_EQ(s.dtype, ir::DType::kI64);
  EXPECT_EQ(s.shape, ir::makeShape({4, 7}));
  EXPECT_EQ(dtypeOf(at::kBFloat16), ir::DType::kBF16);
  EXPECT_EQ(dtypeOf(at::kComplexFloat), ir::DType::kUnknown);
}

TEST(SampleInput, PlansTheSampleShapes) {
  at::Tensor x = at::empty({32, 128, 1024}, at::TensorOptions().device(at::kMeta));
  AutoParallel ap(kToyModel, {sampleInput(x)}, *mesh::DeviceMesh::create({8}, {"dp"}));
  ASSERT_TRUE(ap.add_input_constraints({"S(0)"}).ok());
  auto p = ap.optimize_placement();
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->model.inputs, std::vector<std::string>{"x:f32[32,128,1024]"});

  // The short path with a DTensor-like sample: shape plus placements.
  auto q =
      auto_parallel(kToyModel, *mesh::DeviceMesh::create({8}, {"dp"}), {{sampleInput(x), "S(0)"}});
  ASSERT_TRUE(q.ok()) << q.error().message();
  EXPECT_EQ(plan::toJsonText(q->plan), plan::toJsonText(*p));

  // A dtype apc has no name for is an error naming the input.
  at::Tensor c = at::empty({2}, at::TensorOptions().dtype(at::kComplexFloat).device(at::kMeta));
  AutoParallel bad(kToyModel, {sampleInput(c, "x")}, *mesh::DeviceMesh::create({8}, {"dp"}));
  auto e = bad.optimize_placement();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("unsupported dtype"), std::string::npos);
}

}  // namespace
}  // namespace apc
