#include "cache/belady.h"

#include <queue>
#include <utility>

#include "common/errors.h"

namespace lsm::cache {

BeladyResult belady_min(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes, int64_t capacity,
                        int64_t count_from) {
  LSM_CHECK_ARG(capacity >= 0, "capacity must be >= 0, got ", capacity);
  constexpr int64_t kNever = INT64_MAX;
  const int64_t T = static_cast<int64_t>(batches.size());
  // next[t][j]: the iteration batches[t][j] is requested again (kNever if not).
  std::vector<std::vector<int64_t>> next(T);
  std::vector<int64_t> seen(static_cast<size_t>(num_nodes), kNever);
  for (int64_t t = T - 1; t >= 0; --t) {
    const auto& batch = batches[t];
    next[t].resize(batch.size());
    for (size_t j = 0; j < batch.size(); ++j) {
      const int64_t v = batch[j];
      if (v < 0 || v >= num_nodes) throw std::out_of_range(cat("trace id ", v, " is outside [0, ", num_nodes, ")"));
      next[t][j] = seen[v];
      seen[v] = t;
    }
  }
  // cached_next[v]: v's next use while cached, -1 when not cached. The heap
  // holds (next use, id) with stale entries skipped when they surface.
  std::vector<int64_t> cached_next(static_cast<size_t>(num_nodes), -1);
  std::priority_queue<std::pair<int64_t, int64_t>> heap;
  int64_t size = 0;
  BeladyResult result;
  std::vector<std::pair<int64_t, int64_t>> misses;
  for (int64_t t = 0; t < T; ++t) {
    const auto& batch = batches[t];
    const bool counted = t >= count_from;
    if (counted) result.requests += static_cast<int64_t>(batch.size());
    misses.clear();
    for (size_t j = 0; j < batch.size(); ++j) {
      const int64_t v = batch[j];
      if (cached_next[v] >= 0) {
        if (counted) ++result.hits;
        cached_next[v] = next[t][j];
        heap.emplace(next[t][j], v);
      } else {
        misses.emplace_back(next[t][j], v);
      }
    }
    for (const auto& [n, v] : misses) {
      if (size < capacity) {
        cached_next[v] = n;
        heap.emplace(n, v);
        ++size;
        continue;
      }
      while (!heap.empty() && cached_next[heap.top().second] != heap.top().first) heap.pop();
      if (!heap.empty() && heap.top().first > n) {
        cached_next[heap.top().second] = -1;
        heap.pop();
        cached_next[v] = n;
        heap.emplace(n, v);
      }
    }
  }
  return result;
}

}  // namespace lsm::cache
