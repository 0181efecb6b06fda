// Uniform neighbor sampling without replacement, per-hop fanouts, over CSR.
// Deterministic given (seed, iteration): every random draw comes from a
// counter-based stream keyed by (seed, iteration, hop, node), so the result
// does not depend on the thread count or schedule, and a window buffer can
// sample a batch ahead of time that the trainer later samples identically.
#pragma once

#include <cstdint>
#include <vector>

namespace lsm::sampler {

// One hop, DGL-block style: the first `num_dst` entries of `nodes` are the
// hop's destination nodes (all nodes of the previous hop), the rest are
// newly reached nodes; edges are local indices into `nodes` (src) and into
// its dst prefix (dst), edges flowing src -> dst.
struct Hop {
  std::vector<int64_t> nodes;
  int64_t num_dst = 0;
  std::vector<int64_t> src;
  std::vector<int64_t> dst;
};

// hops[0] samples the seeds' neighbors; hops[h+1].nodes[0:num_dst] == hops[h].nodes.
// A fanout of -1 takes every neighbor. `indices` holds `num_edges` entries, ids in
// [0, num_ids): the rows' own id space (num_ids == num_nodes), or, for one hop over a
// relation between two node types, the source type's.
// Every row visited and every neighbor id read is bounds-checked: a corrupt
// CSR throws lsm::graph::CorruptGraph, a bad seed std::out_of_range.
template <typename Index>
std::vector<Hop> sample_hops(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges,
                             const int64_t* seeds, int64_t num_seeds, const std::vector<int64_t>& fanouts,
                             uint64_t seed, int64_t iteration, int num_threads, int64_t num_ids);

}  // namespace lsm::sampler
