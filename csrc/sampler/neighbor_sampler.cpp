#include "sampler/neighbor_sampler.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "graph/csr_check.h"
#include "sampler/sampler_rng.h"  // shared with the CUDA sampler, which must draw the same positions

#ifndef LSM_DRAW_AHEAD_EDGES
#define LSM_DRAW_AHEAD_EDGES 32
#endif
// Edges of a hop from which several threads number its new nodes (below, the passes cost more than they save)
#ifndef LSM_PARALLEL_NUMBERING_EDGES
#define LSM_PARALLEL_NUMBERING_EDGES 16384
#endif

namespace lsm::sampler {

namespace {

constexpr size_t kParallelNumbering = LSM_PARALLEL_NUMBERING_EDGES;

// Global id -> index in the batch's node list. The numbering makes one lookup per sampled edge, serially (its
// order defines the local ids), where std::unordered_map's allocation per insert and pointer chasing cost a
// large part of the op's time: here each id and its index share a slot of one flat array (one cache line
// per probe), probed linearly from a multiplicative hash. Ids are >= 0 (checked before they are numbered),
// so -1 marks an empty slot.
class LocalIds {
 public:
  explicit LocalIds(size_t expected) { resize(capacity_for(expected)); }

  // (the id's index, whether it was new): a new id gets ``next``.
  std::pair<int64_t, bool> emplace(int64_t id, int64_t next) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    for (size_t i = slot(id);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id == kEmpty) {
        s = Slot{id, next};
        ++size_;
        return {next, true};
      }
      if (s.id == id) return {s.index, false};
    }
  }

  // Starts loading the slot ``id`` probes first: the serial numbering waits on one cache miss per edge
  // otherwise.
  void prefetch(int64_t id) const { __builtin_prefetch(&slots_[slot(id)]); }

  size_t size() const { return size_; }

  // Numbers ``ids`` (a hop's sampled neighbours, global ids) in place with ``num_threads`` threads, exactly as
  // emplace() in edge order would: an id not numbered yet gets the next index at its first occurrence, and is
  // appended to ``nodes``. Each thread takes a contiguous chunk of the edges, in one parallel region: it finds or
  // claims each id's slot (compare-and-swap on the id) and keeps there the earliest position the id occurs at
  // (an atomic min on the slot's index, kept below zero until it is numbered); then counts its chunk's first
  // occurrences; numbers them from the chunks' prefix sums; and gives every edge its id's index.
  void number_in_parallel(std::vector<int64_t>& ids, std::vector<int64_t>& nodes, int num_threads) {
    const int64_t n = static_cast<int64_t>(ids.size());
    if ((size_ + ids.size()) * 2 > slots_.size()) rehash(capacity_for(size_ + ids.size()));  // no growth below
    constexpr int64_t kAhead = 16;
    std::vector<int64_t> starts(num_threads + 1, 0);
    const int64_t base = static_cast<int64_t>(nodes.size());
#pragma omp parallel num_threads(num_threads)
    {
      const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
      const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
      for (int64_t e = begin; e < end; ++e) {
        if (e + kAhead < end) prefetch(ids[e + kAhead]);
        const int64_t id = ids[e];
        size_t i = slot(id);
        for (;; i = (i + 1) & mask_) {
          int64_t seen = __atomic_load_n(&slots_[i].id, __ATOMIC_ACQUIRE);
          if (seen == kEmpty &&
              __atomic_compare_exchange_n(&slots_[i].id, &seen, id, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            break;  // claimed for ``id``
          }
          if (seen == id) break;  // ``seen`` holds the winner when the exchange failed
        }
        int64_t* index = &slots_[i].index;
        int64_t held = __atomic_load_n(index, __ATOMIC_RELAXED);
        // numbered before (>= 0, not unnumbered): kept; else the earliest position
        while ((held == kUnnumbered || held < 0) && kFirstAt + e < held &&
               !__atomic_compare_exchange_n(index, &held, kFirstAt + e, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
        ids[e] = static_cast<int64_t>(i);  // the slot, until the last pass
      }
#pragma omp barrier
      int64_t count = 0;
      for (int64_t e = begin; e < end; ++e) count += slots_[ids[e]].index == kFirstAt + e;
      starts[t + 1] = count;
#pragma omp barrier
#pragma omp single
      {
        for (int64_t c = 0; c < threads; ++c) starts[c + 1] += starts[c];
        nodes.resize(base + starts[threads]);
        size_ += static_cast<size_t>(starts[threads]);
      }  // (a barrier)
      int64_t next = base + starts[t];
      for (int64_t e = begin; e < end; ++e) {
        Slot& s = slots_[ids[e]];
        if (__atomic_load_n(&s.index, __ATOMIC_RELAXED) == kFirstAt + e) {  // others' first ones may change
          __atomic_store_n(&s.index, next, __ATOMIC_RELAXED);
          nodes[next++] = s.id;
        }
      }
#pragma omp barrier
      for (int64_t e = begin; e < end; ++e) ids[e] = slots_[ids[e]].index;
    }
  }

 private:
  static constexpr int64_t kEmpty = -1;
  // An empty slot's index; while number_in_parallel() runs, a claimed slot's index is kFirstAt + the position of
  // its id's first occurrence (negative) until it is numbered
  static constexpr int64_t kUnnumbered = INT64_MAX, kFirstAt = INT64_MIN;
  struct Slot {
    int64_t id, index;
  };

  static size_t capacity_for(size_t expected) {
    size_t capacity = 16;
    while (capacity < expected * 2) capacity *= 2;
    return capacity;
  }

  size_t slot(int64_t id) const {
    return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void resize(size_t capacity) {
    slots_.assign(capacity, Slot{kEmpty, kUnnumbered});
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
  }

  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    resize(capacity);
    size_ = 0;
    for (const Slot& s : old) {
      if (s.id != kEmpty) emplace(s.id, s.index);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// Prefetch distance, in nodes or edges, of the loops that wait on one cache miss per element otherwise.
constexpr int64_t kAhead = 16;

// The seeds, checked, as the first entries of the batch's node list.
LocalIds number_seeds(const int64_t* seeds, int64_t num_seeds, int64_t num_nodes) {
  LocalIds local(static_cast<size_t>(num_seeds) * 8);
  for (int64_t i = 0; i < num_seeds; ++i) {
    if (seeds[i] < 0 || seeds[i] >= num_nodes) {
      throw std::out_of_range(cat("seed node ", seeds[i], " at position ", i, " is outside [0, ", num_nodes, ")"));
    }
    if (!local.emplace(seeds[i], i).second) {
      throw std::invalid_argument(cat("seed node ", seeds[i], " appears twice in the batch; seeds must be distinct"));
    }
  }
  return local;
}

// A hop's frontier rows as read once from indptr: each row's start and length, and where its draws go in the
// hop's edge arrays (offset[i]..offset[i + 1]).
struct Rows {
  std::vector<int64_t> offset, start, length;
};

// Row lengths in parallel: on a memory-mapped CSR that is not in memory, each read of indptr can be a page fault
// that waits on the disk, and parallel faults keep the disk busy (docs/benchmarks/scale.md, "Out of core:
// topology and scale"). A bad row cannot throw inside the loop: remember the first, throw after. Each row's
// start and length are kept for the draws, so indptr is read at random once per node; the rows a few nodes
// ahead are prefetched.
Rows read_rows(const int64_t* indptr, int64_t num_edges, const std::vector<int64_t>& frontier, int64_t k,
               int num_threads) {
  const int64_t n = static_cast<int64_t>(frontier.size());
  Rows rows{std::vector<int64_t>(n + 1, 0), std::vector<int64_t>(n), std::vector<int64_t>(n)};
  int64_t first_bad_row = n;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 256) if (n > 2048)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(indptr + frontier[i + kAhead]);
    if (!graph::row_ok(indptr, frontier[i], num_edges)) {  // before any size is derived from it
#pragma omp critical(lsm_sampler_bad_indptr)
      first_bad_row = std::min(first_bad_row, i);
      continue;
    }
    rows.start[i] = indptr[frontier[i]];
    rows.length[i] = indptr[frontier[i] + 1] - rows.start[i];
    rows.offset[i + 1] = sample_count(rows.length[i], k);
  }
  if (first_bad_row < n) graph::check_row(indptr, frontier[first_bad_row], num_edges);
  for (int64_t i = 0; i < n; ++i) rows.offset[i + 1] += rows.offset[i];
  return rows;
}

// Draws the hop's neighbours of every frontier node (hop.src: their global ids, hop.dst: the node's index).
// Each node's positions are drawn some nodes before its neighbours are read, and the line of every drawn
// neighbour is prefetched then: the random loads of indices were most of the draws' time, and a row's first
// line (all a prefetch of the row start covers) holds few of a long row's draws.
template <typename Index>
void draw_neighbors(const int64_t* indptr, const Index* indices, int64_t num_ids, const std::vector<int64_t>& frontier,
                    const Rows& rows, int64_t k, uint64_t key, int num_threads, Hop& hop) {
  const int64_t n = static_cast<int64_t>(frontier.size());
  // An exception cannot leave the parallel loop: remember the first row with a bad neighbor id.
  int64_t first_bad = n;
  auto draw_positions = [&](int64_t i) {
    int64_t* out = hop.src.data() + rows.offset[i];
    const int64_t degree = rows.length[i];
    const int64_t got = sample_count(degree, k);
    if (got == degree) {
      for (int64_t j = 0; j < degree; ++j) out[j] = j;
    } else {
      Stream rng = Stream::for_node(key, frontier[i]);
      floyd_sample(rng, degree, k, out);
    }
    for (int64_t j = 0; j < got; ++j) __builtin_prefetch(indices + rows.start[i] + out[j]);
  };
  constexpr int64_t kBlock = 256;
  const int64_t draw_ahead = LSM_DRAW_AHEAD_EDGES / std::max<int64_t>(1, k < 0 ? 8 : k);  // ~ lines in flight
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (n > 2048)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    for (int64_t i = begin; i < std::min(end, begin + draw_ahead); ++i) draw_positions(i);
    for (int64_t i = begin; i < end; ++i) {
      if (i + draw_ahead < end) draw_positions(i + draw_ahead);
      int64_t* out = hop.src.data() + rows.offset[i];
      const int64_t got = rows.offset[i + 1] - rows.offset[i];
      for (int64_t j = 0; j < got; ++j) {
        const Index u = indices[rows.start[i] + out[j]];  // position -> global neighbor id
        if (!graph::neighbor_ok(u, num_ids)) {
#pragma omp critical(lsm_sampler_bad_row)
          first_bad = std::min(first_bad, i);
        }
        out[j] = static_cast<int64_t>(u);
        hop.dst[rows.offset[i] + j] = i;
      }
    }
  }
  if (first_bad < n) graph::check_neighbors(indptr, indices, frontier[first_bad], num_ids);
}

// Numbers newly reached nodes in edge order (the order defines local ids), appending them to ``nodes`` and
// turning hop.src into local ids: serially, with the slots of the next edges loading meanwhile, or on several
// threads for a large hop (the same numbers).
void number_new_nodes(LocalIds& local, std::vector<int64_t>& src, std::vector<int64_t>& nodes, int num_threads) {
  const size_t edges = src.size();
  if (num_threads > 1 && edges >= kParallelNumbering) {
    local.number_in_parallel(src, nodes, num_threads);
    return;
  }
  for (size_t e = 0; e < edges; ++e) {
    if (e + kAhead < edges) local.prefetch(src[e + kAhead]);
    int64_t& s = src[e];
    auto [index, inserted] = local.emplace(s, static_cast<int64_t>(nodes.size()));
    if (inserted) nodes.push_back(s);
    s = index;
  }
}

}  // namespace

template <typename Index>
std::vector<Hop> sample_hops(const int64_t* indptr, const Index* indices, int64_t num_nodes, int64_t num_edges,
                             const int64_t* seeds, int64_t num_seeds, const std::vector<int64_t>& fanouts,
                             uint64_t seed, int64_t iteration, int num_threads, int64_t num_ids) {
  if (num_threads <= 0) num_threads = omp_get_max_threads();
  if (num_ids != num_nodes && fanouts.size() > 1) {
    // Later hops sample from the neighbors reached, which must then be rows of this CSR.
    throw std::invalid_argument(cat("a CSR whose neighbor ids lie in [0, ", num_ids, ") but whose rows are [0, ",
                                    num_nodes, ") is sampled one hop at a time, got ", fanouts.size(), " fanouts"));
  }
  std::vector<int64_t> frontier(seeds, seeds + num_seeds);  // the batch's node list so far
  LocalIds local = number_seeds(seeds, num_seeds, num_nodes);  // global id -> index in frontier
  const uint64_t base = batch_key(seed, iteration);
  std::vector<Hop> hops;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const Rows rows = read_rows(indptr, num_edges, frontier, fanouts[h], num_threads);
    Hop hop;
    hop.num_dst = static_cast<int64_t>(frontier.size());
    hop.src.resize(rows.offset.back());
    hop.dst.resize(rows.offset.back());
    draw_neighbors(indptr, indices, num_ids, frontier, rows, fanouts[h], hop_key(base, h), num_threads, hop);
    number_new_nodes(local, hop.src, frontier, num_threads);
    hop.nodes = frontier;
    hops.push_back(std::move(hop));
  }
  return hops;
}

template std::vector<Hop> sample_hops<int32_t>(const int64_t*, const int32_t*, int64_t, int64_t, const int64_t*,
                                               int64_t, const std::vector<int64_t>&, uint64_t, int64_t, int, int64_t);
template std::vector<Hop> sample_hops<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t, const int64_t*,
                                               int64_t, const std::vector<int64_t>&, uint64_t, int64_t, int, int64_t);

}  // namespace lsm::sampler
