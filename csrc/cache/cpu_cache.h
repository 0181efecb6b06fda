// The CPU implementation of the cache's metadata operations. Cache state
// lives in tensors owned by Python (lsm_gnn/cache/software_cache.py); these
// are stateless ops over raw pointers into them. Row bytes are moved by the
// caller with index ops; here only tags and metadata change.
#pragma once

#include <cstdint>

#include "cache/cache_view.h"
#include "cache/line_state.h"
#include "cache/window_index.h"

namespace lsm::cache {

// Looks up the sorted, distinct ids unique[0..n): marks hits used, then
// installs every miss (grouped by set, ascending id within a set) in the
// victim the policy picks (lines this batch used are evicted last). The
// caller must copy hit rows out before writing the misses' rows. node_static (may be null) is the quantized score
// per node. Sets are partitioned among threads, so no locks are needed and
// the decisions do not depend on the thread count.
void assign(const CacheView& cache, const int64_t* unique, int64_t n, const uint16_t* node_static,
            const PolicyParams& params, AssignOutput& out, int num_threads);

// Sets each valid line's next reuse from the window (first `limit` batches)
// and clears its fresh mark.
void scan(const CacheView& cache, const WindowIndex& window, int64_t limit, int num_threads);

}  // namespace lsm::cache
