// An index over the window buffer: for every node, its first occurrence in
// the future mini-batches held, kept up to date in O(batch size) per push and
// pop, so a window scan costs O(cache lines) instead of O(window ids).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cache/line_state.h"

namespace lsm::cache {

class WindowIndex {
 public:
  explicit WindowIndex(int64_t num_nodes);

  // Appends the batch of the next iteration; `rank` is the requesting rank
  // recorded in PVP records. Ids must lie in [0, num_nodes).
  void push(const int64_t* ids, int64_t n, int rank);
  // Removes the oldest batch.
  void pop();

  int64_t size() const { return static_cast<int64_t>(batches_.size()); }
  int64_t front_iteration() const { return front_; }
  int64_t num_nodes() const { return static_cast<int64_t>(last_.size()); }

  // PVP record of the first occurrence of `id` among the first `limit`
  // batches held, with reuse counted from 1 for the oldest batch; the
  // no-reuse record if none.
  uint64_t next_record(int64_t id, int64_t limit) const {
    return first_record(first_iteration_.data(), first_position_.data(), first_rank_.data(), front_, limit, id);
  }

  // Per-node first occurrence, structure of arrays so a GPU kernel can read
  // them through mapped host memory: iteration (-1: none), position, rank.
  const int64_t* first_iteration() const { return first_iteration_.data(); }
  const int64_t* first_position() const { return first_position_.data(); }
  const uint8_t* first_rank() const { return first_rank_.data(); }

 private:
  struct Occurrence {
    int64_t iteration = -1;  // -1: none
    int64_t position = 0;
  };
  struct Batch {
    std::vector<int64_t> ids;              // first occurrences only, in batch order
    std::vector<int64_t> positions;        // their index in the pushed batch
    std::vector<Occurrence> next;          // next occurrence of the same node in a later batch
    int rank = 0;
  };

  std::deque<Batch> batches_;
  int64_t front_ = 0;                      // iteration of batches_.front()
  std::vector<int64_t> first_iteration_, first_position_;  // per node: first occurrence in the window
  std::vector<uint8_t> first_rank_;
  std::vector<Occurrence> last_;           // per node: last occurrence in the window
  std::vector<int64_t> last_slot_;         // per node: index of its last occurrence within its batch
};

}  // namespace lsm::cache
