// An index over the window buffer: for every node, its first occurrence in
// the future mini-batches held, kept up to date in O(batch size) per push and
// pop, so a window scan costs O(cache lines) instead of O(window ids).
//
// Memory: kBytesPerNode (13) bytes for every node of the graph, the rest
// O(ids in the window). Per node it keeps the first occurrence, what the scan
// reads (iteration as int32 counted from iteration_base(), position as int32,
// rank), and the low 32 bits of the sequence number of its last occurrence,
// what push follows to link a new occurrence to the previous one. Each
// occurrence held (a node's first in one batch) is a record in a ring indexed
// by sequence number; fewer than 2^32 are held at once, so 32 bits name one.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "cache/line_state.h"

namespace lsm::cache {

class WindowIndex {
 public:
  static constexpr int32_t kNone = -1;  // first_iteration of a node not in the window
  static constexpr int64_t kBytesPerNode = 2 * sizeof(int32_t) + sizeof(uint8_t) + sizeof(uint32_t);
  static constexpr int32_t kMaxStoredIteration = std::numeric_limits<int32_t>::max();

  // `start_iteration`: the iteration of the first batch pushed. Iterations are
  // stored counted from iteration_base() (0 at first); once one would exceed
  // `rebase_after`, the base moves to the front iteration, an O(num_nodes) pass
  // (every 2^31 iterations by default; tests lower it to exercise the move).
  explicit WindowIndex(int64_t num_nodes, int64_t start_iteration = 0, int32_t rebase_after = kMaxStoredIteration);

  // Appends the batch of the next iteration; `rank` is the requesting rank
  // recorded in PVP records. Ids must lie in [0, num_nodes); a batch holds
  // fewer than 2^31 ids (positions are stored in 32 bits).
  void push(const int64_t* ids, int64_t n, int rank);
  // Removes the oldest batch.
  void pop();

  int64_t size() const { return static_cast<int64_t>(batches_.size()); }
  int64_t front_iteration() const { return front_; }
  int64_t iteration_base() const { return base_; }
  // The front iteration counted from iteration_base(): what first_iteration()'s values compare with.
  int64_t front_offset() const { return front_ - base_; }
  int64_t num_nodes() const { return static_cast<int64_t>(last_.size()); }
  // Bytes this index holds: the per-node arrays, the occurrence ring and the batch list.
  int64_t allocated_bytes() const;

  // PVP record of the first occurrence of `id` among the first `limit`
  // batches held, with reuse counted from 1 for the oldest batch; the
  // no-reuse record if none.
  uint64_t next_record(int64_t id, int64_t limit) const {
    return first_record(first_iteration_.data(), first_position_.data(), first_rank_.data(), front_offset(), limit,
                        id);
  }

  // Per-node first occurrence, structure of arrays so a GPU kernel can read
  // them through mapped host memory: iteration counted from iteration_base()
  // (kNone: none), position, rank.
  const int32_t* first_iteration() const { return first_iteration_.data(); }
  const int32_t* first_position() const { return first_position_.data(); }
  const uint8_t* first_rank() const { return first_rank_.data(); }

 private:
  // 16 bytes: a node's first occurrence in one batch held, and where the node occurs next.
  struct Occurrence {
    int64_t node = 0;
    int32_t next_position = 0;
    uint16_t iteration = 0;   // low 16 bits of its batch's iteration: fewer than kNoReuse batches are held
    uint16_t next_after = 0;  // batches from this one to the node's next occurrence; 0: none
  };
  static_assert(sizeof(Occurrence) == 16, "an occurrence record packs into 16 bytes");
  struct Batch {
    uint64_t begin = 0;  // sequence number of its first occurrence; the next batch's begin ends it
    int rank = 0;
  };

  Occurrence& occurrence(uint64_t seq) { return ring_[seq & (ring_.size() - 1)]; }
  uint64_t sequence_of_last(int64_t node) const;  // the full sequence number of a node held in the window
  void reserve_occurrences(uint64_t count);      // ring room for `count` more occurrences
  void rebase();

  std::deque<Batch> batches_;
  int64_t front_ = 0;                  // iteration of batches_.front()
  int64_t base_ = 0;                   // first_iteration_ counts from this iteration
  int32_t rebase_after_ = kMaxStoredIteration;
  std::vector<int32_t> first_iteration_, first_position_;  // per node: first occurrence in the window
  std::vector<uint8_t> first_rank_;
  std::vector<uint32_t> last_;         // per node held: low 32 bits of its last occurrence's sequence number
  std::vector<Occurrence> ring_;       // occurrences held, by sequence number modulo its size (a power of two)
  uint64_t oldest_ = 0, next_ = 0;     // sequence numbers of the oldest occurrence held and of the next one
};

}  // namespace lsm::cache
