// CUDA implementation of the cache's metadata ops: the semantics of
// lsm_gnn/cache/reference.py, with the victim order of line_state.h.
//
// UNTESTED: compile-checked with `nvcc -c` (tests/test_cuda_sources.py); it
// has not yet run on a GPU. Needs only the CUDA runtime: raw device pointers
// and a stream; the torch glue lives in cuda_bindings.cpp.
//
// Layout: one warp per request for hits (lane = way, a ballot finds the
// tag); misses arrive sorted by set and one warp owns a whole set while
// installing them, so installs need no atomics. Only device-scope atomics
// are used (the counters); nothing is system-scope.
#include <cuda_runtime.h>

#include <cstdint>

#include "cache/cuda_cache.h"
#include "cache/line_state.h"

namespace lsm::cache {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__global__ void find_hits_kernel(CacheView c, const int64_t* __restrict__ unique, int64_t n, PolicyParams p,
                                 AssignOutput out) {
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (u >= n) return;  // whole warps exit together: u is uniform across the warp
  const int64_t id = unique[u];
  const int64_t base = set_of(id, c.num_sets) * c.ways;
  int found = -1;
  for (int w0 = 0; w0 < c.ways && found < 0; w0 += kWarp) {
    const int w = w0 + lane;
    const bool match = w < c.ways && c.tags[base + w] == id;
    const unsigned ballot = __ballot_sync(kFullMask, match);
    if (ballot) found = w0 + __ffs(ballot) - 1;
  }
  if (lane != 0) return;
  out.line[u] = found < 0 ? -1 : base + found;
  out.hit[u] = found >= 0;
  out.evicted_tag[u] = kInvalidTag;
  out.evicted_record[u] = kNoReuseRecord;
  out.evicted_line[u] = -1;
  if (found >= 0) {
    // Distinct ids map to distinct lines: plain stores, no other warp touches this line.
    c.last_use[base + found] = p.iteration;
    if (p.iteration > p.scan_base) c.flags[base + found] |= kFresh;
  }
}

// Eviction rank of way w for this miss: lower is evicted first. Packs the
// pass (invalid < not used this iteration < used this iteration), the
// policy key and the way, so one warp-wide minimum picks the victim.
__device__ __forceinline__ unsigned long long candidate(const CacheView& c, int64_t base, int w, int start,
                                                        const PolicyParams& p) {
  const int64_t i = base + w;
  if (c.tags[i] == kInvalidTag) return static_cast<unsigned long long>(w);  // pass 0, lowest way first
  const unsigned long long pass = c.last_use[i] == p.iteration ? 2 : 1;
  unsigned long long key;
  int order = w;
  if (p.policy == kRoundRobin) {
    key = 0;
    order = (w - start + c.ways) % c.ways;  // first way at or after the set's pointer
  } else {
    key = victim_key(c.records[i], c.flags[i], c.static_score[i], c.last_use[i], p);
  }
  // victim_key uses at most 35 bits; ways fit in 8.
  return (pass << 62) | (key << 8) | static_cast<unsigned long long>(order);
}

__global__ void install_misses_kernel(CacheView c, const int64_t* __restrict__ unique,
                                      const int64_t* __restrict__ miss_u, const int64_t* __restrict__ miss_set,
                                      const int64_t* __restrict__ segment_start, int64_t num_segments,
                                      const uint16_t* __restrict__ node_static, PolicyParams p, AssignOutput out,
                                      unsigned long long* __restrict__ counters) {
  const int64_t s = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (s >= num_segments) return;
  const int64_t set = miss_set[segment_start[s]];
  const int64_t base = set * c.ways;
  unsigned long long evictions = 0, evicted_in_use = 0;
  // installed_by[w / 32]: unique index this lane's way w received in this batch (ways <= 256).
  int64_t installed_by[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  for (int64_t k = segment_start[s]; k < segment_start[s + 1]; ++k) {
    const int64_t u = miss_u[k];
    const int start = c.rr_pointer[set];
    unsigned long long best = ~0ull;
    for (int w = lane; w < c.ways; w += kWarp) {
      const unsigned long long cand = candidate(c, base, w, start, p);
      best = cand < best ? cand : best;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const unsigned long long other = __shfl_xor_sync(kFullMask, best, offset);
      best = other < best ? other : best;
    }
    const bool was_invalid = (best >> 62) == 0;  // pass 0 holds only invalid ways
    int w = static_cast<int>(best & 0xFF);
    if (p.policy == kRoundRobin && !was_invalid) w = (start + w) % c.ways;  // order -> way
    const int64_t i = base + w;
    if (lane == w % kWarp) {
      if (c.tags[i] != kInvalidTag) {
        out.evicted_tag[u] = c.tags[i];
        out.evicted_record[u] = c.records[i];
        out.evicted_line[u] = i;
        ++evictions;
        if (c.last_use[i] == p.iteration) ++evicted_in_use;
        if (p.policy == kRoundRobin) c.rr_pointer[set] = (w + 1) % c.ways;
      }
      // A line taken twice by this batch caches only the later id.
      if (installed_by[w / kWarp] >= 0) out.line[installed_by[w / kWarp]] = -1;
      installed_by[w / kWarp] = u;
      install_line(c, i, unique[u], node_static, p.iteration);
      out.line[u] = i;
    }
    __syncwarp();  // the next miss must see this install
  }
  if (evictions) atomicAdd(&counters[0], evictions);  // device scope: only this GPU reads them
  if (evicted_in_use) atomicAdd(&counters[1], evicted_in_use);
}

__global__ void scan_kernel(CacheView c, const int64_t* first_iteration, const int64_t* first_position,
                            const uint8_t* first_rank, int64_t front, int64_t limit, int64_t num_nodes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c.num_sets * c.ways) return;
  const int64_t tag = c.tags[i];
  if (tag == kInvalidTag) return;
  c.records[i] = tag < num_nodes ? first_record(first_iteration, first_position, first_rank, front, limit, tag)
                                 : kNoReuseRecord;
  c.flags[i] &= static_cast<uint8_t>(~kFresh);
}

__global__ void sets_of_kernel(const int64_t* __restrict__ ids, int64_t n, int64_t num_sets, int64_t* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) out[k] = set_of(ids[k], num_sets);
}

int blocks_for(int64_t threads, int per_block) { return static_cast<int>((threads + per_block - 1) / per_block); }

}  // namespace

cudaError_t find_hits_cuda(const CacheView& c, const int64_t* unique, int64_t n, const PolicyParams& p,
                           AssignOutput out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  find_hits_kernel<<<blocks_for(n * kWarp, kThreads), kThreads, 0, stream>>>(c, unique, n, p, out);
  return cudaGetLastError();
}

cudaError_t install_misses_cuda(const CacheView& c, const int64_t* unique, const int64_t* miss_u,
                                const int64_t* miss_set, const int64_t* segment_start, int64_t num_segments,
                                const uint16_t* node_static, const PolicyParams& p, AssignOutput out,
                                unsigned long long* counters, cudaStream_t stream) {
  if (num_segments == 0) return cudaSuccess;
  if (c.ways > 256) return cudaErrorInvalidValue;  // the way index is packed into 8 bits
  constexpr int kThreads = 128;
  install_misses_kernel<<<blocks_for(num_segments * kWarp, kThreads), kThreads, 0, stream>>>(
      c, unique, miss_u, miss_set, segment_start, num_segments, node_static, p, out, counters);
  return cudaGetLastError();
}

cudaError_t sets_of_cuda(const int64_t* ids, int64_t n, int64_t num_sets, int64_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  sets_of_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(ids, n, num_sets, out);
  return cudaGetLastError();
}

cudaError_t scan_cuda(const CacheView& c, const int64_t* first_iteration, const int64_t* first_position,
                      const uint8_t* first_rank, int64_t front, int64_t limit, int64_t num_nodes,
                      cudaStream_t stream) {
  const int64_t lines = c.num_sets * c.ways;
  if (lines == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  scan_kernel<<<blocks_for(lines, kThreads), kThreads, 0, stream>>>(c, first_iteration, first_position, first_rank,
                                                                   front, limit, num_nodes);
  return cudaGetLastError();
}

}  // namespace lsm::cache
