// The cost-model seam (apc/cost/cost_model.h): without refinements it prices exactly as the free
// functions (so plans made through it are today's); a link per collective kind prices that kind
// only; groups that span nodes are priced hierarchically; redistributions price through it.
#include "apc/cost/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "apc/cost/edge.h"
#include "apc/cost/redistribute.h"

namespace apc::cost {
namespace {

constexpr CollectiveKind kKinds[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                     CollectiveKind::kAllReduce, CollectiveKind::kAllToAll};

mesh::DeviceMesh meshOf(std::vector<int64_t> shape) {
  auto m = mesh::DeviceMesh::create(shape);
  EXPECT_TRUE(m.ok());
  return *m;
}

TEST(CostModel, WithoutRefinementsItIsTheFreeFunctions) {
  mesh::DeviceMesh m = meshOf({4, 8});
  m.setLink(0, {25.0, 12.0});
  DeviceSpec h100 = deviceByName("h100").value();
  CostModel model(h100, m);
  for (size_t d = 0; d < 2; ++d)
    for (CollectiveKind k : kKinds)
      for (double n : {0.0, 1.0, 4096.0, 3e8})
        EXPECT_EQ(model.collectiveUs(k, d, m.size(d), n), collectiveUs(k, m.link(d), m.size(d), n));
  EXPECT_EQ(model.computeUs(1e12, 1e6, ir::DType::kBF16),
            computeCostUs(h100, 1e12, 1e6, ir::DType::kBF16));
  EXPECT_EQ(model.backwardUs(OpFamily::kContraction, 7.0), 14.0);
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kNone, 0, 4, 1e6), 0.0);
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllReduce, 0, 1, 1e6), 0.0);
}

TEST(CostModel, ALinkPerKindPricesThatKindOnly) {
  mesh::DeviceMesh m = meshOf({2});
  m.setLink(0, {10.0, 5.0});
  spec::MeshDimNetwork net;
  net.by_kind[0] = mesh::LinkParams{2.0, 50.0};  // all-gather
  CostModel model(DeviceSpec{}, m, {net});
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllGather, 0, 2, 1e6),
            allGatherUs({2.0, 50.0}, 2, 1e6));
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllReduce, 0, 2, 1e6),
            allReduceUs({10.0, 5.0}, 2, 1e6));
  EXPECT_NE(model.describe().find("all-gather 2 GB/s, 50 us"), std::string::npos)
      << model.describe();
}

TEST(CostModel, MeasuredTimesAreInterpolated) {
  mesh::DeviceMesh m = meshOf({2, 4});
  spec::MeshDimNetwork net;
  net.by_kind[2] = mesh::LinkParams{1.0, 100.0};
  net.tables[2] = spec::CollectiveTable{2, {1000, 4000, 16000}, {10, 20, 80}};
  CostModel model(DeviceSpec{}, m, {net, {}});
  const auto ar = CollectiveKind::kAllReduce;
  EXPECT_DOUBLE_EQ(model.collectiveUs(ar, 0, 2, 1000), 10.0);
  EXPECT_DOUBLE_EQ(model.collectiveUs(ar, 0, 2, 4000), 20.0);
  EXPECT_NEAR(model.collectiveUs(ar, 0, 2, 2000), 10.0 * std::sqrt(2.0), 1e-9);  // log-log
  EXPECT_NEAR(model.collectiveUs(ar, 0, 2, 8000), 40.0, 1e-9);
  EXPECT_DOUBLE_EQ(model.collectiveUs(ar, 0, 2, 10), 10.0);      // below: the first time
  EXPECT_DOUBLE_EQ(model.collectiveUs(ar, 0, 2, 32000), 160.0);  // above: bandwidth-bound
  // Other kinds, other group sizes and other mesh dims are not what was measured.
  EXPECT_EQ(model.collectiveUs(ar, 0, 4, 4000), allReduceUs({1.0, 100.0}, 4, 4000));
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllGather, 0, 2, 4000),
            allGatherUs(m.link(0), 2, 4000));
  EXPECT_EQ(model.collectiveUs(ar, 1, 2, 4000), allReduceUs(m.link(1), 2, 4000));
  EXPECT_NE(model.describe().find("all-reduce measured (3 sizes, 2 ranks)"), std::string::npos)
      << model.describe();
}

TEST(CostModel, MeasuredKernelCurvesReplaceTheRoofline) {
  DeviceSpec cpu = deviceByName("cpu").value();
  cpu.kernel_floor_us = 1.0;
  cpu.matmul_curve[ir::DType::kF32] = KernelCurve{{1e3, 1e6}, {2.0, 200.0}};
  cpu.elementwise_curve = KernelCurve{{1e3, 1e5}, {1.5, 15.0}};
  CostModel model(cpu, meshOf({2}));
  // Contractions by flops in their dtype's curve; log-log between points, proportional above.
  EXPECT_NEAR(model.computeUs(OpFamily::kContraction, 1e3, 1e3, ir::DType::kF32), 2.0, 1e-12);
  EXPECT_NEAR(model.computeUs(OpFamily::kContraction, std::sqrt(1e9), 0, ir::DType::kF32),
              std::sqrt(2.0 * 200.0), 1e-9);
  EXPECT_NEAR(model.computeUs(OpFamily::kAttention, 2e6, 0, ir::DType::kF32), 400.0, 1e-9);
  // Another dtype has no curve: the roofline.
  EXPECT_EQ(model.computeUs(OpFamily::kContraction, 1e6, 1e3, ir::DType::kBF16),
            computeCostUs(cpu, 1e6, 1e3, ir::DType::kBF16));
  // Everything else by bytes in the elementwise curve, never below the floor.
  EXPECT_NEAR(model.computeUs(OpFamily::kPointwise, 10, 1e4, ir::DType::kF32),
              std::sqrt(1.5 * 15.0), 1e-9);
  EXPECT_EQ(model.computeUs(OpFamily::kNormalization, 10, 10, ir::DType::kF32), 1.5);
  cpu.elementwise_curve = KernelCurve{{1e3, 1e5}, {0.1, 15.0}};
  EXPECT_EQ(CostModel(cpu, meshOf({2})).computeUs(OpFamily::kSoftmax, 0, 500, ir::DType::kF32),
            1.0);
  EXPECT_EQ(model.computeUs(OpFamily::kView, 0, 0, ir::DType::kF32), 0.0);
  // Convolutions: the matmul curve until a convolution curve of their dtype exists.
  EXPECT_NEAR(model.computeUs(OpFamily::kConvolution, 1e3, 1e3, ir::DType::kF32), 2.0, 1e-12);
  // A contraction that moves more than it computes (a batched matvec reading one weight matrix
  // per token) is priced by its bytes in the elementwise curve: 1e3 flops, 1e5 bytes.
  EXPECT_NEAR(model.computeUs(OpFamily::kContraction, 1e3, 1e5, ir::DType::kF32), 15.0, 1e-9);
  EXPECT_NEAR(model.computeUs(OpFamily::kConvolution, 1e3, 1e5, ir::DType::kF32), 15.0, 1e-9);
  // Convolutions and attention: their own curves where calibrated (the fused CPU attention
  // kernels reach a fraction of the square matmuls' throughput); a contraction keeps the matmul
  // curve, and a dtype without its own curve too.
  using Curves = std::map<ir::DType, KernelCurve> DeviceSpec::*;
  for (const auto& [family, curves, first_us] :
       {std::tuple{OpFamily::kConvolution, Curves{&DeviceSpec::conv_curve}, 6.0},
        std::tuple{OpFamily::kAttention, Curves{&DeviceSpec::attention_curve}, 20.0}}) {
    DeviceSpec own = cpu;
    (own.*curves)[ir::DType::kF32] = KernelCurve{{1e3, 1e6}, {first_us, 150 * first_us}};
    CostModel with_own(own, meshOf({2}));
    EXPECT_NEAR(with_own.computeUs(family, 1e3, 1e3, ir::DType::kF32), first_us, 1e-12);
    EXPECT_NEAR(with_own.computeUs(family, 2e6, 0, ir::DType::kF32), 300 * first_us, 1e-9);
    EXPECT_NEAR(with_own.computeUs(OpFamily::kContraction, 1e3, 1e3, ir::DType::kF32), 2.0, 1e-12);
    EXPECT_NEAR(with_own.computeUs(family, 2e6, 0, ir::DType::kBF16),
                model.computeUs(family, 2e6, 0, ir::DType::kBF16), 1e-12);
  }
  EXPECT_EQ(model.backwardUs(OpFamily::kConvolution, 7.0), 14.0);
  // A single op's own curve, by bytes, never below the floor; none for another op.
  DeviceSpec ops = cpu;
  ops.op_curves["aten::tanh"] = KernelCurve{{1e3, 1e5}, {10.0, 1000.0}};
  CostModel with_ops(ops, meshOf({2}));
  EXPECT_NEAR(*with_ops.opKernelUs("aten::tanh", 1e4), 100.0, 1e-9);
  EXPECT_NEAR(*with_ops.opKernelUs("aten::tanh", 2e5), 2000.0, 1e-9);
  EXPECT_EQ(*with_ops.opKernelUs("aten::tanh", 1.0), 10.0);
  EXPECT_FALSE(with_ops.opKernelUs("aten::exp", 1e4).has_value());
  EXPECT_FALSE(with_ops.opKernelUs("aten::tanh", 0).has_value());
  // Without curves: the roofline, bit for bit.
  DeviceSpec plain = deviceByName("cpu").value();
  CostModel roofline(plain, meshOf({2}));
  for (OpFamily f : {OpFamily::kContraction, OpFamily::kPointwise, OpFamily::kReduction})
    EXPECT_EQ(roofline.computeUs(f, 3e7, 4e5, ir::DType::kF32),
              computeCostUs(plain, 3e7, 4e5, ir::DType::kF32));
}

TEST(CostModel, GroupsThatSpanNodesArePricedHierarchically) {
  mesh::DeviceMesh m = meshOf({16});
  const mesh::LinkParams nvlink{450.0, 2.0}, ib{50.0, 10.0};
  m.setLink(0, nvlink);
  spec::MeshDimNetwork net;
  net.ranks_per_node = 8;
  net.inter_node = ib;
  CostModel model(DeviceSpec{}, m, {net});
  const double n = 64e6;
  EXPECT_DOUBLE_EQ(model.collectiveUs(CollectiveKind::kAllGather, 0, 16, n),
                   allGatherUs(ib, 2, n / 8) + allGatherUs(nvlink, 8, n));
  EXPECT_DOUBLE_EQ(model.collectiveUs(CollectiveKind::kReduceScatter, 0, 16, n),
                   reduceScatterUs(nvlink, 8, n) + reduceScatterUs(ib, 2, n / 8));
  EXPECT_DOUBLE_EQ(
      model.collectiveUs(CollectiveKind::kAllReduce, 0, 16, n),
      reduceScatterUs(nvlink, 8, n) + allReduceUs(ib, 2, n / 8) + allGatherUs(nvlink, 8, n));
  const double piece = n / 256;
  EXPECT_DOUBLE_EQ(model.collectiveUs(CollectiveKind::kAllToAll, 0, 16, n),
                   7 * (2.0 + piece / 450e3) + 8 * (10.0 + piece / 50e3));
  // The hierarchy is cheaper than a flat ring over the slow link and dearer than one over the
  // fast link: a ring of 16 over nodes is bounded by its slowest hop.
  EXPECT_LT(model.collectiveUs(CollectiveKind::kAllReduce, 0, 16, n), allReduceUs(ib, 16, n));
  EXPECT_GT(model.collectiveUs(CollectiveKind::kAllReduce, 0, 16, n), allReduceUs(nvlink, 16, n));
  // A group within one node, and a node size that does not divide the group.
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllReduce, 0, 8, n), allReduceUs(nvlink, 8, n));
  EXPECT_EQ(model.collectiveUs(CollectiveKind::kAllReduce, 0, 12, n), allReduceUs(ib, 12, n));
}

TEST(CostModel, RedistributionsPriceThroughTheModel) {
  mesh::DeviceMesh m = meshOf({4});
  m.setLink(0, {100.0, 1.0});
  spec::MeshDimNetwork net;
  net.by_kind[0] = mesh::LinkParams{1.0, 100.0};  // a slow all-gather
  CostModel model(DeviceSpec{}, m, {net});
  ir::TensorMeta t;
  t.dtype = ir::DType::kF32;
  t.shape = {ir::Dim::fixed(1024), ir::Dim::fixed(1024)};
  t.requires_grad = true;
  const mesh::PlacementTuple from = {mesh::Placement::shard(0)},
                             to = {mesh::Placement::replicate()};
  auto plain = planRedistribution(t, from, to, m);
  auto priced = planRedistribution(t, from, to, m, model);
  ASSERT_TRUE(plain.ok() && priced.ok());
  ASSERT_EQ(priced->steps.size(), 1u);
  const double n = 1024.0 * 1024 * 4;
  EXPECT_DOUBLE_EQ(priced->forward_us, allGatherUs({1.0, 100.0}, 4, n));
  EXPECT_DOUBLE_EQ(priced->backward_us, reduceScatterUs({100.0, 1.0}, 4, n));
  EXPECT_DOUBLE_EQ(plain->forward_us, allGatherUs({100.0, 1.0}, 4, n));
  auto cost = redistributionCost(t, from, to, m, model);
  ASSERT_TRUE(cost.ok());
  EXPECT_EQ(cost->forward_us, priced->forward_us);
  auto costs = redistributionCosts(t, from, {to}, m, model);
  ASSERT_TRUE(costs.ok());
  EXPECT_EQ((*costs)[0].forward_us, priced->forward_us);
  // A model of another mesh is an error, not a wrong price.
  CostModel two_dims(DeviceSpec{}, meshOf({2, 2}));
  EXPECT_FALSE(planRedistribution(t, from, to, m, two_dims).ok());
}

// A bucketed gradient pays its share of the runtime's first bucket (what that bucket adds to the
// latency, by bytes), not its own size's price less the latency: on a measured table whose small
// sizes cost several latencies, four 256 KiB gradients cost what their one 1 MiB bucket adds.
TEST(CostModel, BucketedGradientsPayTheirShareOfABucket) {
  mesh::DeviceMesh m = meshOf({2});
  spec::MeshDimNetwork net;
  const double mib = 1024.0 * 1024;
  net.tables[2] =
      spec::CollectiveTable{2, {4096, 256 * 1024, mib, 16 * mib}, {800, 2000, 2200, 12000}};
  // Slow enough that no reduce-scatter and all-gather pair replaces the all-reduce.
  net.by_kind[0] = net.by_kind[1] = mesh::LinkParams{0.01, 1e5};
  CostModel model(DeviceSpec{}, m, {net});
  auto gradientOf = [&](int64_t floats) {
    ir::TensorMeta t;
    t.dtype = ir::DType::kF32;
    t.shape = {ir::Dim::fixed(floats)};
    return planRedistribution(t, {mesh::Placement::partial()}, {mesh::Placement::replicate()}, m,
                              model);
  };
  const auto ar = CollectiveKind::kAllReduce;
  const double latency = model.collectiveUs(ar, 0, 2, 0.0);
  ASSERT_DOUBLE_EQ(latency, 800.0);
  auto quarter = gradientOf(64 * 1024), whole = gradientOf(256 * 1024),
       big = gradientOf(4 * 256 * 1024);
  ASSERT_TRUE(quarter.ok() && whole.ok() && big.ok());
  ASSERT_EQ(quarter->steps.size(), 1u);
  ASSERT_EQ(quarter->steps[0].kind, StepKind::kAllReduce);
  const double bucket_adds = model.collectiveUs(ar, 0, 2, mib) - latency;  // 1400
  EXPECT_DOUBLE_EQ(*bucketedGradientUs(*quarter, model, kGradBucketPricingBytes), bucket_adds / 4);
  EXPECT_DOUBLE_EQ(4 * *bucketedGradientUs(*quarter, model, kGradBucketPricingBytes),
                   *bucketedGradientUs(*whole, model, kGradBucketPricingBytes));
  // Priced alone, a 256 KiB all-reduce would add 1200 us over the latency: 3.4 times its share.
  EXPECT_GT(model.collectiveUs(ar, 0, 2, 256 * 1024) - latency,
            3 * *bucketedGradientUs(*quarter, model, kGradBucketPricingBytes));
  // From the bucket's size up: its own price less the latency.
  EXPECT_DOUBLE_EQ(*bucketedGradientUs(*big, model, kGradBucketPricingBytes),
                   model.collectiveUs(ar, 0, 2, 4 * mib) - latency);
  // A model whose gradients all fit one smaller bucket prices them in it: each pays its share
  // of what that bucket adds, the small-message premium included.
  const double all = 512 * 1024;
  EXPECT_DOUBLE_EQ(*bucketedGradientUs(*quarter, model, all),
                   (model.collectiveUs(ar, 0, 2, all) - latency) / 2);
  // Anything but one all-reduce is not bucketed.
  ir::TensorMeta t;
  t.dtype = ir::DType::kF32;
  t.shape = {ir::Dim::fixed(1024)};
  auto gather =
      planRedistribution(t, {mesh::Placement::shard(0)}, {mesh::Placement::replicate()}, m, model);
  ASSERT_TRUE(gather.ok());
  EXPECT_FALSE(bucketedGradientUs(*gather, model, kGradBucketPricingBytes).has_value());
}

TEST(CostModel, FromASpec) {
  auto spec = spec::parseSpecText(R"({"mesh": {"shape": [2, 2]}, "device": {"kind": "cpu",
      "peak_tflops": {"f32": 0.04}, "compute_efficiency": 1, "kernel_floor_us": 3},
      "network": [{}, {"all-reduce": {"bandwidth_gbps": 2, "latency_us": 9}}]})");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  auto model = costModelFor(*spec);
  ASSERT_TRUE(model.ok()) << model.error().message();
  EXPECT_EQ(model->device().name, "cpu");
  EXPECT_EQ(model->device().kernel_floor_us, 3.0);
  EXPECT_EQ(model->device().compute_efficiency, 1.0);
  EXPECT_EQ(model->link(CollectiveKind::kAllReduce, 1).bandwidth_gbps, 2.0);
  EXPECT_EQ(model->link(CollectiveKind::kAllGather, 1), spec->mesh.link(1));
  spec::Spec bad = *spec;
  bad.network.pop_back();
  auto err = costModelFor(bad);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message().find("network has 1 entries"), std::string::npos);
  bad = *spec;
  bad.device = "tpu";
  EXPECT_FALSE(costModelFor(bad).ok());
}

// A node pass with its host dispatch: the sum where the dispatching thread runs the kernels (the
// CPU), the larger of the two where the host runs ahead of a queue (CUDA), both read from a spec.
TEST(CostModel, DispatchAddsToKernelsOrOverlapsThem) {
  for (bool overlaps : {false, true}) {
    auto spec = spec::parseSpecText(std::string(R"({"mesh": {"shape": [2]}, "device": {"kind":
        "cpu", "dispatch_us": 20)") +
                                    (overlaps ? R"(, "dispatch_overlaps": true)" : "") + "}}");
    ASSERT_TRUE(spec.ok()) << spec.error().message();
    auto model = costModelFor(*spec);
    ASSERT_TRUE(model.ok()) << model.error().message();
    EXPECT_EQ(model->device().dispatch_overlaps, overlaps);
    EXPECT_EQ(model->passUs(0), 20.0);
    EXPECT_EQ(model->passUs(5), overlaps ? 20.0 : 25.0);
    EXPECT_EQ(model->passUs(300), overlaps ? 300.0 : 320.0);
    EXPECT_EQ(model->nodeUs(5, 300, true), overlaps ? 320.0 : 345.0);
    EXPECT_EQ(model->nodeUs(5, 300, false), overlaps ? 20.0 : 25.0);
    EXPECT_EQ(model->directKernelUs(5), overlaps ? 5.0 : 25.0);
    EXPECT_EQ(model->viewNodeUs(true), 40.0);  // no view_dispatch_us: a node's dispatch
  }
}

/// The cost model of a spec written as JSON text; the spec's or the model's error.
Expected<CostModel> modelOfSpecText(const char* text) {
  auto spec = spec::parseSpecText(text);
  if (!spec.ok()) return spec.error();
  return costModelFor(*spec);
}

// Ops that run no kernel (views) pay the calibrated view dispatch, not a kernel op's.
TEST(CostModel, ViewsPayTheirOwnDispatch) {
  auto model = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "cpu",
      "dispatch_us": 20, "view_dispatch_us": 4}})");
  ASSERT_TRUE(model.ok()) << model.error().message();
  EXPECT_EQ(model->viewNodeUs(false), 4.0);
  EXPECT_EQ(model->viewNodeUs(true), 8.0);
  EXPECT_EQ(model->nodeUs(0, 0, true), 40.0);
}

// A calibrated wait resume is paid once per collective call, on top of its time on the wire; a
// kNone step and a group of one still cost nothing, and a spec without it prices the wire alone.
TEST(CostModel, WaitResumeIsPaidPerCollectiveCall) {
  auto model = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "cpu",
      "wait_resume_us": 50}})");
  ASSERT_TRUE(model.ok()) << model.error().message();
  EXPECT_EQ(model->device().wait_resume_us, 50.0);
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce, CollectiveKind::kAllToAll}) {
    const double wire = model->wireUs(kind, 0, 2, 1 << 20);
    EXPECT_GT(wire, 0.0);
    EXPECT_DOUBLE_EQ(model->collectiveUs(kind, 0, 2, 1 << 20), wire + 50.0);
    EXPECT_EQ(model->collectiveUs(kind, 0, 1, 1 << 20), 0.0);
  }
  EXPECT_EQ(model->collectiveUs(CollectiveKind::kNone, 0, 2, 1 << 20), 0.0);
  EXPECT_NE(model->describe().find("wait resume 50.0 us"), std::string::npos) << model->describe();
  auto plain = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "h100"}})");
  ASSERT_TRUE(plain.ok()) << plain.error().message();
  EXPECT_EQ(plain->collectiveUs(CollectiveKind::kAllReduce, 0, 2, 1 << 20),
            plain->wireUs(CollectiveKind::kAllReduce, 0, 2, 1 << 20));
}

// A spec's matmul output, matrix-vector and outer product rates reach the model (their JSON round
// trip and a negative value's error are spec cases: tests/spec/spec_cases.json).
TEST(CostModel, MatmulOutputRateFromASpec) {
  auto model = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "cpu",
      "dispatch_us": 2, "matmul_output_gbps": 4, "matvec_gbps": 2, "outer_product_gbps": 0.5}})");
  ASSERT_TRUE(model.ok()) << model.error().message();
  EXPECT_DOUBLE_EQ(model->matmulOutputUs(8e6), 2000.0);
  EXPECT_DOUBLE_EQ(model->matvecUs(8e6).value_or(0), 4000.0);
  EXPECT_DOUBLE_EQ(model->outerProductUs(8e6).value_or(0), 16000.0);
  EXPECT_EQ(model->convWeightUs(8e6, false), 0.0);  // not in this spec: nothing
  auto conv = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "cpu",
      "conv_weight_gbps": 8, "conv_weight_grad_gbps": 2}})");
  ASSERT_TRUE(conv.ok()) << conv.error().message();
  EXPECT_DOUBLE_EQ(conv->convWeightUs(8e6, false), 1000.0);
  EXPECT_DOUBLE_EQ(conv->convWeightUs(8e6, true), 4000.0);
  auto unmeasured = modelOfSpecText(R"({"mesh": {"shape": [2]}, "device": {"kind": "h100"}})");
  ASSERT_TRUE(unmeasured.ok()) << unmeasured.error().message();
  EXPECT_FALSE(unmeasured->matvecUs(8e6).has_value());
  EXPECT_FALSE(unmeasured->outerProductUs(8e6).has_value());
}

// "cpu" stands for the profile apc calibrate measured on this project's kind of machine
// (lib/spec/cpu_cluster.json, embedded): a spec naming it and nothing else is priced exactly as
// one with that profile applied (apc plan --cluster), and what a spec says itself wins.
TEST(CostModel, TheBuiltInCpuIsTheEmbeddedCalibratedProfile) {
  const spec::ClusterProfile* cpu = spec::builtinClusterProfile("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(spec::builtinClusterProfile("h100"), nullptr);
  EXPECT_FALSE(cpu->device_overrides.matmul_us.empty());
  EXPECT_TRUE(cpu->device_overrides.elementwise_us.has_value());
  ASSERT_EQ(cpu->network.size(), 1u);
  auto named = spec::parseSpecText(R"({"mesh": {"shape": [2, 2]}, "device": "cpu"})");
  ASSERT_TRUE(named.ok()) << named.error().message();
  spec::Spec applied = *named;
  ASSERT_TRUE(spec::applyClusterProfile(*cpu, applied).ok());
  auto a = costModelFor(*named), b = costModelFor(applied);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->describe(), b->describe());
  for (double flops : {1e4, 1e7, 1e9})
    EXPECT_EQ(a->computeUs(OpFamily::kContraction, flops, flops / 10, ir::DType::kF32),
              b->computeUs(OpFamily::kContraction, flops, flops / 10, ir::DType::kF32));
  for (double bytes : {4e3, 1e6, 1e8}) {
    EXPECT_EQ(a->computeUs(OpFamily::kPointwise, 0, bytes, ir::DType::kF32),
              b->computeUs(OpFamily::kPointwise, 0, bytes, ir::DType::kF32));
    for (size_t m : {0, 1})
      for (CollectiveKind k :
           {CollectiveKind::kAllGather, CollectiveKind::kAllReduce, CollectiveKind::kAllToAll})
        EXPECT_EQ(a->collectiveUs(k, m, 2, bytes), b->collectiveUs(k, m, 2, bytes));
  }
  // Measured, not the old guess of 2 TFLOPS and 200 GB/s: a 1 GFLOP matmul on one core takes
  // milliseconds.
  EXPECT_GT(a->computeUs(OpFamily::kContraction, 1e9, 1e6, ir::DType::kF32), 1000.0);
  // A spec that describes its device, or a mesh dim's link, keeps its own.
  auto own = spec::parseSpecText(R"({"mesh": {"shape": [2, 2], "bandwidth_gbps": [7, 450],
      "latency_us": [3, 2]}, "device": {"kind": "cpu", "peak_tflops": {"f32": 0.04}}})");
  ASSERT_TRUE(own.ok()) << own.error().message();
  auto c = costModelFor(*own);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->device().peak.f32, 0.04);
  EXPECT_TRUE(c->device().matmul_curve.empty());
  EXPECT_EQ(c->link(CollectiveKind::kAllGather, 0).bandwidth_gbps, 7.0);
  EXPECT_EQ(c->link(CollectiveKind::kAllGather, 1), a->link(CollectiveKind::kAllGather, 1));
}

}  // namespace
}  // namespace apc::cost
