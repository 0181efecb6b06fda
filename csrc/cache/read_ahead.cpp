// Which ids of a cache's next batches will miss, as the cache stands now: what its read-ahead reads early.
// One pass per batch over its ids with a flat hash set of the ids to leave out, without the GIL.
#include "cache/read_ahead.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cache/line_state.h"

namespace lsm::cache {
namespace {

// A set of non-negative int64 ids: open addressing, linear probing, -1 for an empty slot.
class IdSet {
 public:
  explicit IdSet(size_t expected) {
    size_t capacity = 64;
    while (capacity < expected * 2) capacity *= 2;
    slots_.assign(capacity, kEmpty);
    mask_ = capacity - 1;
  }

  void insert(int64_t id) {
    if (id < 0) return;  // -1 marks a discarded entry in the victim queues: nothing to leave out
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(id);
  }

  bool contains(int64_t id) const {
    for (size_t i = slot(id);; i = (i + 1) & mask_) {
      if (slots_[i] == kEmpty) return false;
      if (slots_[i] == id) return true;
    }
  }

 private:
  static constexpr int64_t kEmpty = -1;

  size_t slot(int64_t id) const { return static_cast<size_t>(mix64(static_cast<uint64_t>(id))) & mask_; }

  void place(int64_t id) {
    for (size_t i = slot(id);; i = (i + 1) & mask_) {
      if (slots_[i] == id) return;
      if (slots_[i] == kEmpty) {
        slots_[i] = id;
        ++size_;
        return;
      }
    }
  }

  void grow() {
    std::vector<int64_t> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, kEmpty);
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (int64_t id : old) {
      if (id != kEmpty) place(id);
    }
  }

  std::vector<int64_t> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

bool held(const int64_t* tags, int64_t num_sets, int ways, int64_t id) {
  const int64_t* set = tags + set_of(id, num_sets) * ways;
  for (int w = 0; w < ways; ++w) {
    if (set[w] == id) return true;
  }
  return false;
}

}  // namespace

std::vector<std::vector<int64_t>> ahead_misses(const int64_t* tags, int64_t num_sets, int ways,
                                               const std::vector<IdSpan>& batches, const std::vector<IdSpan>& known) {
  size_t expected = 0;
  for (const IdSpan& b : batches) expected += b.size;
  IdSet nearer(expected);
  std::vector<std::vector<int64_t>> out(batches.size());
  for (size_t j = 0; j < batches.size(); ++j) {
    IdSet asked(j < known.size() ? known[j].size : 0);
    if (j < known.size()) {
      for (size_t k = 0; k < known[j].size; ++k) asked.insert(known[j].ids[k]);
    }
    const IdSpan& batch = batches[j];
    std::vector<int64_t>& want = out[j];
    for (size_t k = 0; k < batch.size; ++k) {
      const int64_t id = batch.ids[k];
      if (!held(tags, num_sets, ways, id) && !nearer.contains(id) && !asked.contains(id)) want.push_back(id);
    }
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    for (size_t k = 0; k < batch.size; ++k) nearer.insert(batch.ids[k]);  // installed by this batch
  }
  return out;
}

}  // namespace lsm::cache
