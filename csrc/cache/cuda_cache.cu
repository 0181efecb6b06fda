// CUDA window scan: every valid line's PVP record from the window index, the
// semantics of lsm_gnn/cache/reference.py. The last hand-written CUDA kernel:
// assign, victim enqueue and the sampler are Triton kernels (lsm_gnn/kernels)
// checked on CPU under Triton's interpreter; this one goes once the window
// index has a device-side form for a Triton twin to read.
//
// UNTESTED: compile-checked with `nvcc -c` (tests/test_cuda_sources.py); it
// has not yet run on a GPU. Needs only the CUDA runtime.
#include <cuda_runtime.h>

#include <cstdint>

#include "cache/cuda_cache.h"
#include "cache/line_state.h"

namespace lsm::cache {

namespace {

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

int blocks_for(int64_t threads, int per_block) { return static_cast<int>((threads + per_block - 1) / per_block); }

}  // namespace

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
