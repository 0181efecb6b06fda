// The ids a cache's read-ahead asks for (lsm_gnn/cache/read_ahead.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lsm::cache {

struct IdSpan {
  const int64_t* ids;
  size_t size;
};

// For each of a cache's next batches (of non-negative ids), in order: its sorted distinct ids that the cache
// (``tags``, ``num_sets`` x ``ways``) does not hold, that no earlier batch of ``batches`` has (that batch
// installs them) and that are not in ``known[j]`` (already asked for, or served by the victim buffer).
std::vector<std::vector<int64_t>> ahead_misses(const int64_t* tags, int64_t num_sets, int ways,
                                               const std::vector<IdSpan>& batches, const std::vector<IdSpan>& known);

}  // namespace lsm::cache
