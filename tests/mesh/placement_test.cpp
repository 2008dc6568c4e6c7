//===- tests/mesh/placement_test.cpp - Placements and chunk arithmetic -----===//
//
// Parsing and printing of placements and placement tuples (every accepted spelling, every error),
// the rank check, shard factors, and torch.chunk-style piece sizes and offsets.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>

#include "apc/mesh/placement.h"

namespace apc::mesh {
namespace {

Placement parseOk(std::string_view text) {
  auto p = Placement::parse(text);
  EXPECT_TRUE(p.ok()) << text << ": " << (p.ok() ? "" : p.error().message());
  return p.ok() ? *p : Placement::replicate();
}

TEST(Placement, ParsesEverySpelling) {
  EXPECT_EQ(parseOk("S(1)"), Placement::shard(1));
  EXPECT_EQ(parseOk("Shard(1)"), Placement::shard(1));
  EXPECT_EQ(parseOk("  S( 2 ) "), Placement::shard(2));
  EXPECT_EQ(parseOk("S(+3)"), Placement::shard(3));
  EXPECT_EQ(parseOk("R"), Placement::replicate());
  EXPECT_EQ(parseOk("Replicate"), Placement::replicate());
  EXPECT_EQ(parseOk("Replicate()"), Placement::replicate());
  EXPECT_EQ(parseOk("P"), Placement::partial());
  EXPECT_EQ(parseOk("Partial"), Placement::partial());
  EXPECT_EQ(parseOk("Partial()"), Placement::partial());
  EXPECT_EQ(parseOk("P(sum)"), Placement::partial(ReduceOp::kSum));
  EXPECT_EQ(parseOk("P(max)"), Placement::partial(ReduceOp::kMax));
  EXPECT_EQ(parseOk("Partial(min)"), Placement::partial(ReduceOp::kMin));
  EXPECT_EQ(parseOk("P( avg )"), Placement::partial(ReduceOp::kAvg));
}

TEST(Placement, Accessors) {
  Placement s = Placement::shard(2);
  EXPECT_TRUE(s.isShard());
  EXPECT_TRUE(s.isShard(2));
  EXPECT_FALSE(s.isShard(1));
  EXPECT_EQ(s.dim(), 2);
  EXPECT_EQ(s.kind(), Placement::Kind::kShard);
  EXPECT_TRUE(Placement::replicate().isReplicate());
  EXPECT_TRUE(Placement::partial(ReduceOp::kMax).isPartial());
  EXPECT_EQ(Placement::partial(ReduceOp::kMax).reduceOp(), ReduceOp::kMax);
  EXPECT_STREQ(reduceOpName(ReduceOp::kAvg), "avg");
}

TEST(Placement, Prints) {
  EXPECT_EQ(Placement::shard(0).toString(), "S(0)");
  EXPECT_EQ(Placement::shard(12).toString(), "S(12)");
  EXPECT_EQ(Placement::replicate().toString(), "R");
  EXPECT_EQ(Placement::partial().toString(), "P");
  EXPECT_EQ(Placement::partial(ReduceOp::kMax).toString(), "P(max)");
  EXPECT_EQ(Placement::partial(ReduceOp::kMin).toString(), "P(min)");
  EXPECT_EQ(Placement::partial(ReduceOp::kAvg).toString(), "P(avg)");
}

TEST(Placement, RoundTrips) {
  std::vector<Placement> all = {Placement::shard(0),
                                Placement::shard(3),
                                Placement::replicate(),
                                Placement::partial(),
                                Placement::partial(ReduceOp::kMax),
                                Placement::partial(ReduceOp::kMin),
                                Placement::partial(ReduceOp::kAvg)};
  for (const Placement& p : all) EXPECT_EQ(parseOk(p.toString()), p) << p.toString();
}

TEST(Placement, RejectsUnknownText) {
  for (std::string_view bad : {"S(x)", "Q", "", "S()", "S(-1)", "S(-0)", "S(1.5)", "S(0", "S0",
                               "S (0)", "P(prod)", "Partial(x)", "r", "Shard", "S(99999999999)"}) {
    auto p = Placement::parse(bad);
    ASSERT_FALSE(p.ok()) << "'" << bad << "' parsed as " << p->toString();
    EXPECT_EQ(p.error().code(), ErrorCode::kParse);
    EXPECT_EQ(p.error().message(), "unknown placement '" + std::string(bad) +
                                       "' (expected S(<dim>), R or P, like S(0), R, P(max))");
  }
}

TEST(Placement, EqualityAndOrder) {
  EXPECT_NE(Placement::shard(0), Placement::shard(1));
  EXPECT_NE(Placement::partial(), Placement::partial(ReduceOp::kMax));
  EXPECT_NE(Placement::replicate(), Placement::partial());
  EXPECT_EQ(Placement::replicate(), Placement::replicate());
  std::vector<Placement> v = {Placement::partial(ReduceOp::kMax), Placement::shard(1),
                              Placement::replicate(), Placement::partial(), Placement::shard(0)};
  std::sort(v.begin(), v.end());
  EXPECT_EQ(toString(v), "R,S(0),S(1),P,P(max)");
  EXPECT_FALSE(Placement::shard(1) < Placement::shard(1));
}

TEST(PlacementTuple, ParsesAndPrints) {
  auto t = parsePlacementTuple("S(0),R");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (PlacementTuple{Placement::shard(0), Placement::replicate()}));
  auto u = parsePlacementTuple(" [S(0), P(max), Shard(2)] ");
  ASSERT_TRUE(u.ok()) << u.error().message();
  EXPECT_EQ(*u, (PlacementTuple{Placement::shard(0), Placement::partial(ReduceOp::kMax),
                                Placement::shard(2)}));
  EXPECT_EQ(toString(*u), "S(0),P(max),S(2)");
  EXPECT_EQ(toCompactString(*u), "S(0)P(max)S(2)");
  EXPECT_EQ(toCompactString(replicated(3)), "RRR");
  auto back = parsePlacementTuple(toString(*u));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *u);
}

TEST(PlacementTuple, RejectsMalformedLists) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c :
       {Case{"[S(0),R", "unbalanced '[' in placement list '[S(0),R'"},
        Case{"", "empty placement list ''"}, Case{"[]", "empty placement list '[]'"},
        Case{"S(0),,R", "unknown placement ''"}, Case{"S(0),Q", "unknown placement 'Q'"},
        Case{"S(x),R", "unknown placement 'S(x)'"}}) {
    auto t = parsePlacementTuple(c.text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.error().code(), ErrorCode::kParse);
    EXPECT_NE(t.error().message().find(c.message), std::string::npos) << t.error().message();
  }
}

TEST(PlacementTuple, CheckRankAndLength) {
  PlacementTuple t = {Placement::shard(1), Placement::replicate()};
  EXPECT_TRUE(checkPlacementTuple(t, 2, 2).ok());
  Status out_of_range = checkPlacementTuple(t, 1, 2);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.error().message(),
            "placement S(1) is out of range for a tensor of rank 1");
  Status scalar = checkPlacementTuple({Placement::shard(0)}, 0, 1);
  ASSERT_FALSE(scalar.ok());
  EXPECT_EQ(scalar.error().message(), "placement S(0) is out of range for a tensor of rank 0");
  Status length = checkPlacementTuple({Placement::shard(0)}, 2, 2);
  ASSERT_FALSE(length.ok());
  EXPECT_EQ(length.error().message(), "placement S(0) has 1 entry but the mesh has 2 dims");
  Status length3 = checkPlacementTuple(replicated(3), 2, 2);
  ASSERT_FALSE(length3.ok());
  EXPECT_EQ(length3.error().message(), "placement RRR has 3 entries but the mesh has 2 dims");
  // Replicate and Partial fit any rank, even a scalar.
  EXPECT_TRUE(checkPlacementTuple({Placement::partial(), Placement::replicate()}, 0, 2).ok());
}

TEST(PlacementTuple, ShardFactor) {
  std::vector<int64_t> mesh = {2, 4};
  PlacementTuple both = {Placement::shard(0), Placement::shard(0)};
  EXPECT_EQ(shardFactor(both, mesh, 0), 8);
  EXPECT_EQ(shardFactor(both, mesh, 1), 1);
  PlacementTuple split = {Placement::shard(1), Placement::shard(0)};
  EXPECT_EQ(shardFactor(split, mesh, 0), 4);
  EXPECT_EQ(shardFactor(split, mesh, 1), 2);
  EXPECT_EQ(shardFactor(replicated(2), mesh, 0), 1);
  EXPECT_EQ(shardFactor({Placement::partial(), Placement::shard(2)}, mesh, 2), 4);
}

TEST(Chunk, TorchChunkSemantics) {
  // 50257 (GPT-2 vocab) over 4: ceil = 12565, the last piece is short.
  EXPECT_EQ(chunkSize(50257, 4, 0), 12565);
  EXPECT_EQ(chunkSize(50257, 4, 1), 12565);
  EXPECT_EQ(chunkSize(50257, 4, 2), 12565);
  EXPECT_EQ(chunkSize(50257, 4, 3), 12562);
  EXPECT_EQ(chunkOffset(50257, 4, 0), 0);
  EXPECT_EQ(chunkOffset(50257, 4, 1), 12565);
  EXPECT_EQ(chunkOffset(50257, 4, 2), 25130);
  EXPECT_EQ(chunkOffset(50257, 4, 3), 37695);
  // 5 over 4: 2, 2, 1, 0 (torch.chunk gives 3 chunks; the fourth rank holds an empty piece).
  std::vector<int64_t> sizes, offsets;
  for (int i = 0; i < 4; ++i) {
    sizes.push_back(chunkSize(5, 4, i));
    offsets.push_back(chunkOffset(5, 4, i));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 4, 5}));
  // 3 over 4: 1, 1, 1, 0; 8 over 4: even.
  EXPECT_EQ(chunkSize(3, 4, 3), 0);
  EXPECT_EQ(chunkOffset(3, 4, 3), 3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(chunkSize(8, 4, i), 2);
  // 2 over 4: 1, 1, 0, 0 (offset clamped to the size).
  EXPECT_EQ(chunkSize(2, 4, 2), 0);
  EXPECT_EQ(chunkOffset(2, 4, 3), 2);
  EXPECT_EQ(chunkSize(7, 1, 0), 7);
}

TEST(Chunk, PiecesTileTheDim) {
  for (int64_t size = 0; size <= 40; ++size) {
    for (int64_t pieces = 1; pieces <= 9; ++pieces) {
      int64_t total = 0;
      for (int64_t i = 0; i < pieces; ++i) {
        EXPECT_EQ(chunkOffset(size, pieces, i), total) << size << "/" << pieces << " #" << i;
        EXPECT_GE(chunkSize(size, pieces, i), 0);
        EXPECT_LE(chunkSize(size, pieces, i), chunkSize(size, pieces, 0));
        total += chunkSize(size, pieces, i);
      }
      EXPECT_EQ(total, size) << size << "/" << pieces;
    }
  }
}

// The one non-empty-piece rule against every piece nested torch.chunk makes.
TEST(Chunk, NonEmptyPiecesMatchEveryNestedPiece) {
  for (int64_t size = 0; size <= 30; ++size) {
    for (int64_t outer = 1; outer <= 5; ++outer) {
      for (int64_t inner = 1; inner <= 5; ++inner) {
        bool all = true;
        for (int64_t i = 0; i < outer; ++i) {
          const int64_t piece = outer > 1 ? chunkSize(size, outer, i) : size;
          for (int64_t k = 0; k < inner; ++k)
            if ((inner > 1 ? chunkSize(piece, inner, k) : piece) <= 0 && (outer > 1 || inner > 1))
              all = false;
        }
        EXPECT_EQ(cutsIntoNonEmptyPieces(size, {outer, inner}), all)
            << size << " by " << outer << "x" << inner;
      }
    }
  }
  EXPECT_FALSE(cutsIntoNonEmptyPieces(4, {3}));  // 2, 2, 0
  EXPECT_TRUE(cutsIntoNonEmptyPieces(0, {1}));   // a count of 1 does not cut
}

}  // namespace
}  // namespace apc::mesh
