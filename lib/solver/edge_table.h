//===- lib/solver/edge_table.h - Factorized edge cost tables ---------------===//
//
// A pairwise cost table in factorized form (the form of ProblemEdge with class maps): strategy s
// of the row node uses row row_of[s], strategy t of the column node column col_of[t]. The
// reduction (solve_graph_problem.cpp) and the clustering (cluster.cpp) sum, transpose, restrict and
// eliminate over these tables, so their work and memory follow the number of distinct placements of
// a node rather than its number of strategies. Private to lib/solver.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <vector>

#include "apc/solver/problem.h"

namespace apc::solver::detail {

struct Table {
  std::vector<uint32_t> row_of;  // per strategy of the row node: its row
  std::vector<uint32_t> col_of;  // per strategy of the column node: its column
  size_t rows = 0, cols = 0;
  std::vector<double> v;  // rows x cols, row-major

  double at(size_t r, size_t c) const { return v[r * cols + c]; }
  double& at(size_t r, size_t c) { return v[r * cols + c]; }
  double cost(size_t s, size_t t) const { return v[row_of[s] * cols + col_of[t]]; }
  Table transposed() const;
  /// Merges identical rows and identical columns (first occurrence keeps its rank), in place.
  void compact();
};

/// The table of an edge (`ns`, `nt`: the strategy counts of its ends).
Table tableOf(const ProblemEdge& e, size_t ns, size_t nt);
/// The edge src -> dst with this table (factorized).
ProblemEdge edgeOf(uint32_t src, uint32_t dst, Table t);
/// a + b for two tables over the same pair of nodes: the classes of the sum are the pairs of
/// classes that occur (compacted).
Table sum(const Table& a, const Table& b);
/// The table restricted to the given strategies of its row and column nodes (kept -> original).
Table restrict(const Table& t, const std::vector<uint32_t>& rows_kept,
               const std::vector<uint32_t>& cols_kept);

}  // namespace apc::solver::detail
