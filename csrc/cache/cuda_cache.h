// Launcher of the CUDA window scan (cuda_cache.cu). Pointers are device
// pointers except the window's first-occurrence arrays, which may be mapped
// host memory (read through UVA). Returns launch errors as a cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cache/cache_view.h"
#include "cache/line_state.h"

namespace lsm::cache {

// The window scan: every valid line's PVP record from the window index.
cudaError_t scan_cuda(const CacheView& c, const int64_t* first_iteration, const int64_t* first_position,
                      const uint8_t* first_rank, int64_t front, int64_t limit, int64_t num_nodes,
                      cudaStream_t stream);

}  // namespace lsm::cache
