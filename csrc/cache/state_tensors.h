// Cache state tensors (owned by lsm_gnn/cache/software_cache.py) as a raw
// CacheView, and the victim queues' tensors (lsm_gnn/cache/pvp.py) as a raw
// VictimQueues, checked once for both the CPU and the CUDA bindings.
#pragma once

#include <torch/types.h>

#include "cache/cache_view.h"
#include "cache/victim_buffer.h"

namespace lsm::cache {

inline void check_tensor(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t numel) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, " must have dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(numel < 0 || t.numel() == numel, name, " must have ", numel, " elements, got ", t.numel());
}

inline CacheView state_view(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
                            const torch::Tensor& static_score, const torch::Tensor& last_use,
                            const torch::Tensor& rr_pointer, int ways) {
  TORCH_CHECK_VALUE(ways >= 1, "ways must be >= 1");
  const int64_t lines = tags.numel();
  TORCH_CHECK_VALUE(lines % ways == 0 && lines > 0, "tags must hold num_sets * ways entries");
  check_tensor(tags, "tags", torch::kInt64, lines);
  check_tensor(records, "records", torch::kInt64, lines);
  check_tensor(flags, "flags", torch::kUInt8, lines);
  check_tensor(static_score, "static_score", torch::kInt16, lines);
  check_tensor(last_use, "last_use", torch::kInt64, lines);
  check_tensor(rr_pointer, "rr_pointer", torch::kInt32, lines / ways);
  for (const auto* t : {&records, &flags, &static_score, &last_use, &rr_pointer}) {
    TORCH_CHECK_VALUE(t->device() == tags.device(), "cache state tensors must share one device");
  }
  CacheView v;
  v.num_sets = lines / ways;
  v.ways = ways;
  v.tags = tags.data_ptr<int64_t>();
  v.records = reinterpret_cast<uint64_t*>(records.data_ptr<int64_t>());
  v.flags = flags.data_ptr<uint8_t>();
  v.static_score = reinterpret_cast<uint16_t*>(static_score.data_ptr<int16_t>());
  v.last_use = last_use.data_ptr<int64_t>();
  v.rr_pointer = rr_pointer.data_ptr<int32_t>();
  return v;
}

// The victim queues' tensors (owned by lsm_gnn/cache/pvp.py) as a raw view;
// data is [num_queues, capacity, ...] with rows of cache_data's row size.
// Devices are the caller's to check (counters on the cache's device, rows on the host).
inline VictimQueues victim_queues_view(const torch::Tensor& count, const torch::Tensor& queue_iteration,
                                       const torch::Tensor& node, const torch::Tensor& record,
                                       const torch::Tensor& data, const torch::Tensor& cache_data) {
  const int64_t num_queues = count.numel();
  TORCH_CHECK_VALUE(num_queues > 0 && data.dim() >= 2 && data.size(0) == num_queues,
                    "victim data must be [num_queues, capacity, ...] with num_queues = count.numel()");
  const int64_t capacity = data.size(1);
  check_tensor(count, "count", torch::kInt64, num_queues);
  check_tensor(queue_iteration, "queue_iteration", torch::kInt64, num_queues);
  check_tensor(node, "node", torch::kInt64, num_queues * capacity);
  check_tensor(record, "record", torch::kInt64, num_queues * capacity);
  TORCH_CHECK_VALUE(data.is_contiguous() && cache_data.is_contiguous(), "victim data and cache data must be contiguous");
  TORCH_CHECK_VALUE(data.scalar_type() == cache_data.scalar_type(), "victim data must have the cache's dtype ",
                    cache_data.scalar_type(), ", got ", data.scalar_type());
  TORCH_CHECK_VALUE(cache_data.dim() >= 1 && cache_data.size(0) > 0, "cache_data must have one row per line");
  const int64_t row_bytes = cache_data.numel() / cache_data.size(0) * cache_data.element_size();
  TORCH_CHECK_VALUE(data.numel() * data.element_size() == num_queues * capacity * row_bytes,
                    "victim rows must have the cache's row size (", row_bytes, " bytes)");
  VictimQueues q;
  q.num_queues = num_queues;
  q.capacity = capacity;
  q.row_bytes = row_bytes;
  q.count = count.data_ptr<int64_t>();
  q.queue_iteration = queue_iteration.data_ptr<int64_t>();
  q.node = node.data_ptr<int64_t>();
  q.record = reinterpret_cast<uint64_t*>(record.data_ptr<int64_t>());
  q.data = static_cast<uint8_t*>(data.data_ptr());
  return q;
}

}  // namespace lsm::cache
