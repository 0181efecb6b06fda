// CUDA neighbor sampler: the per-hop kernels of the CPU sampler
// (neighbor_sampler.cpp), drawing the same positions from the same streams
// (sampler_rng.h), so for equal (seed, iteration, seeds, fanouts) the GPU and
// CPU produce identical hops.
//
// UNTESTED: compile-checked with `nvcc -c` (tests/test_cuda_sources.py); it
// has not yet run on a GPU (tests/test_sampler_cuda.py compares it with the
// CPU sampler where one is available). Needs only the CUDA runtime: raw
// pointers and a stream; the torch glue lives in cuda_bindings.cpp.
//
// The CSR may be pinned host memory read through UVA, so each node's indptr
// pair is read once and neighbor reads are coalesced across a warp.
#include <cuda_runtime.h>

#include <cstdint>

#include "sampler/neighbor_sampler_cuda.h"
#include "sampler/sampler_rng.h"

namespace lsm::sampler {

namespace {

constexpr int kWarp = 32;

__global__ void count_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ frontier, int64_t n,
                             int64_t k, int64_t* __restrict__ counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t v = frontier[i];
  counts[i] = sample_count(indptr[v + 1] - indptr[v], k);
}

// One warp per frontier node.
template <typename Index>
__global__ void sample_kernel(const int64_t* __restrict__ indptr, const Index* __restrict__ indices,
                              const int64_t* __restrict__ frontier, int64_t n, int64_t k, uint64_t key,
                              const int64_t* __restrict__ offsets, int64_t* __restrict__ src,
                              int64_t* __restrict__ dst) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= n) return;  // whole warps exit together: i is uniform across the warp
  const int64_t v = frontier[i];
  const int64_t begin = indptr[v];
  const int64_t degree = indptr[v + 1] - begin;
  const int64_t got = sample_count(degree, k);
  int64_t* out = src + offsets[i];
  const bool drawn = got < degree;  // uniform across the warp
  if (drawn) {
    // Floyd's algorithm is sequential (each draw checks the earlier ones):
    // one lane draws the positions into out, then the warp maps them to ids.
    if (lane == 0) {
      Stream rng = Stream::for_node(key, v);
      floyd_sample(rng, degree, k, out);
    }
    __syncwarp();
  }
  for (int64_t j = lane; j < got; j += kWarp) {
    const int64_t position = drawn ? out[j] : j;
    out[j] = static_cast<int64_t>(indices[begin + position]);
    dst[offsets[i] + j] = i;
  }
}

int blocks_for(int64_t threads, int per_block) { return static_cast<int>((threads + per_block - 1) / per_block); }

template <typename Index>
cudaError_t launch_sample(const int64_t* indptr, const Index* indices, const int64_t* frontier, int64_t n,
                          int64_t fanout, uint64_t key, const int64_t* offsets, int64_t* src, int64_t* dst,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  sample_kernel<Index><<<blocks_for(n * kWarp, kThreads), kThreads, 0, stream>>>(indptr, indices, frontier, n, fanout,
                                                                                 key, offsets, src, dst);
  return cudaGetLastError();
}

}  // namespace

cudaError_t count_neighbors_cuda(const int64_t* indptr, const int64_t* frontier, int64_t n, int64_t fanout,
                                 int64_t* counts, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  count_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(indptr, frontier, n, fanout, counts);
  return cudaGetLastError();
}

cudaError_t sample_neighbors_cuda(const int64_t* indptr, const int32_t* indices, const int64_t* frontier, int64_t n,
                                  int64_t fanout, uint64_t key, const int64_t* offsets, int64_t* src, int64_t* dst,
                                  cudaStream_t stream) {
  return launch_sample(indptr, indices, frontier, n, fanout, key, offsets, src, dst, stream);
}

cudaError_t sample_neighbors_cuda(const int64_t* indptr, const int64_t* indices, const int64_t* frontier, int64_t n,
                                  int64_t fanout, uint64_t key, const int64_t* offsets, int64_t* src, int64_t* dst,
                                  cudaStream_t stream) {
  return launch_sample(indptr, indices, frontier, n, fanout, key, offsets, src, dst, stream);
}

}  // namespace lsm::sampler
