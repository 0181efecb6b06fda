// Launchers of the CUDA cache ops (cuda_cache.cu). Pointers are device
// pointers except the window's first-occurrence arrays, which may be mapped
// host memory (read through UVA). Each launcher returns early on empty input
// and reports launch errors as a cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cache/cache_view.h"
#include "cache/line_state.h"

namespace lsm::cache {

// Phase 1 of assign: hits (one warp per distinct id). Fills line/hit and
// resets evicted_tag/evicted_record/evicted_line for every id.
cudaError_t find_hits_cuda(const CacheView& c, const int64_t* unique, int64_t n, const PolicyParams& p,
                           AssignOutput out, cudaStream_t stream);

// Phase 2: installs misses. miss_u[k] (index into unique) and miss_set[k]
// are sorted by set then id; segment_start[s]..segment_start[s+1] are the
// misses of one set. counters[0] += evictions, counters[1] += evicted_in_use.
cudaError_t install_misses_cuda(const CacheView& c, const int64_t* unique, const int64_t* miss_u,
                                const int64_t* miss_set, const int64_t* segment_start, int64_t num_segments,
                                const uint16_t* node_static, const PolicyParams& p, AssignOutput out,
                                unsigned long long* counters, cudaStream_t stream);

// out[k] = set of ids[k] (the same hash as every other implementation).
cudaError_t sets_of_cuda(const int64_t* ids, int64_t n, int64_t num_sets, int64_t* out, cudaStream_t stream);

// The window scan: every valid line's PVP record from the window index.
cudaError_t scan_cuda(const CacheView& c, const int64_t* first_iteration, const int64_t* first_position,
                      const uint8_t* first_rank, int64_t front, int64_t limit, int64_t num_nodes,
                      cudaStream_t stream);

}  // namespace lsm::cache
