// Static node scores over CSR topology, used by the cache's static policy.
#pragma once

#include <cstdint>
#include <vector>

namespace lsm {

struct PageRankResult {
  std::vector<float> scores;  // sums to 1
  int iterations = 0;
  double residual = 0;        // L1 change of the last iteration
};

// Reverse PageRank: a random walk that steps from node v to a uniformly
// chosen node of its CSR row (the direction neighbor sampling moves), so a
// node's score estimates how often sampling reaches it. Dangling nodes (empty
// rows) and teleports spread uniformly. Index type is int32 or int64.
// `indices` holds `num_edges` entries; a CSR that points outside them or
// names a node outside [0, num_nodes) throws lsm::graph::CorruptGraph.
template <typename Index>
PageRankResult reverse_pagerank(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges,
                                double damping, int max_iterations, double tolerance, int num_threads);

}  // namespace lsm
