// Launcher of the CUDA victim-buffer op (victim_buffer_cuda.cu). The queue
// counters and queue_iteration are device memory (the paper keeps the
// counters on the GPU); node, record and data are pinned host memory written
// through UVA. Returns early on empty input; reports launch errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cache/victim_buffer.h"

namespace lsm::cache {

// enqueue_victims on the GPU: one warp per victim; lane 0 claims a slot with
// atomicAdd on the queue's counter, the warp copies the row out of the cache
// (device) into the queue (pinned host). counters[0..2] += enqueued,
// dropped_no_reuse, dropped_full. The host may read the queues only after
// the stream has been synchronized.
cudaError_t enqueue_victims_cuda(const VictimQueues& q, const int64_t* evicted_tag, const uint64_t* evicted_record,
                                 const int64_t* evicted_line, int64_t n, const uint8_t* cache_data, int64_t iteration,
                                 int64_t scan_base, unsigned long long* counters, cudaStream_t stream);

}  // namespace lsm::cache
