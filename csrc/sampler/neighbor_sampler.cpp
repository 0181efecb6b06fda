#include "sampler/neighbor_sampler.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "common/errors.h"
#include "graph/csr_check.h"
#include "sampler/sampler_rng.h"  // shared with the CUDA sampler, which must draw the same positions

namespace lsm::sampler {

template <typename Index>
std::vector<Hop> sample_hops(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges,
                             const int64_t* seeds, int64_t num_seeds, const std::vector<int64_t>& fanouts,
                             uint64_t seed, int64_t iteration, int num_threads, int64_t num_ids) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  if (num_ids != num_nodes && fanouts.size() > 1) {
    // Later hops sample from the neighbors reached, which must then be rows of this CSR.
    throw std::invalid_argument(cat("a CSR whose neighbor ids lie in [0, ", num_ids, ") but whose rows are [0, ",
                                    num_nodes, ") is sampled one hop at a time, got ", fanouts.size(), " fanouts"));
  }
  std::vector<int64_t> frontier(seeds, seeds + num_seeds);
  std::unordered_map<int64_t, int64_t> local;  // global id -> index in the current node list
  local.reserve(static_cast<size_t>(num_seeds) * 8);
  for (int64_t i = 0; i < num_seeds; ++i) {
    if (seeds[i] < 0 || seeds[i] >= num_nodes) {
      throw std::out_of_range(cat("seed node ", seeds[i], " at position ", i, " is outside [0, ", num_nodes, ")"));
    }
    if (!local.emplace(seeds[i], i).second) {
      throw std::invalid_argument(cat("seed node ", seeds[i], " appears twice in the batch; seeds must be distinct"));
    }
  }
  const uint64_t base = batch_key(seed, iteration);
  std::vector<Hop> hops;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t k = fanouts[h];
    const int64_t n = static_cast<int64_t>(frontier.size());
    // Row lengths in parallel: on a memory-mapped CSR that is not in memory, each read of indptr can be a
    // page fault that waits on the disk, and parallel faults keep the disk busy (docs/benchmarks.md, "Out of
    // core: topology and scale"). A bad row cannot throw inside the loop: remember the first, throw after.
    std::vector<int64_t> offset(n + 1, 0);
    int64_t first_bad_row = n;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 256) if (n > 2048)
    for (int64_t i = 0; i < n; ++i) {
      if (!graph::row_ok(indptr, frontier[i], num_edges)) {  // before any size is derived from it
#pragma omp critical(lsm_sampler_bad_indptr)
        first_bad_row = std::min(first_bad_row, i);
        continue;
      }
      offset[i + 1] = sample_count(indptr[frontier[i] + 1] - indptr[frontier[i]], k);
    }
    if (first_bad_row < n) graph::check_row(indptr, frontier[first_bad_row], num_edges);
    for (int64_t i = 0; i < n; ++i) offset[i + 1] += offset[i];
    Hop hop;
    hop.num_dst = n;
    hop.src.resize(offset[n]);
    hop.dst.resize(offset[n]);
    const uint64_t key = hop_key(base, h);
    // An exception cannot leave the parallel loop: remember the first row with a bad neighbor id.
    int64_t first_bad = n;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 256) if (n > 2048)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = frontier[i];
      Stream rng = Stream::for_node(key, v);
      int64_t* out = hop.src.data() + offset[i];
      const int64_t degree = indptr[v + 1] - indptr[v];
      const int64_t got = sample_count(degree, k);
      if (got == degree) {
        for (int64_t j = 0; j < degree; ++j) out[j] = j;
      } else {
        floyd_sample(rng, degree, k, out);
      }
      for (int64_t j = 0; j < got; ++j) {
        const Index u = indices[indptr[v] + out[j]];  // position -> global neighbor id
        if (!graph::neighbor_ok(u, num_ids)) {
#pragma omp critical(lsm_sampler_bad_row)
          first_bad = std::min(first_bad, i);
        }
        out[j] = static_cast<int64_t>(u);
        hop.dst[offset[i] + j] = i;
      }
    }
    if (first_bad < n) graph::check_neighbors(indptr, indices, frontier[first_bad], num_ids);
    // Number newly reached nodes in edge order (serial: the order defines local ids).
    for (auto& s : hop.src) {
      auto [it, inserted] = local.emplace(s, static_cast<int64_t>(frontier.size()));
      if (inserted) frontier.push_back(s);
      s = it->second;
    }
    hop.nodes = frontier;
    hops.push_back(std::move(hop));
  }
  return hops;
}

template std::vector<Hop> sample_hops<int32_t>(const int64_t*, const int32_t*, int64_t, int64_t, const int64_t*,
                                               int64_t, const std::vector<int64_t>&, uint64_t, int64_t, int, int64_t);
template std::vector<Hop> sample_hops<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t, const int64_t*,
                                               int64_t, const std::vector<int64_t>&, uint64_t, int64_t, int, int64_t);

}  // namespace lsm::sampler
