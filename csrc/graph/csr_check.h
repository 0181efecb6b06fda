// Bounds checks for CSR topology read from disk. The native code follows
// every index it reads (indptr -> positions in indices -> node ids), so a
// corrupt file must raise an error naming the fault, never crash the process
// or silently give a wrong answer. Python opens datasets with cheap O(num_nodes)
// checks only; the O(num_edges) neighbor ids are checked here, where they are read.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/errors.h"

namespace lsm::graph {

// A fault in one CSR array. `array()` is "indptr" or "indices", so the Python
// side can name the file (it becomes lsm_gnn._C.CorruptGraphError(message, array)).
class CorruptGraph : public std::runtime_error {
 public:
  CorruptGraph(const char* array, const std::string& message) : std::runtime_error(message), array_(array) {}
  const char* array() const noexcept { return array_; }

 private:
  const char* array_;
};

// Row v is [indptr[v], indptr[v+1]): an ordered range within [0, num_edges].
inline bool row_ok(const int64_t* indptr, int64_t v, int64_t num_edges) {
  const int64_t begin = indptr[v], end = indptr[v + 1];
  return 0 <= begin && begin <= end && end <= num_edges;
}

inline void check_row(const int64_t* indptr, int64_t v, int64_t num_edges) {
  if (!row_ok(indptr, v, num_edges)) {
    throw CorruptGraph("indptr", cat("the row of node ", v, " is [indptr[", v, "], indptr[", v + 1, "]) = [", indptr[v],
                                     ", ", indptr[v + 1], "), which is not an ordered range within [0, num_edges=",
                                     num_edges, "]"));
  }
}

template <typename Index>
inline bool neighbor_ok(Index u, int64_t num_nodes) {
  return u >= 0 && static_cast<int64_t>(u) < num_nodes;
}

// Throws for the first out-of-range neighbor id in row v (whose range is valid), if any.
template <typename Index>
void check_neighbors(const int64_t* indptr, const Index* indices, int64_t v, int64_t num_nodes) {
  for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
    if (!neighbor_ok(indices[e], num_nodes)) {
      throw CorruptGraph("indices", cat("neighbor id ", static_cast<int64_t>(indices[e]), " of node ", v,
                                        " at position ", e, " is outside [0, ", num_nodes, ")"));
    }
  }
}

// Checks every row and every neighbor id: O(num_nodes + num_edges), for
// whole-graph algorithms (PageRank) whose cost is many times that anyway.
template <typename Index>
void check_csr(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges, int num_threads);

}  // namespace lsm::graph
