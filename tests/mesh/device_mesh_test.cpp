//===- tests/mesh/device_mesh_test.cpp - Device meshes ---------------------===//
//
// Mesh parsing and its errors, coordinates <-> ranks, and the rank groups of each mesh dim for 2x4
// and 2x2x2 meshes, written out by hand.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "apc/mesh/device_mesh.h"

namespace apc::mesh {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

DeviceMesh mesh(std::string_view shape, std::string_view names = {}) {
  auto m = DeviceMesh::parse(shape, names);
  EXPECT_TRUE(m.ok()) << shape << ": " << (m.ok() ? "" : m.error().message());
  return m.ok() ? *m : DeviceMesh();
}

TEST(DeviceMesh, ParsesShapeAndNames) {
  DeviceMesh m = mesh("2x4", "dp,tp");
  EXPECT_EQ(m.shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(m.names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(m.ndim(), 2u);
  EXPECT_EQ(m.size(1), 4);
  EXPECT_EQ(m.worldSize(), 8);
  EXPECT_EQ(m.toString(), "2x4(dp,tp)");
  EXPECT_EQ(mesh(" 2x4 ", " dp , tp ").names(), (std::vector<std::string>{"dp", "tp"}));
}

TEST(DeviceMesh, DefaultNamesAndLinks) {
  DeviceMesh one = mesh("8");
  EXPECT_EQ(one.toString(), "8(d0)");
  EXPECT_EQ(one.link(0), (LinkParams{450.0, 2.0}));  // a 1-d mesh is intra-node
  DeviceMesh three = mesh("2x2x2");
  EXPECT_EQ(three.names(), (std::vector<std::string>{"d0", "d1", "d2"}));
  EXPECT_EQ(three.worldSize(), 8);
  EXPECT_EQ(three.link(0), (LinkParams{50.0, 10.0}));
  EXPECT_EQ(three.link(1), (LinkParams{50.0, 10.0}));
  EXPECT_EQ(three.link(2), (LinkParams{450.0, 2.0}));
  three.setLink(0, LinkParams{25.0, 20.0});
  EXPECT_EQ(three.link(0), (LinkParams{25.0, 20.0}));
  EXPECT_NE(three, mesh("2x2x2"));
  EXPECT_EQ(defaultLinks(0).size(), 0u);
}

TEST(DeviceMesh, RejectsBadShapes) {
  for (std::string_view bad : {"2x0", "2xa", "", "2x", "x4", "-2x4", "2x4x", "2.5x4", "0"}) {
    auto m = DeviceMesh::parse(bad);
    ASSERT_FALSE(m.ok()) << "'" << bad << "' parsed as " << m->toString();
    EXPECT_EQ(m.error().code(), ErrorCode::kParse);
    EXPECT_EQ(m.error().message(), "bad mesh shape '" + std::string(bad) +
                                       "' (expected positive sizes joined by 'x', like 2x4)");
  }
}

TEST(DeviceMesh, CapsDimsAndWorldSize) {
  auto five = DeviceMesh::parse("2x2x2x2x2");
  ASSERT_FALSE(five.ok());
  EXPECT_EQ(five.error().message(), "a device mesh has at most 4 dims, got 5");
  std::string many = "2";
  for (int i = 1; i < 64; ++i) many += "x2";
  auto sixty_four = DeviceMesh::parse(many);
  ASSERT_FALSE(sixty_four.ok());
  EXPECT_EQ(sixty_four.error().message(), "a device mesh has at most 4 dims, got 64");
  auto huge = DeviceMesh::parse("4611686018427387904x2");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().message(),
            "a device mesh has at most 65536 devices; 4611686018427387904x2 is too large");
  auto product = DeviceMesh::parse("256x256x2");
  ASSERT_FALSE(product.ok());
  EXPECT_EQ(product.error().message(),
            "a device mesh has at most 65536 devices; 256x256x2 is too large");
  auto big = DeviceMesh::parse("2147483648");
  ASSERT_FALSE(big.ok());
  auto largest = DeviceMesh::parse("16x16x16x16");
  ASSERT_TRUE(largest.ok()) << largest.error().message();
  EXPECT_EQ(largest->worldSize(), kMaxWorldSize);
}

TEST(DeviceMesh, RejectsBadNames) {
  auto dup = DeviceMesh::parse("2x4", "dp,dp");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(dup.error().message(), "duplicate mesh dim name 'dp'");
  auto few = DeviceMesh::parse("2x4", "dp");
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.error().message(), "mesh has 2 dims but 1 name was given");
  auto many = DeviceMesh::parse("2x4", "a,b,c");
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.error().message(), "mesh has 2 dims but 3 names were given");
  auto empty = DeviceMesh::parse("2x4", "dp,");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message(), "mesh dim names must not be empty");
}

TEST(DeviceMesh, CreateChecksItsArguments) {
  auto none = DeviceMesh::create({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message(), "a device mesh needs at least one dimension");
  auto zero = DeviceMesh::create({2, 0});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message(), "mesh dimension sizes must be positive, got 0");
  auto ok = DeviceMesh::create({4, 2}, {"a", "b"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->toString(), "4x2(a,b)");
}

TEST(DeviceMesh, DimIndex) {
  DeviceMesh m = mesh("2x4", "dp,tp");
  ASSERT_TRUE(m.dimIndex("tp").ok());
  EXPECT_EQ(*m.dimIndex("tp"), 1u);
  EXPECT_EQ(*m.dimIndex("dp"), 0u);
  auto missing = m.dimIndex("pp");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(missing.error().message(), "mesh has no dim named 'pp' (dims: dp,tp)");
}

TEST(DeviceMesh, CoordinatesAndRanksRowMajor) {
  DeviceMesh m = mesh("2x4");
  EXPECT_EQ(m.coordinate(0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(m.coordinate(3), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(m.coordinate(5), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(m.coordinate(7), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m.rank({1, 3}), 7);
  EXPECT_EQ(m.rank({1, 0}), 4);
  DeviceMesh c = mesh("2x2x2");
  EXPECT_EQ(c.coordinate(6), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(c.rank({0, 1, 1}), 3);
  for (const DeviceMesh& x : {m, c, mesh("3x1x5"), mesh("8")})
    for (int64_t r = 0; r < x.worldSize(); ++r) EXPECT_EQ(x.rank(x.coordinate(r)), r);
}

TEST(DeviceMesh, Groups2x4) {
  DeviceMesh m = mesh("2x4", "dp,tp");
  EXPECT_EQ(m.groups(0), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups(1), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.groupOf(5, 1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(m.groupOf(6, 0), (std::vector<int64_t>{2, 6}));
}

TEST(DeviceMesh, Groups2x2x2) {
  DeviceMesh m = mesh("2x2x2");
  EXPECT_EQ(m.groups(0), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups(1), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups(2), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groupOf(7, 1), (std::vector<int64_t>{5, 7}));
}

TEST(DeviceMesh, GroupsOfOneDimMeshAndSizeOneDims) {
  EXPECT_EQ(mesh("4").groups(0), (Groups{{0, 1, 2, 3}}));
  DeviceMesh m = mesh("1x3");
  EXPECT_EQ(m.groups(0), (Groups{{0}, {1}, {2}}));
  EXPECT_EQ(m.groups(1), (Groups{{0, 1, 2}}));
}

}  // namespace
}  // namespace apc::mesh
