// The CPU implementation of the cache's metadata operations. Cache state
// lives in tensors owned by Python (lsm_gnn/cache/software_cache.py); these
// are stateless ops over raw pointers into them. Row bytes are moved by the
// caller with index ops; here only tags and metadata change.
#pragma once

#include <cstdint>

#include "cache/cache_view.h"
#include "cache/line_state.h"

namespace lsm::cache {

// Looks up the sorted, distinct ids unique[0..n): marks hits used, then
// installs every miss (grouped by set, ascending id within a set) in the
// victim the policy picks (lines this batch used are evicted last). With
// params' first occurrences, hit and installed lines take their next use
// (assign_record) instead of the fresh mark, and with params.bypass a miss
// whose key is below its victim's is left uncached (out.line -1). The
// caller must copy hit rows out before writing the misses' rows. node_static (may be null) is the quantized score
// per node. Sets are partitioned among threads, so no locks are needed and
// the decisions do not depend on the thread count.
void assign(const CacheView& cache, const int64_t* unique, int64_t n, const uint16_t* node_static,
            const PolicyParams& params, AssignOutput& out, int num_threads);

// The window scan over `lines` lines: sets each valid line's next reuse from
// the window's per-node first occurrences (WindowIndex's arrays; iteration
// `front` is reuse 1, occurrences beyond `limit` batches count as none) and
// clears its fresh mark. Only tags, records and flags take part.
void scan(int64_t lines, const int64_t* tags, uint64_t* records, uint8_t* flags, const int32_t* first_iteration,
          const int32_t* first_position, const uint8_t* first_rank, int64_t num_nodes, int64_t front,
          int64_t limit, int num_threads);

}  // namespace lsm::cache
