// Raw views of the cache state tensors, shared by the CPU and CUDA ops.
#pragma once

#include <cstdint>

#include "cache/line_state.h"

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
  int64_t* line = nullptr;            // [n] line of unique[u]: where it was hit, or where it is now cached (-1: not cached)
  uint8_t* hit = nullptr;             // [n] 1 if unique[u] was cached
  int64_t* evicted_tag = nullptr;     // [n] node evicted to make room for unique[u], or -1
  uint64_t* evicted_record = nullptr; // [n] that node's PVP record
  int64_t* evicted_line = nullptr;    // [n] the line it was evicted from (its row is still there until the fill), or -1
  int64_t evictions = 0;
  int64_t evicted_in_use = 0;        // evictions of lines this batch had used
  int64_t bypassed = 0;              // misses left uncached (PolicyParams::bypass)
};

// Metadata of a line just filled with node `id`: its next use `record` if known (not fresh),
// else fresh with no known reuse yet.
LSM_HD void install_line(const CacheView& c, int64_t i, int64_t id, const uint16_t* node_static, int64_t iteration,
                         bool known, uint64_t record) {
  c.tags[i] = id;
  c.static_score[i] = node_static ? node_static[id] : 0;
  c.records[i] = known ? record : kNoReuseRecord;
  c.flags[i] = known ? 0 : kFresh;
  c.last_use[i] = iteration;
}

}  // namespace lsm::cache
