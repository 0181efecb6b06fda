#include "graph/pagerank.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "common/errors.h"
#include "graph/csr_check.h"

namespace lsm {

namespace {

// Atomic add on a double through its bit pattern. Relaxed order suffices:
// the additions only need to be complete at the end of the parallel loop,
// whose implicit barrier orders them before anyone reads the sums.
inline void atomic_add(double* target, double value) {
  uint64_t* bits = reinterpret_cast<uint64_t*>(target);
  uint64_t seen = __atomic_load_n(bits, __ATOMIC_RELAXED);
  while (true) {
    double current;
    std::memcpy(&current, &seen, sizeof(double));
    const double next = current + value;
    uint64_t next_bits;
    std::memcpy(&next_bits, &next, sizeof(double));
    if (__atomic_compare_exchange_n(bits, &seen, next_bits, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  }
}

}  // namespace

template <typename Index>
PageRankResult reverse_pagerank(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges,
                                double damping, int max_iterations, double tolerance, int num_threads) {
  LSM_CHECK_ARG(num_nodes > 0, "reverse_pagerank needs at least one node");
  LSM_CHECK_ARG(damping >= 0.0 && damping < 1.0, "damping must be in [0, 1), got ", damping);
  LSM_CHECK_ARG(max_iterations >= 1, "max_iterations must be >= 1, got ", max_iterations);
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  // One O(N + E) scan up front costs a fraction of one iteration and keeps the atomic loop below check-free.
  graph::check_csr(indptr, indices, num_nodes, num_edges, num_threads);

  std::vector<double> rank(num_nodes, 1.0 / static_cast<double>(num_nodes));
  std::vector<double> next(num_nodes);
  PageRankResult result;
  for (int it = 0; it < max_iterations; ++it) {
    double dangling = 0.0;
#pragma omp parallel for num_threads(num_threads) reduction(+ : dangling) schedule(static)
    for (int64_t v = 0; v < num_nodes; ++v) {
      next[v] = 0.0;
      if (indptr[v + 1] == indptr[v]) dangling += rank[v];
    }
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1024)
    for (int64_t v = 0; v < num_nodes; ++v) {
      const int64_t begin = indptr[v], end = indptr[v + 1];
      if (begin == end) continue;
      const double share = rank[v] / static_cast<double>(end - begin);
      for (int64_t e = begin; e < end; ++e) atomic_add(&next[static_cast<int64_t>(indices[e])], share);
    }
    const double base = (1.0 - damping + damping * dangling) / static_cast<double>(num_nodes);
    double residual = 0.0;
#pragma omp parallel for num_threads(num_threads) reduction(+ : residual) schedule(static)
    for (int64_t v = 0; v < num_nodes; ++v) {
      const double value = base + damping * next[v];
      residual += std::fabs(value - rank[v]);
      rank[v] = value;
    }
    result.iterations = it + 1;
    result.residual = residual;
    if (residual < tolerance) break;
  }
  result.scores.assign(rank.begin(), rank.end());
  return result;
}

template PageRankResult reverse_pagerank<int32_t>(const int64_t*, const int32_t*, int64_t, int64_t, double, int, double,
                                                  int);
template PageRankResult reverse_pagerank<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t, double, int, double,
                                                  int);

}  // namespace lsm
