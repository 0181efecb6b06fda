#include "graph/csr_check.h"

#include <omp.h>

#include <algorithm>

namespace lsm::graph {

template <typename Index>
void check_csr(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges, int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  for (int64_t v = 0; v < num_nodes; ++v) check_row(indptr, v, num_edges);
  // Exceptions cannot leave a parallel region: find the first bad row, then let the serial check describe it.
  int64_t first_bad = num_nodes;
#pragma omp parallel for num_threads(num_threads) reduction(min : first_bad) schedule(dynamic, 1024)
  for (int64_t v = 0; v < num_nodes; ++v) {
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
      if (!neighbor_ok(indices[e], num_nodes)) {
        first_bad = std::min(first_bad, v);
        break;
      }
    }
  }
  if (first_bad < num_nodes) check_neighbors(indptr, indices, first_bad, num_nodes);
}

template void check_csr<int32_t>(const int64_t*, const int32_t*, int64_t, int64_t, int);
template void check_csr<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t, int);

}  // namespace lsm::graph
