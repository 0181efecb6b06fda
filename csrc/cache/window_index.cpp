#include "cache/window_index.h"

#include <stdexcept>

#include "cache/line_state.h"
#include "common/errors.h"

namespace lsm::cache {

WindowIndex::WindowIndex(int64_t num_nodes)
    : first_iteration_(static_cast<size_t>(num_nodes), -1), first_position_(static_cast<size_t>(num_nodes), 0),
      first_rank_(static_cast<size_t>(num_nodes), 0), last_(static_cast<size_t>(num_nodes)),
      last_slot_(static_cast<size_t>(num_nodes), 0) {
  LSM_CHECK_ARG(num_nodes > 0, "a window index needs num_nodes > 0, got ", num_nodes);
}

void WindowIndex::push(const int64_t* ids, int64_t n, int rank) {
  LSM_CHECK_ARG(batches_.size() < kNoReuse - 1, "the window buffer holds at most ", kNoReuse - 1, " batches");
  const int64_t num_nodes = static_cast<int64_t>(last_.size());
  for (int64_t p = 0; p < n; ++p) {
    if (ids[p] < 0 || ids[p] >= num_nodes) {
      throw std::out_of_range(cat("node id ", ids[p], " at position ", p, " of a window batch is out of range [0, ",
                                  num_nodes, ")"));
    }
  }
  const int64_t iteration = front_ + static_cast<int64_t>(batches_.size());
  batches_.emplace_back();
  Batch& batch = batches_.back();
  batch.rank = rank;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t v = ids[p];
    Occurrence& last = last_[v];
    if (last.iteration == iteration) continue;  // repeated in this batch: the first position counts
    const int64_t slot = static_cast<int64_t>(batch.ids.size());
    batch.ids.push_back(v);
    batch.positions.push_back(p);
    batch.next.emplace_back();
    if (last.iteration >= 0) {
      batches_[last.iteration - front_].next[last_slot_[v]] = Occurrence{iteration, p};
    } else {
      first_iteration_[v] = iteration;
      first_position_[v] = p;
      first_rank_[v] = static_cast<uint8_t>(rank);
    }
    last = Occurrence{iteration, p};
    last_slot_[v] = slot;
  }
}

void WindowIndex::pop() {
  if (batches_.empty()) throw std::out_of_range("pop from an empty window index");
  const Batch& batch = batches_.front();
  for (size_t s = 0; s < batch.ids.size(); ++s) {
    const int64_t v = batch.ids[s];
    // This batch held v's first occurrence; the next one (if any) becomes first.
    const Occurrence& next = batch.next[s];
    first_iteration_[v] = next.iteration;
    first_position_[v] = next.position;
    if (next.iteration >= 0) first_rank_[v] = static_cast<uint8_t>(batches_[next.iteration - front_].rank);
    else last_[v] = Occurrence{};
  }
  batches_.pop_front();
  ++front_;
}

}  // namespace lsm::cache
