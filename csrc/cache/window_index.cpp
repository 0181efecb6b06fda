#include "cache/window_index.h"

#include <stdexcept>

#include "cache/line_state.h"
#include "common/errors.h"

namespace lsm::cache {

namespace {
constexpr uint64_t kMaxHeld = std::numeric_limits<uint32_t>::max();  // occurrences held at once: 32-bit names
}  // namespace

WindowIndex::WindowIndex(int64_t num_nodes, int64_t start_iteration, int32_t rebase_after)
    : front_(start_iteration), rebase_after_(rebase_after) {
  LSM_CHECK_ARG(num_nodes > 0, "a window index needs num_nodes > 0, got ", num_nodes);
  LSM_CHECK_ARG(start_iteration >= 0, "a window index starts at an iteration >= 0, got ", start_iteration);
  LSM_CHECK_ARG(rebase_after >= 1, "rebase_after must be >= 1, got ", rebase_after);
  const auto n = static_cast<size_t>(num_nodes);
  first_iteration_.assign(n, kNone);
  first_position_.assign(n, 0);
  first_rank_.assign(n, 0);
  last_.assign(n, 0);
}

int64_t WindowIndex::allocated_bytes() const {
  return static_cast<int64_t>(sizeof(*this) + first_iteration_.capacity() * sizeof(int32_t) +
                              first_position_.capacity() * sizeof(int32_t) + first_rank_.capacity() +
                              last_.capacity() * sizeof(uint32_t) + ring_.capacity() * sizeof(Occurrence) +
                              batches_.size() * sizeof(Batch));
}

uint64_t WindowIndex::sequence_of_last(int64_t node) const {
  // Held sequence numbers lie in [oldest_, next_), a span under 2^32: the low 32 bits pick one.
  return oldest_ + static_cast<uint32_t>(last_[node] - static_cast<uint32_t>(oldest_));
}

void WindowIndex::reserve_occurrences(uint64_t count) {
  const uint64_t needed = next_ - oldest_ + count;
  if (needed <= ring_.size()) return;
  size_t capacity = ring_.empty() ? 1024 : ring_.size();
  while (capacity < needed) capacity *= 2;
  std::vector<Occurrence> grown(capacity);
  for (uint64_t s = oldest_; s < next_; ++s) grown[s & (capacity - 1)] = occurrence(s);
  ring_.swap(grown);
}

void WindowIndex::rebase() {
  // Every held iteration is >= front_, so counting from front_ keeps them >= 0. An empty window holds
  // none; a non-empty one had its front stored, so the shift fits in 32 bits.
  if (!batches_.empty()) {
    const auto shift = static_cast<int32_t>(front_ - base_);
    for (int32_t& it : first_iteration_) it = it >= 0 ? it - shift : it;
  }
  base_ = front_;
}

void WindowIndex::push(const int64_t* ids, int64_t n, int rank) {
  LSM_CHECK_ARG(batches_.size() < kNoReuse - 1, "the window buffer holds at most ", kNoReuse - 1, " batches");
  LSM_CHECK_ARG(n <= std::numeric_limits<int32_t>::max(), "a window batch holds at most 2^31-1 ids (positions ",
                "are stored in 32 bits), got ", n, "; split the batch");
  LSM_CHECK_ARG(next_ - oldest_ + static_cast<uint64_t>(n) <= kMaxHeld, "the window would hold more than 2^32-1 ",
                "(node, batch) occurrences; use a smaller window or smaller batches");
  const int64_t num_nodes = this->num_nodes();
  for (int64_t p = 0; p < n; ++p) {
    if (ids[p] < 0 || ids[p] >= num_nodes) {
      throw std::out_of_range(cat("node id ", ids[p], " at position ", p, " of a window batch is out of range [0, ",
                                  num_nodes, ")"));
    }
  }
  const int64_t iteration = front_ + size();
  if (iteration - base_ > rebase_after_) rebase();
  const auto stored = static_cast<int32_t>(iteration - base_);  // <= max(rebase_after_, window size)
  reserve_occurrences(static_cast<uint64_t>(n));
  const uint64_t begin = next_;
  batches_.push_back(Batch{begin, rank});
  for (int64_t p = 0; p < n; ++p) {
    const int64_t v = ids[p];
    if (first_iteration_[v] >= 0) {
      const uint64_t last = sequence_of_last(v);
      if (last >= begin) continue;  // repeated in this batch: the first position counts
      Occurrence& previous = occurrence(last);
      // Both batches are held, fewer than kNoReuse apart: the distance modulo 2^16 is the distance.
      previous.next_after = static_cast<uint16_t>(static_cast<uint16_t>(iteration) - previous.iteration);
      previous.next_position = static_cast<int32_t>(p);
    } else {
      first_iteration_[v] = stored;
      first_position_[v] = static_cast<int32_t>(p);
      first_rank_[v] = static_cast<uint8_t>(rank);
    }
    occurrence(next_) = Occurrence{v, 0, static_cast<uint16_t>(iteration), 0};
    last_[v] = static_cast<uint32_t>(next_);
    ++next_;
  }
}

void WindowIndex::pop() {
  if (batches_.empty()) throw std::out_of_range("pop from an empty window index");
  const uint64_t end = batches_.size() > 1 ? batches_[1].begin : next_;
  for (uint64_t s = batches_.front().begin; s < end; ++s) {
    // This batch held the node's first occurrence; the next one (if any) becomes first.
    const Occurrence& o = occurrence(s);
    if (o.next_after > 0) {
      first_iteration_[o.node] = static_cast<int32_t>(front_offset() + o.next_after);
      first_position_[o.node] = o.next_position;
      first_rank_[o.node] = static_cast<uint8_t>(batches_[o.next_after].rank);
    } else {
      first_iteration_[o.node] = kNone;
      first_position_[o.node] = 0;
    }
  }
  oldest_ = end;
  batches_.pop_front();
  ++front_;
}

}  // namespace lsm::cache
