#include "common/unique_ids.h"

#include <algorithm>
#include <array>

namespace lsm {

namespace {
constexpr int kDigitBits = 11;  // 2048 counters fit in L1
constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
}  // namespace

bool unique_inverse(const int64_t* ids, int64_t n, std::vector<int64_t>& unique, int64_t* inverse) {
  unique.clear();
  if (n == 0) return true;
  int64_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0) return false;
    largest = std::max(largest, ids[i]);
  }
  int bits = 0;
  while (bits < 63 && (uint64_t{1} << bits) <= static_cast<uint64_t>(largest)) ++bits;
  // (id, position) pairs, sorted by id one digit at a time; each pass is stable.
  std::vector<uint64_t> key(ids, ids + n), key_next(n);
  std::vector<int64_t> pos(n), pos_next(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i;
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    std::array<int64_t, kDigitMask + 1> start{};
    for (int64_t i = 0; i < n; ++i) ++start[(key[i] >> shift) & kDigitMask];
    int64_t total = 0;
    for (auto& c : start) {
      const int64_t count = c;
      c = total;
      total += count;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t to = start[(key[i] >> shift) & kDigitMask]++;
      key_next[to] = key[i];
      pos_next[to] = pos[i];
    }
    key.swap(key_next);
    pos.swap(pos_next);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || key[i] != key[i - 1]) unique.push_back(static_cast<int64_t>(key[i]));
    inverse[pos[i]] = static_cast<int64_t>(unique.size()) - 1;
  }
  return true;
}

}  // namespace lsm
