#include "cache/victim_buffer.h"

#include <omp.h>

#include <cstring>
#include <vector>

namespace lsm::cache {

EnqueueCounts enqueue_victims(const VictimQueues& q, const int64_t* evicted_tag, const uint64_t* evicted_record,
                              const int64_t* evicted_line, int64_t n, const uint8_t* cache_data, int64_t iteration,
                              int64_t scan_base, int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  EnqueueCounts counts;
  // Claiming: the paper's atomic counter per queue. One thread advances the
  // counters in entry order (ascending node id), so which victims a full
  // queue drops does not depend on the thread count, like every other cache
  // decision; it is O(victims) integer work. The CUDA op claims with
  // atomicAdd and may keep a different subset when a queue overflows.
  std::vector<std::pair<int64_t, int64_t>> copies;  // (victim line, destination slot)
  for (int64_t u = 0; u < n; ++u) {
    if (evicted_tag[u] == kInvalidTag) continue;
    const int64_t queue = victim_queue(q, evicted_record[u], iteration, scan_base);
    if (queue < 0) {
      ++counts.dropped_no_reuse;
      continue;
    }
    if (q.count[queue] >= q.capacity) {
      ++counts.dropped_full;
      continue;
    }
    const int64_t slot = queue * q.capacity + q.count[queue]++;
    q.node[slot] = evicted_tag[u];
    q.record[slot] = evicted_record[u];
    copies.emplace_back(evicted_line[u], slot);
  }
  counts.enqueued = static_cast<int64_t>(copies.size());
  // Copying the rows: distinct slots, so threads never write the same bytes.
  const int64_t m = counts.enqueued;
  const size_t row = static_cast<size_t>(q.row_bytes);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * q.row_bytes > (int64_t{1} << 20))
  for (int64_t k = 0; k < m; ++k) {
    std::memcpy(q.data + copies[k].second * q.row_bytes, cache_data + copies[k].first * q.row_bytes, row);
  }
  return counts;
}

}  // namespace lsm::cache
