#include "cache/victim_buffer.h"

#include <omp.h>

#include <algorithm>
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
  // decision; it is O(victims) integer work. The Triton twin claims in the
  // same order (ranks by a running sum), so a full queue keeps the same ones.
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

void match_prefetched(const int64_t* ids, int64_t n_ids, const int64_t* inverse, int64_t num_unique,
                      const int64_t* node, const uint64_t* record, int64_t lines, uint8_t* served, int64_t* entry,
                      int64_t* position) {
  std::fill(served, served + num_unique, uint8_t{0});
  std::fill(entry, entry + num_unique, int64_t{-1});
  std::fill(position, position + num_unique, int64_t{-1});
  for (int64_t e = 0; e < lines; ++e) {  // in line order: the first valid line of an id serves it
    const uint64_t p = record[e] & kIndexMask;
    if (p >= static_cast<uint64_t>(n_ids) || ids[p] != node[e]) continue;
    const int64_t u = inverse[p];
    if (served[u]) continue;
    served[u] = 1;
    entry[u] = e;
    position[u] = static_cast<int64_t>(p);
  }
}

int64_t fill_prefetched(const int64_t* ids, int64_t n_ids, const int64_t* inverse, int64_t num_unique,
                        const uint8_t* hit, const int64_t* line, const int64_t* node, const uint64_t* record,
                        int64_t lines, const uint8_t* pf_rows, uint8_t* cache_data, int64_t row_bytes,
                        uint8_t* from_pvp, int64_t* entry) {
  std::fill(from_pvp, from_pvp + num_unique, uint8_t{0});
  std::fill(entry, entry + num_unique, int64_t{-1});
  const size_t row = static_cast<size_t>(row_bytes);
  int64_t served = 0;
  for (int64_t e = 0; e < lines; ++e) {  // in line order: the first valid line of an id serves it
    const uint64_t p = record[e] & kIndexMask;
    if (p >= static_cast<uint64_t>(n_ids) || ids[p] != node[e]) continue;
    const int64_t u = inverse[p];
    if (hit[u] || from_pvp[u]) continue;  // a cache hit wins over a queued copy
    from_pvp[u] = 1;
    entry[u] = e;
    ++served;
    if (line[u] >= 0) std::memcpy(cache_data + line[u] * row_bytes, pf_rows + e * row_bytes, row);
  }
  return served;
}

void scatter_prefetched(uint8_t* rows, int64_t n_ids, uint8_t* cache_data, const uint8_t* pf_rows,
                        const int64_t* inverse, const uint8_t* from_pvp, const int64_t* entry, const int64_t* line,
                        int64_t num_unique, int64_t row_bytes) {
  const size_t row = static_cast<size_t>(row_bytes);
  for (int64_t j = 0; j < n_ids; ++j) {
    const int64_t u = inverse[j];
    if (from_pvp[u]) std::memcpy(rows + j * row_bytes, pf_rows + entry[u] * row_bytes, row);
  }
  if (line == nullptr) return;
  for (int64_t u = 0; u < num_unique; ++u) {
    if (from_pvp[u] && line[u] >= 0) std::memcpy(cache_data + line[u] * row_bytes, pf_rows + entry[u] * row_bytes, row);
  }
}

}  // namespace lsm::cache
