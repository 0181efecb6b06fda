// The victim buffers of the Preemptive Victim-buffer Prefetcher (PVP; paper
// section 4.3, Figure 7): one queue per future iteration of the window, each
// holding up to `capacity` evicted lines, data and metadata in separate
// arrays. The state lives in tensors owned by Python (lsm_gnn/cache/pvp.py,
// whose reference model defines the semantics); these are stateless ops over
// raw pointers. Plain C++ with LSM_HD so nvcc and g++ both compile it.
#pragma once

#include <cstdint>

#include "cache/line_state.h"

namespace lsm::cache {

struct VictimQueues {
  int64_t num_queues = 0;  // window + 1; the queue of iteration T is T % num_queues
  int64_t capacity = 0;    // lines per queue
  int64_t row_bytes = 0;
  int64_t* count = nullptr;                  // [num_queues] lines claimed (CUDA may overshoot capacity: clamp on read)
  const int64_t* queue_iteration = nullptr;  // [num_queues] the iteration each queue collects lines for
  int64_t* node = nullptr;                   // [num_queues * capacity] node id of each queued line
  uint64_t* record = nullptr;                // [num_queues * capacity] its PVP record (reuse, rank, index in that batch)
  uint8_t* data = nullptr;                   // [num_queues * capacity * row_bytes] its row
};

struct EnqueueCounts {
  int64_t enqueued = 0;
  int64_t dropped_no_reuse = 0;  // no next reuse known (none in the window, or consumed since the scan)
  int64_t dropped_full = 0;      // the queue of its next reuse was full
};

// The iteration whose batch next uses an evicted line, or -1 when none is
// known. The record's reuse counts from the scan at `scan_base`; a reuse at
// or before `iteration` was consumed by a hit since that scan (or the window
// was inexact), and one beyond iteration + window has no queue.
LSM_HD int64_t victim_target(uint64_t record, int64_t iteration, int64_t scan_base, int64_t window) {
  const uint64_t reuse = record_reuse(record);
  if (reuse == kNoReuse) return -1;
  const int64_t target = scan_base + static_cast<int64_t>(reuse);
  return (target > iteration && target <= iteration + window) ? target : -1;
}

// The queue a victim goes to, or -1 (no known reuse, or the queue is not
// collecting for that iteration: never write into a queue of another one).
LSM_HD int64_t victim_queue(const VictimQueues& q, uint64_t record, int64_t iteration, int64_t scan_base) {
  const int64_t target = victim_target(record, iteration, scan_base, q.num_queues - 1);
  if (target < 0) return -1;
  const int64_t queue = target % q.num_queues;
  return q.queue_iteration[queue] == target ? queue : -1;
}

// Offers the victims of one batch (the assign outputs evicted_tag / _record /
// _line, n entries; evicted_tag -1 = nothing evicted) to their queues, and
// copies each accepted victim's row out of cache_data (rows of row_bytes)
// before the caller's fill overwrites the line. Victims claim slots in
// entry order, so which ones a full queue drops is deterministic.
EnqueueCounts enqueue_victims(const VictimQueues& q, const int64_t* evicted_tag, const uint64_t* evicted_record,
                              const int64_t* evicted_line, int64_t n, const uint8_t* cache_data, int64_t iteration,
                              int64_t scan_base, int num_threads);

// PVP serve: which prefetched lines (node, record; `lines` of them) serve a batch (ids[n_ids], each
// id's index inverse[] among its num_unique distinct ids). A line serves if its record's stored index p
// holds its node (ids[p] == node); of several lines for one id the first serves. Writes served[u] (0/1),
// entry[u] (the line) and position[u] (p), -1 where no line serves.
void match_prefetched(const int64_t* ids, int64_t n_ids, const int64_t* inverse, int64_t num_unique,
                      const int64_t* node, const uint64_t* record, int64_t lines, uint8_t* served, int64_t* entry,
                      int64_t* position);

// PVP fill (reinstalling), match and scatter in one pass after the cache's assign: the first valid line of
// each distinct id the cache missed (hit[u] == 0) serves it, and its row goes into the id's new cache line
// (line[u] >= 0), from which the batch's gather then serves it. A valid line of an id the cache hit is
// unused. Writes from_pvp[u] (0/1) and entry[u] (-1 where no line serves); returns the ids served.
int64_t fill_prefetched(const int64_t* ids, int64_t n_ids, const int64_t* inverse, int64_t num_unique,
                        const uint8_t* hit, const int64_t* line, const int64_t* node, const uint64_t* record,
                        int64_t lines, const uint8_t* pf_rows, uint8_t* cache_data, int64_t row_bytes,
                        uint8_t* from_pvp, int64_t* entry);

// PVP scatter: every request position j whose distinct id u = inverse[j] has from_pvp[u] gets the
// prefetched row entry[u]; with `line` (reinstalling, may be null) the row also fills line[u] >= 0.
void scatter_prefetched(uint8_t* rows, int64_t n_ids, uint8_t* cache_data, const uint8_t* pf_rows,
                        const int64_t* inverse, const uint8_t* from_pvp, const int64_t* entry, const int64_t* line,
                        int64_t num_unique, int64_t row_bytes);

}  // namespace lsm::cache
