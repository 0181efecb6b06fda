// The CPU implementation of the cache's metadata operations. Cache state
// lives in tensors owned by Python (lsm_gnn/cache/software_cache.py); these
// are stateless ops over raw pointers into them. Row bytes are moved by the
// caller with index ops; here only tags and metadata change.
#pragma once

#include <cstdint>

#include "cache/line_state.h"
#include "cache/window_index.h"

namespace lsm::cache {

struct CacheView {
  int64_t num_sets = 0;
  int ways = 32;
  int64_t* tags = nullptr;        // [lines] node id or kInvalidTag
  uint64_t* records = nullptr;    // [lines] PVP record (next reuse, rank, index)
  uint8_t* flags = nullptr;       // [lines] kFresh
  uint16_t* static_score = nullptr;  // [lines] quantized static score of the cached node
  int64_t* last_use = nullptr;    // [lines] last iteration that used the line (-1: never)
  int32_t* rr_pointer = nullptr;  // [sets] next round-robin way
};

struct AssignOutput {
  int64_t* line = nullptr;            // [n] line serving unique[u], or -1 when bypassed
  uint8_t* hit = nullptr;             // [n] 1 if unique[u] was cached
  int64_t* evicted_tag = nullptr;     // [n] node evicted to make room for unique[u], or -1
  uint64_t* evicted_record = nullptr; // [n] that node's PVP record
  int64_t evictions = 0;
  int64_t bypassed = 0;
};

// Looks up the sorted, distinct ids unique[0..n): marks hits used, then
// installs every miss (grouped by set, ascending id within a set) in the
// victim the policy picks. node_static (may be null) is the quantized score
// per node. Sets are partitioned among threads, so no locks are needed and
// the decisions do not depend on the thread count.
void assign(const CacheView& cache, const int64_t* unique, int64_t n, const uint16_t* node_static,
            const PolicyParams& params, AssignOutput& out, int num_threads);

// Sets each valid line's next reuse from the window (first `limit` batches)
// and clears its fresh mark.
void scan(const CacheView& cache, const WindowIndex& window, int64_t limit, int num_threads);

}  // namespace lsm::cache
