#include "cache/cpu_cache.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace lsm::cache {

namespace {

// The way of `set` to fill at this iteration: an invalid way, else the
// policy's pick among lines not used at this iteration, else among all.
int choose_victim(const CacheView& c, int64_t set, const PolicyParams& p) {
  const int64_t base = set * c.ways;
  for (int w = 0; w < c.ways; ++w) {
    if (c.tags[base + w] == kInvalidTag) return w;
  }
  for (int pass = 0; pass < 2; ++pass) {
    const bool any_line = pass == 1;  // second pass: every line was used this iteration
    if (p.policy == kRoundRobin) {
      const int start = c.rr_pointer[set];
      for (int k = 0; k < c.ways; ++k) {
        const int w = (start + k) % c.ways;
        if (any_line || c.last_use[base + w] != p.iteration) {
          c.rr_pointer[set] = (w + 1) % c.ways;
          return w;
        }
      }
      continue;
    }
    int best = -1;
    uint64_t best_key = std::numeric_limits<uint64_t>::max();
    for (int w = 0; w < c.ways; ++w) {
      const int64_t i = base + w;
      if (!any_line && c.last_use[i] == p.iteration) continue;
      const uint64_t key = victim_key(c.records[i], c.flags[i], c.static_score[i], c.last_use[i], p);
      if (best < 0 || key < best_key) {
        best = w;
        best_key = key;
      }
    }
    if (best >= 0) return best;
  }
  return 0;  // unreachable: the second pass always finds a way
}

// One set's victims for a batch, in the order choose_victim would pick them while nothing else in the set
// changes: its invalid ways, then its lines not used at this iteration by (key, way). Keys are computed once
// per set instead of once per miss and way; a line taken leaves the order. Once every way was used this
// iteration (an oversubscribed set) choose_victim's second pass decides, as before.
class SetVictims {
 public:
  explicit SetVictims(int ways) : key_(ways), tier_(ways) {}

  void reset(const CacheView& c, int64_t set, const PolicyParams& p) {
    set_ = set;
    const int64_t base = set * c.ways;
    for (int w = 0; w < c.ways; ++w) {
      const int64_t i = base + w;
      if (c.tags[i] == kInvalidTag) {
        tier_[w] = kInvalid;
        key_[w] = 0;
      } else if (c.last_use[i] == p.iteration) {
        tier_[w] = kUsed;
        key_[w] = 0;
      } else {
        tier_[w] = kValid;
        key_[w] = victim_key(c.records[i], c.flags[i], c.static_score[i], c.last_use[i], p);
      }
    }
  }

  int next(const CacheView& c, const PolicyParams& p) const {
    int best = -1;
    for (int w = 0; w < c.ways; ++w) {
      if (tier_[w] == kUsed) continue;
      if (best < 0 || tier_[w] < tier_[best] || (tier_[w] == tier_[best] && key_[w] < key_[best])) best = w;
    }
    return best >= 0 ? best : choose_victim(c, set_, p);
  }

  void taken(int w) { tier_[w] = kUsed; }

 private:
  enum : uint8_t { kInvalid = 0, kValid = 1, kUsed = 2 };
  std::vector<uint64_t> key_;
  std::vector<uint8_t> tier_;
  int64_t set_ = 0;
};

// The misses (u with !hit[u]) as (set, u) grouped by set, ascending u within a set: a counting sort by set
// where the sets are few beside the misses, else a stable sort.
std::vector<std::pair<int64_t, int64_t>> misses_by_set(const CacheView& c, const std::vector<int64_t>& set,
                                                       const uint8_t* hit) {
  std::vector<std::pair<int64_t, int64_t>> misses;
  for (int64_t u = 0; u < static_cast<int64_t>(set.size()); ++u) {
    if (!hit[u]) misses.emplace_back(set[u], u);
  }
  const int64_t m = static_cast<int64_t>(misses.size());
  if (c.num_sets > 4 * m + 1024) {
    std::stable_sort(misses.begin(), misses.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return misses;
  }
  std::vector<int64_t> start(c.num_sets + 1, 0);
  for (const auto& miss : misses) ++start[miss.first + 1];
  for (int64_t s = 0; s < c.num_sets; ++s) start[s + 1] += start[s];
  std::vector<std::pair<int64_t, int64_t>> grouped(misses.size());
  for (const auto& miss : misses) grouped[start[miss.first]++] = miss;
  return grouped;
}

// Phase 1: marks every id the cache holds as hit and used, and clears the other outputs; returns each id's set.
// Distinct ids map to distinct lines, so writes never collide.
std::vector<int64_t> mark_hits(const CacheView& c, const int64_t* unique, int64_t n, const PolicyParams& p,
                               bool known, AssignOutput& out, int num_threads) {
  std::vector<int64_t> set(n);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n > 4096)
  for (int64_t u = 0; u < n; ++u) {
    set[u] = set_of(unique[u], c.num_sets);
    const int64_t base = set[u] * c.ways;
    out.line[u] = -1;
    out.hit[u] = 0;
    out.evicted_tag[u] = kInvalidTag;
    out.evicted_record[u] = kNoReuseRecord;
    out.evicted_line[u] = -1;
    for (int w = 0; w < c.ways; ++w) {
      const int64_t i = base + w;
      if (c.tags[i] == unique[u]) {
        out.line[u] = i;
        out.hit[u] = 1;
        c.last_use[i] = p.iteration;
        if (known) {  // its next use, read now
          c.records[i] = assign_record(p, unique[u]);
          c.flags[i] &= static_cast<uint8_t>(~kFresh);
        } else if (p.iteration > p.scan_base) {
          c.flags[i] |= kFresh;  // the predicted reuse is being consumed
        }
        break;
      }
    }
  }
  return set;
}

// Where each set's run of misses starts in ``misses`` (grouped by set), and then misses.size().
std::vector<int64_t> set_runs(const std::vector<std::pair<int64_t, int64_t>>& misses) {
  std::vector<int64_t> run_start;
  for (size_t k = 0; k < misses.size(); ++k) {
    if (k == 0 || misses[k].first != misses[k - 1].first) run_start.push_back(static_cast<int64_t>(k));
  }
  run_start.push_back(static_cast<int64_t>(misses.size()));
  return run_start;
}

// Belady's bypass: whether a miss the policy would evict before the victim at line i stays uncached.
bool bypasses(const CacheView& c, int64_t i, uint64_t record, int64_t id, const uint16_t* node_static,
              const PolicyParams& p) {
  const uint16_t score = node_static ? node_static[id] : 0;
  return victim_key(record, 0, score, p.iteration, p) <
         victim_key(c.records[i], c.flags[i], c.static_score[i], c.last_use[i], p);
}

// Phase 2: installs the misses (``misses``: (set, u) grouped by set) in their victims; one thread owns a whole
// set, so installing needs no atomics.
void install_misses(const CacheView& c, const int64_t* unique, const uint16_t* node_static, const PolicyParams& p,
                    bool known, const std::vector<std::pair<int64_t, int64_t>>& misses, AssignOutput& out,
                    int num_threads) {
  const std::vector<int64_t> run_start = set_runs(misses);
  const int64_t num_runs = static_cast<int64_t>(run_start.size()) - 1;
  int64_t evictions = 0, evicted_in_use = 0, bypassed = 0;
#pragma omp parallel num_threads(num_threads) if (num_runs > 256)
  {
    std::vector<int64_t> installed_by(c.ways);  // way -> unique index installed there by this batch
    SetVictims victims(c.ways);
    const bool in_key_order = p.policy != kRoundRobin;  // round robin picks by its pointer, not by keys
#pragma omp for schedule(dynamic, 64) reduction(+ : evictions, evicted_in_use, bypassed)
    for (int64_t s = 0; s < num_runs; ++s) {
      std::fill(installed_by.begin(), installed_by.end(), -1);
      if (in_key_order) victims.reset(c, misses[run_start[s]].first, p);
      for (int64_t k = run_start[s]; k < run_start[s + 1]; ++k) {
        const int64_t set = misses[k].first, u = misses[k].second;
        const int w = in_key_order ? victims.next(c, p) : choose_victim(c, set, p);
        const int64_t i = set * c.ways + w;
        const uint64_t record = known ? assign_record(p, unique[u]) : kNoReuseRecord;
        if (p.bypass && known && c.tags[i] != kInvalidTag && bypasses(c, i, record, unique[u], node_static, p)) {
          ++bypassed;
          continue;
        }
        if (c.tags[i] != kInvalidTag) {
          out.evicted_tag[u] = c.tags[i];
          // A line this batch installed holds no row yet: no victim queue may take it.
          out.evicted_record[u] = installed_by[w] >= 0 ? kNoReuseRecord : c.records[i];
          out.evicted_line[u] = i;
          ++evictions;
          if (c.last_use[i] == p.iteration) ++evicted_in_use;
        }
        // A line taken twice by this batch caches only the later id.
        if (installed_by[w] >= 0) out.line[installed_by[w]] = -1;
        installed_by[w] = u;
        install_line(c, i, unique[u], node_static, p.iteration, known, record);
        if (in_key_order) victims.taken(w);
        out.line[u] = i;
      }
    }
  }
  out.evictions = evictions;
  out.evicted_in_use = evicted_in_use;
  out.bypassed = bypassed;
}

}  // namespace

void assign(const CacheView& c, const int64_t* unique, int64_t n, const uint16_t* node_static,
            const PolicyParams& p, AssignOutput& out, int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  const bool known = p.first_iteration != nullptr;  // next use at assign
  const std::vector<int64_t> set = mark_hits(c, unique, n, p, known, out, num_threads);
  // Misses sorted by set (ids are already ascending, the sort is stable).
  install_misses(c, unique, node_static, p, known, misses_by_set(c, set, out.hit), out, num_threads);
}

void scan(int64_t lines, const int64_t* tags, uint64_t* records, uint8_t* flags, const int32_t* first_iteration,
          const int32_t* first_position, const uint8_t* first_rank, int64_t num_nodes, int64_t front,
          int64_t limit, int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
#pragma omp parallel for num_threads(num_threads) schedule(static) if (lines > 16384)
  for (int64_t i = 0; i < lines; ++i) {
    const int64_t tag = tags[i];
    if (tag == kInvalidTag) continue;
    records[i] = (tag >= 0 && tag < num_nodes)
                     ? first_record(first_iteration, first_position, first_rank, front, limit, tag)
                     : kNoReuseRecord;
    flags[i] &= static_cast<uint8_t>(~kFresh);
  }
}

}  // namespace lsm::cache
