// Launchers of the CUDA neighbor sampler (neighbor_sampler_cuda.cu): the two
// per-hop kernels; the torch glue (sampler/cuda_bindings.cpp) does the prefix
// sum and the relabelling. `indptr` and `indices` are device pointers: device
// memory, or pinned host memory mapped through UVA (cudaHostGetDevicePointer).
// `frontier` and the outputs are device memory. Each launcher returns early
// on empty input and reports launch errors as a cudaError_t.
//
// UNTESTED on a GPU: compile-checked with nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lsm::sampler {

// counts[i] = neighbors frontier[i] contributes at fanout k (-1: all).
cudaError_t count_neighbors_cuda(const int64_t* indptr, const int64_t* frontier, int64_t n, int64_t fanout,
                                 int64_t* counts, cudaStream_t stream);

// For frontier node i, writes its sampled neighbors' global ids to
// src[offsets[i] ..] and i to dst[offsets[i] ..], in the CPU sampler's order.
// `key` is hop_key(batch_key(seed, iteration), hop) (sampler_rng.h).
cudaError_t sample_neighbors_cuda(const int64_t* indptr, const int32_t* indices, const int64_t* frontier, int64_t n,
                                  int64_t fanout, uint64_t key, const int64_t* offsets, int64_t* src, int64_t* dst,
                                  cudaStream_t stream);
cudaError_t sample_neighbors_cuda(const int64_t* indptr, const int64_t* indices, const int64_t* frontier, int64_t n,
                                  int64_t fanout, uint64_t key, const int64_t* offsets, int64_t* src, int64_t* dst,
                                  cudaStream_t stream);

}  // namespace lsm::sampler
