// CUDA implementation of the victim-buffer enqueue (see victim_buffer.h).
//
// UNTESTED: compile-checked with `nvcc -c` (tests/test_cuda_sources.py); it
// has not yet run on a GPU. Needs only the CUDA runtime; the torch glue lives
// in cuda_bindings.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "cache/victim_buffer.h"
#include "cache/victim_buffer_cuda.h"

namespace lsm::cache {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__global__ void enqueue_victims_kernel(VictimQueues q, const int64_t* __restrict__ evicted_tag,
                                       const uint64_t* __restrict__ evicted_record,
                                       const int64_t* __restrict__ evicted_line, int64_t n,
                                       const uint8_t* __restrict__ cache_data, int64_t iteration, int64_t scan_base,
                                       unsigned long long* __restrict__ counters) {
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (u >= n) return;  // u is uniform across the warp
  const int64_t tag = evicted_tag[u];
  if (tag == kInvalidTag) return;
  long long slot = -1;
  if (lane == 0) {
    const int64_t queue = victim_queue(q, evicted_record[u], iteration, scan_base);
    if (queue < 0) {
      atomicAdd(&counters[1], 1ull);
    } else {
      // Device-scope atomicAdd: distinct victims get distinct positions; the
      // counter may pass the capacity, and those victims are dropped (the
      // host clamps it when reading). No ordering with other memory is
      // needed: each slot is written only by the warp that claimed it.
      const unsigned long long pos =
          atomicAdd(reinterpret_cast<unsigned long long*>(&q.count[queue]), 1ull);
      if (pos >= static_cast<unsigned long long>(q.capacity)) {
        atomicAdd(&counters[2], 1ull);
      } else {
        slot = queue * q.capacity + static_cast<long long>(pos);
        q.node[slot] = tag;
        q.record[slot] = evicted_record[u];
        atomicAdd(&counters[0], 1ull);
      }
    }
  }
  slot = __shfl_sync(kFullMask, slot, 0);
  if (slot < 0) return;
  // The warp copies the row into pinned host memory (UVA), 4 bytes per lane
  // when rows are 4-byte multiples (feature rows of float32/16 pairs), else bytes.
  const uint8_t* src = cache_data + evicted_line[u] * q.row_bytes;
  uint8_t* dst = q.data + slot * q.row_bytes;
  if (q.row_bytes % 4 == 0) {
    const auto* s4 = reinterpret_cast<const uint32_t*>(src);
    auto* d4 = reinterpret_cast<uint32_t*>(dst);
    for (int64_t k = lane; k < q.row_bytes / 4; k += kWarp) d4[k] = s4[k];
  } else {
    for (int64_t k = lane; k < q.row_bytes; k += kWarp) dst[k] = src[k];
  }
}

int blocks_for(int64_t threads, int per_block) { return static_cast<int>((threads + per_block - 1) / per_block); }

}  // namespace

cudaError_t enqueue_victims_cuda(const VictimQueues& q, const int64_t* evicted_tag, const uint64_t* evicted_record,
                                 const int64_t* evicted_line, int64_t n, const uint8_t* cache_data, int64_t iteration,
                                 int64_t scan_base, unsigned long long* counters, cudaStream_t stream) {
  if (n == 0 || q.num_queues == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  enqueue_victims_kernel<<<blocks_for(n * kWarp, kThreads), kThreads, 0, stream>>>(
      q, evicted_tag, evicted_record, evicted_line, n, cache_data, iteration, scan_base, counters);
  return cudaGetLastError();
}

}  // namespace lsm::cache
