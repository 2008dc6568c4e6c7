//===- lib/solver/edge_table.cpp - Factorized edge cost tables -------------===//
#include "edge_table.h"

#include <cstring>
#include <unordered_map>

namespace apc::solver::detail {

namespace {

uint64_t hashRange(const double* p, size_t n, size_t stride) {
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < n; ++k) {
    uint64_t bits;
    std::memcpy(&bits, p + k * stride, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

/// Classes of identical rows of `t` (by first occurrence): new row per old row; count in `out`.
std::vector<uint32_t> rowClasses(const Table& t, size_t& out) {
  std::vector<uint32_t> cls(t.rows);
  std::unordered_map<uint64_t, std::vector<uint32_t>> buckets;  // hash -> old rows (reps)
  std::vector<uint32_t> rep;                                    // new class -> old row
  for (size_t r = 0; r < t.rows; ++r) {
    auto& bucket = buckets[hashRange(t.v.data() + r * t.cols, t.cols, 1)];
    bool found = false;
    for (uint32_t c : bucket) {
      size_t q = rep[c];
      if (std::equal(t.v.begin() + static_cast<long>(r * t.cols),
                     t.v.begin() + static_cast<long>((r + 1) * t.cols),
                     t.v.begin() + static_cast<long>(q * t.cols))) {
        cls[r] = c;
        found = true;
        break;
      }
    }
    if (!found) {
      cls[r] = static_cast<uint32_t>(rep.size());
      bucket.push_back(cls[r]);
      rep.push_back(static_cast<uint32_t>(r));
    }
  }
  out = rep.size();
  return cls;
}

}  // namespace

Table Table::transposed() const {
  Table t;
  t.row_of = col_of;
  t.col_of = row_of;
  t.rows = cols;
  t.cols = rows;
  t.v.resize(v.size());
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) t.v[c * rows + r] = v[r * cols + c];
  return t;
}

void Table::compact() {
  size_t new_rows = 0;
  std::vector<uint32_t> rc = rowClasses(*this, new_rows);
  if (new_rows < rows) {
    std::vector<double> nv(new_rows * cols);
    std::vector<bool> done(new_rows, false);
    for (size_t r = 0; r < rows; ++r) {
      if (done[rc[r]]) continue;
      done[rc[r]] = true;
      std::copy(v.begin() + static_cast<long>(r * cols),
                v.begin() + static_cast<long>((r + 1) * cols),
                nv.begin() + static_cast<long>(rc[r] * cols));
    }
    v = std::move(nv);
    rows = new_rows;
    for (uint32_t& r : row_of) r = rc[r];
  }
  Table t = transposed();
  size_t new_cols = 0;
  std::vector<uint32_t> cc = rowClasses(t, new_cols);
  if (new_cols < cols) {
    std::vector<double> nv(rows * new_cols);
    std::vector<bool> done(new_cols, false);
    for (size_t c = 0; c < cols; ++c) {
      if (done[cc[c]]) continue;
      done[cc[c]] = true;
      for (size_t r = 0; r < rows; ++r) nv[r * new_cols + cc[c]] = v[r * cols + c];
    }
    v = std::move(nv);
    cols = new_cols;
    for (uint32_t& c : col_of) c = cc[c];
  }
}

Table tableOf(const ProblemEdge& e, size_t ns, size_t nt) {
  Table t;
  t.rows = e.tableRows(ns);
  t.cols = e.tableCols(nt);
  t.v = e.costs.values();
  t.row_of.resize(ns);
  t.col_of.resize(nt);
  for (size_t s = 0; s < ns; ++s) t.row_of[s] = e.rowOf(s);
  for (size_t c = 0; c < nt; ++c) t.col_of[c] = e.colOf(c);
  return t;
}

ProblemEdge edgeOf(uint32_t src, uint32_t dst, Table t) {
  ProblemEdge e;
  e.src = src;
  e.dst = dst;
  e.costs = std::move(t.v);
  e.src_class = std::move(t.row_of);
  e.dst_class = std::move(t.col_of);
  e.num_dst_classes = static_cast<uint32_t>(t.cols);
  return e;
}

Table sum(const Table& a, const Table& b) {
  if (a.row_of == b.row_of && a.col_of == b.col_of) {
    Table out = a;
    for (size_t i = 0; i < out.v.size(); ++i) out.v[i] += b.v[i];
    return out;
  }
  // Product classes: pairs (class in a, class in b) in order of first occurrence.
  auto pairs = [](const std::vector<uint32_t>& x, const std::vector<uint32_t>& y,
                  std::vector<uint32_t>& of, std::vector<std::pair<uint32_t, uint32_t>>& list) {
    std::unordered_map<uint64_t, uint32_t> id;
    of.resize(x.size());
    for (size_t s = 0; s < x.size(); ++s) {
      uint64_t key = (static_cast<uint64_t>(x[s]) << 32) | y[s];
      auto [it, fresh] = id.try_emplace(key, static_cast<uint32_t>(list.size()));
      if (fresh) list.emplace_back(x[s], y[s]);
      of[s] = it->second;
    }
  };
  Table out;
  std::vector<std::pair<uint32_t, uint32_t>> rows, cols;
  pairs(a.row_of, b.row_of, out.row_of, rows);
  pairs(a.col_of, b.col_of, out.col_of, cols);
  out.rows = rows.size();
  out.cols = cols.size();
  out.v.resize(out.rows * out.cols);
  for (size_t r = 0; r < out.rows; ++r)
    for (size_t c = 0; c < out.cols; ++c)
      out.v[r * out.cols + c] =
          a.at(rows[r].first, cols[c].first) + b.at(rows[r].second, cols[c].second);
  out.compact();
  return out;
}

Table restrict(const Table& t, const std::vector<uint32_t>& rows_kept,
               const std::vector<uint32_t>& cols_kept) {
  // Keep only the rows and columns that a kept strategy uses, renumbered in order.
  auto renumber = [](const std::vector<uint32_t>& of, const std::vector<uint32_t>& kept, size_t n,
                     std::vector<uint32_t>& new_of, std::vector<uint32_t>& old_of) {
    std::vector<uint32_t> map(n, UINT32_MAX);
    new_of.resize(kept.size());
    for (size_t k = 0; k < kept.size(); ++k) {
      uint32_t c = of[kept[k]];
      if (map[c] == UINT32_MAX) {
        map[c] = static_cast<uint32_t>(old_of.size());
        old_of.push_back(c);
      }
      new_of[k] = map[c];
    }
  };
  Table out;
  std::vector<uint32_t> old_rows, old_cols;
  renumber(t.row_of, rows_kept, t.rows, out.row_of, old_rows);
  renumber(t.col_of, cols_kept, t.cols, out.col_of, old_cols);
  out.rows = old_rows.size();
  out.cols = old_cols.size();
  out.v.resize(out.rows * out.cols);
  for (size_t r = 0; r < out.rows; ++r)
    for (size_t c = 0; c < out.cols; ++c) out.v[r * out.cols + c] = t.at(old_rows[r], old_cols[c]);
  return out;
}

}  // namespace apc::solver::detail
