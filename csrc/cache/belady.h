// Belady's MIN over a recorded trace (see lsm_gnn/cache/belady.py for the
// definition and the pure Python version it must agree with).
#pragma once

#include <cstdint>
#include <vector>

namespace lsm::cache {

struct BeladyResult {
  int64_t hits = 0;
  int64_t requests = 0;  // distinct ids per batch, summed
};

// batches[t] holds the distinct ids of iteration t (any order), all in
// [0, num_nodes). capacity is in lines. Hits and requests are counted from
// iteration count_from on (earlier iterations only warm the cache).
BeladyResult belady_min(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes, int64_t capacity,
                        int64_t count_from = 0);

// The same optimum for a set-associative cache: id v may only live in set
// set_of(v, num_sets) (line_state.h, as the cache maps it), which holds `ways`
// lines. With num_sets = 1 it equals belady_min at capacity = ways.
BeladyResult belady_set_associative(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes,
                                    int64_t num_sets, int64_t ways, int64_t count_from = 0);

}  // namespace lsm::cache
