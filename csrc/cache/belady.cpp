#include "cache/belady.h"

#include <queue>
#include <utility>

#include "cache/line_state.h"
#include "common/errors.h"

namespace lsm::cache {

namespace {

constexpr int64_t kNever = INT64_MAX;

// next[t][j]: the iteration batches[t][j] is requested again (kNever if not).
std::vector<std::vector<int64_t>> next_uses(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes) {
  const int64_t T = static_cast<int64_t>(batches.size());
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
  return next;
}

// Serves the trace batch by batch: `cache.touch(v, n)` says whether v is cached and, if so, records its next
// use n; then the batch's misses are offered with `cache.offer(v, n)`, which keeps v or bypasses it. Hits and
// requests count from iteration count_from on.
template <typename Cache>
BeladyResult serve_trace(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes, int64_t count_from,
                         Cache& cache) {
  const int64_t T = static_cast<int64_t>(batches.size());
  const auto next = next_uses(batches, num_nodes);
  BeladyResult result;
  std::vector<std::pair<int64_t, int64_t>> misses;  // (id, next use)
  for (int64_t t = 0; t < T; ++t) {
    const auto& batch = batches[t];
    const bool counted = t >= count_from;
    if (counted) result.requests += static_cast<int64_t>(batch.size());
    misses.clear();
    for (size_t j = 0; j < batch.size(); ++j) {
      if (cache.touch(batch[j], next[t][j])) {
        if (counted) ++result.hits;
      } else {
        misses.emplace_back(batch[j], next[t][j]);
      }
    }
    for (const auto& [v, n] : misses) cache.offer(v, n);
  }
  return result;
}

// `capacity` lines, any id anywhere. cached_next[v]: v's next use while cached,
// -1 when not cached. The heap holds (next use, id) with stale entries skipped
// when they surface.
class FullyAssociative {
 public:
  FullyAssociative(int64_t num_nodes, int64_t capacity)
      : cached_next_(static_cast<size_t>(num_nodes), -1), capacity_(capacity) {}

  bool touch(int64_t v, int64_t n) {
    if (cached_next_[v] < 0) return false;
    keep(v, n);
    return true;
  }

  void offer(int64_t v, int64_t n) {
    if (size_ < capacity_) {
      keep(v, n);
      ++size_;
      return;
    }
    while (!heap_.empty() && cached_next_[heap_.top().second] != heap_.top().first) heap_.pop();
    if (!heap_.empty() && heap_.top().first > n) {  // else bypass: every cached id is needed sooner than v
      cached_next_[heap_.top().second] = -1;
      heap_.pop();
      keep(v, n);
    }
  }

 private:
  void keep(int64_t v, int64_t n) {
    cached_next_[v] = n;
    heap_.emplace(n, v);
  }

  std::vector<int64_t> cached_next_;
  std::priority_queue<std::pair<int64_t, int64_t>> heap_;
  int64_t capacity_;
  int64_t size_ = 0;
};

// num_sets x ways lines, id v only in set set_of(v, num_sets). Sets never share
// ids, so MIN per set is MIN of the whole: each set applies the fully
// associative rule to its own lines (a linear scan finds the farthest next
// use; ways is small).
class SetAssociative {
 public:
  SetAssociative(int64_t num_nodes, int64_t num_sets, int64_t ways)
      : num_sets_(num_sets), ways_(ways), tag_(static_cast<size_t>(num_sets * ways), -1),
        line_next_(static_cast<size_t>(num_sets * ways), kNever), filled_(static_cast<size_t>(num_sets), 0),
        where_(static_cast<size_t>(num_nodes), -1) {}

  bool touch(int64_t v, int64_t n) {
    const int64_t line = where_[v];
    if (line < 0) return false;
    line_next_[line] = n;
    return true;
  }

  void offer(int64_t v, int64_t n) {
    if (ways_ == 0) return;
    const int64_t s = set_of(v, num_sets_), base = s * ways_;
    int64_t line = base + filled_[s];
    if (filled_[s] < ways_) {
      ++filled_[s];
    } else {
      line = base;
      for (int64_t w = base + 1; w < base + ways_; ++w) {
        if (line_next_[w] > line_next_[line]) line = w;
      }
      if (line_next_[line] <= n) return;  // bypass: every line of the set is needed sooner than v
      where_[tag_[line]] = -1;
    }
    tag_[line] = v;
    line_next_[line] = n;
    where_[v] = line;
  }

 private:
  int64_t num_sets_, ways_;
  std::vector<int64_t> tag_, line_next_, filled_;
  std::vector<int64_t> where_;  // line caching v, -1 when not cached
};

}  // namespace

BeladyResult belady_min(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes, int64_t capacity,
                        int64_t count_from) {
  LSM_CHECK_ARG(capacity >= 0, "capacity must be >= 0, got ", capacity);
  FullyAssociative cache(num_nodes, capacity);
  return serve_trace(batches, num_nodes, count_from, cache);
}

BeladyResult belady_set_associative(const std::vector<std::vector<int64_t>>& batches, int64_t num_nodes,
                                    int64_t num_sets, int64_t ways, int64_t count_from) {
  LSM_CHECK_ARG(num_sets >= 1, "num_sets must be >= 1, got ", num_sets);
  LSM_CHECK_ARG(ways >= 0, "ways must be >= 0, got ", ways);
  SetAssociative cache(num_nodes, num_sets, ways);
  return serve_trace(batches, num_nodes, count_from, cache);
}

}  // namespace lsm::cache
