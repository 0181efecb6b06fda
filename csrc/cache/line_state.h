// Cache line metadata shared by the CPU and CUDA implementations, and the
// victim ordering that defines each policy (lsm_gnn/cache/reference.py is the
// oracle these must match). Plain C++ with LSM_HD so nvcc and g++ both
// compile it; no torch, no STL containers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LSM_HD __host__ __device__ __forceinline__
#else
#define LSM_HD inline
#endif

namespace lsm::cache {

constexpr int64_t kInvalidTag = -1;

// The 8-byte PVP record of the paper: next reuse (16 bits, most significant,
// so an atomic min on the whole record keeps the nearest reuse), requesting
// rank (8 bits), index in that rank's mini-batch (40 bits).
constexpr int kReuseShift = 48;
constexpr int kRankShift = 40;
constexpr uint64_t kIndexMask = (uint64_t{1} << kRankShift) - 1;
constexpr uint64_t kNoReuse = 0xFFFF;              // reuse value meaning "not in the window"
constexpr uint64_t kNoReuseRecord = kNoReuse << kReuseShift;
static_assert(kReuseShift + 16 == 64, "reuse must occupy the top 16 bits of the record");
static_assert(kRankShift + 8 == kReuseShift, "rank sits between index and reuse");
static_assert(kIndexMask == 0xFFFFFFFFFFull, "the mini-batch index has 40 bits (5 bytes)");

LSM_HD uint64_t pack_record(uint64_t reuse, uint64_t rank, uint64_t index) {
  return (reuse << kReuseShift) | ((rank & 0xFF) << kRankShift) | (index & kIndexMask);
}
LSM_HD uint64_t record_reuse(uint64_t record) { return record >> kReuseShift; }

// Line flags.
constexpr uint8_t kFresh = 1;  // no dynamic information: inserted or its predicted reuse consumed since the last scan

// Policy and level codes; the order matches lsm_gnn/cache/policies.py (POLICIES, LEVELS).
enum Policy : int {
  kRoundRobin = 0, kLru = 1, kStatic = 2, kDynamic = 3, kHybrid = 4, kHybridPvp = 5, kHybridFar = 6, kHybridPvpRoom = 7,
  kFarthest = 8
};
enum Level : int { kLevelNone = 0, kLevelFar = 1, kLevelFresh = 2, kLevelNear = 3 };

// splitmix64 finalizer: spreads strided ids (owner = id % world_size) over all sets.
LSM_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
LSM_HD int64_t set_of(int64_t id, int64_t num_sets) {
  return static_cast<int64_t>(mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_sets));
}

// The PVP record of node `id` from a window's per-node first occurrences
// (see WindowIndex; iterations counted from its base, -1: none): reuse counts
// from 1 for the batch of iteration `front` (counted from the same base);
// occurrences beyond `limit` batches count as no reuse.
LSM_HD uint64_t first_record(const int32_t* first_iteration, const int32_t* first_position, const uint8_t* first_rank,
                             int64_t front, int64_t limit, int64_t id) {
  const int64_t it = first_iteration[id];
  if (it < 0) return kNoReuseRecord;
  const int64_t reuse = it - front + 1;
  if (reuse > limit) return kNoReuseRecord;
  return pack_record(static_cast<uint64_t>(reuse), first_rank[id], static_cast<uint64_t>(first_position[id]));
}

struct PolicyParams {
  int policy = kHybrid;
  int64_t iteration = 0;   // the iteration being served
  int64_t scan_base = 0;   // iteration of the last window scan
  int64_t threshold = 32;  // "near" reuse distance
  int level_rank[4] = {0, 1, 2, 3};  // eviction position of each Level (hybrid policies)
  // Victim-buffer room, one flag per queue (queue of iteration T = T % num_queues), read
  // only by hybrid_pvp_room: a far line is evicted first only when the queue of its next
  // reuse has room, else it keeps hybrid's place (right after "none"); null: no victim
  // buffer, so no room anywhere. A pointer on the device of the op that reads it.
  const uint8_t* queue_room = nullptr;
  int64_t num_queues = 0;
  // Next use at assign (first_iteration null: off, hit and installed lines become fresh): hit and
  // installed lines take their record from a window index's per-node first occurrences, read as
  // the scan reads them (`front` is reuse 1, `limit` batches), with the reuse counted from
  // scan_base; `bypass` then leaves a miss uncached when its own key is below its victim's.
  const int32_t* first_iteration = nullptr;
  const int32_t* first_position = nullptr;
  const uint8_t* first_rank = nullptr;
  int64_t num_nodes = 0;
  int64_t front = 0;
  int64_t limit = 0;
  bool bypass = false;
};

// The record of node `id` at assign time (PolicyParams' next use at assign): its next use after
// this iteration, within `limit` batches of it, with the reuse counted from the last scan as the
// scan's records are (since_scan < period, so the reuse stays below window + period < 2^16).
LSM_HD uint64_t assign_record(const PolicyParams& p, int64_t id) {
  if (id < 0 || id >= p.num_nodes) return kNoReuseRecord;
  const int64_t since_scan = p.iteration - p.scan_base;
  return first_record(p.first_iteration, p.first_position, p.first_rank, p.front - since_scan, p.limit + since_scan,
                      id);
}

// Dynamic level of a valid line (see reference.py).
LSM_HD int line_level(uint64_t record, uint8_t flags, const PolicyParams& p, int64_t* distance) {
  *distance = 0;
  if (flags & kFresh) return kLevelFresh;
  const uint64_t reuse = record_reuse(record);
  if (reuse == kNoReuse) return kLevelNone;
  const int64_t d = p.scan_base + static_cast<int64_t>(reuse) - p.iteration;
  *distance = d;
  if (d <= 0) return kLevelFresh;  // predicted reuse already past: an inexact window
  return d <= p.threshold ? kLevelNear : kLevelFar;
}

// Eviction key of a valid line not in use this iteration: the smallest key is
// evicted. Keys pack (primary, secondary) into one ordered 64-bit value; the
// way index breaks the remaining ties by the caller scanning ways in order.
LSM_HD uint64_t victim_key(uint64_t record, uint8_t flags, uint16_t static_score, int64_t last_use,
                           const PolicyParams& p) {
  switch (p.policy) {
    case kLru:
      return static_cast<uint64_t>(last_use + 1);  // last_use >= -1
    case kStatic:
      return static_score;
    case kDynamic: {
      int64_t d;
      const int level = line_level(record, flags, p, &d);
      if (level == kLevelNone) return 0;
      if (level == kLevelFresh) return 1;
      // Farther reuse is evicted first: invert the distance (1 <= d < 2^17).
      return (uint64_t{2} << 32) | static_cast<uint64_t>((uint64_t{1} << 32) - 1 - static_cast<uint64_t>(d));
    }
    default: {  // hybrid, hybrid_pvp, hybrid_far, hybrid_pvp_room, farthest
      int64_t d;
      const int level = line_level(record, flags, p, &d);
      // Farther reuse first within the far level (hybrid_far, farthest) and the near level (farthest);
      // d < 2^16 since window + period < 65535.
      const bool by_distance = (level == kLevelFar && (p.policy == kHybridFar || p.policy == kFarthest)) ||
                               (level == kLevelNear && p.policy == kFarthest);
      const uint64_t far_term = by_distance ? static_cast<uint64_t>(65535 - d) : 0;
      // Levels take even positions; an odd one holds the far lines of hybrid_pvp_room whose
      // victim queue is full (or absent), right after "none" as in hybrid.
      uint64_t position = 2 * static_cast<uint64_t>(p.level_rank[level]);
      if (p.policy == kHybridPvpRoom && level == kLevelFar &&
          !(p.queue_room != nullptr && p.queue_room[(p.iteration + d) % p.num_queues])) {
        position = 2 * static_cast<uint64_t>(p.level_rank[kLevelNone]) + 1;
      }
      return (position << 32) | (far_term << 16) | static_score;  // at most 35 bits
    }
  }
}

}  // namespace lsm::cache
