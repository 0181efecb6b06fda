// Cache state tensors (owned by lsm_gnn/cache/software_cache.py) as a raw
// CacheView, checked once for both the CPU and the CUDA bindings.
#pragma once

#include <torch/extension.h>

#include "cache/cache_view.h"

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

}  // namespace lsm::cache
