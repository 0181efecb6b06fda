// Torch glue of the CUDA cache ops; compiled only into CUDA builds.
// UNTESTED on a GPU (see cuda_cache.cu); syntax-checked against torch's CUDA
// headers by tests/test_cuda_sources.py where nvcc is installed.
#ifdef LSM_GNN_WITH_CUDA

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "cache/cuda_cache.h"
#include "cache/state_tensors.h"
#include "cache/victim_buffer_cuda.h"
#include "cache/window_index.h"

namespace py = pybind11;

namespace {

using lsm::cache::AssignOutput;
using lsm::cache::CacheView;

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

CacheView device_view(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
                      const torch::Tensor& static_score, const torch::Tensor& last_use,
                      const torch::Tensor& rr_pointer, int ways) {
  TORCH_CHECK_VALUE(tags.is_cuda(), "the CUDA cache ops need CUDA state tensors");
  return lsm::cache::state_view(tags, records, flags, static_score, last_use, rr_pointer, ways);
}

py::tuple assign_cuda(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
                      const torch::Tensor& static_score, const torch::Tensor& last_use,
                      const torch::Tensor& rr_pointer, int ways, const torch::Tensor& unique,
                      const std::optional<torch::Tensor>& node_static, int policy, int64_t iteration,
                      int64_t scan_base, int64_t threshold, std::vector<int> level_rank,
                      const std::optional<torch::Tensor>& queue_room) {
  const c10::cuda::CUDAGuard guard(tags.device());
  CacheView v = device_view(tags, records, flags, static_score, last_use, rr_pointer, ways);
  TORCH_CHECK_VALUE(unique.is_cuda() && unique.device() == tags.device() && unique.scalar_type() == torch::kInt64,
                    "unique must be an int64 tensor on the cache's device");
  auto stream = c10::cuda::getCurrentCUDAStream();
  lsm::cache::PolicyParams p;
  p.policy = policy;
  p.iteration = iteration;
  p.scan_base = scan_base;
  p.threshold = threshold;
  for (int k = 0; k < 4; ++k) p.level_rank[k] = level_rank.at(k);
  if (queue_room.has_value()) {
    TORCH_CHECK_VALUE(queue_room->is_cuda() && queue_room->device() == tags.device() &&
                          queue_room->scalar_type() == torch::kUInt8 && queue_room->is_contiguous() &&
                          queue_room->numel() > 0,
                      "queue_room must be a non-empty contiguous uint8 tensor on the cache's device");
    p.queue_room = queue_room->data_ptr<uint8_t>();
    p.num_queues = queue_room->numel();
  }
  const int64_t n = unique.numel();
  auto opts = unique.options();
  auto line = torch::empty({n}, opts);
  auto hit = torch::empty({n}, opts.dtype(torch::kBool));
  auto evicted_tag = torch::empty({n}, opts);
  auto evicted_record = torch::empty({n}, opts);
  auto evicted_line = torch::empty({n}, opts);
  AssignOutput out;
  out.line = line.data_ptr<int64_t>();
  out.hit = reinterpret_cast<uint8_t*>(hit.data_ptr<bool>());
  out.evicted_tag = evicted_tag.data_ptr<int64_t>();
  out.evicted_record = reinterpret_cast<uint64_t*>(evicted_record.data_ptr<int64_t>());
  out.evicted_line = evicted_line.data_ptr<int64_t>();
  check_cuda(lsm::cache::find_hits_cuda(v, unique.data_ptr<int64_t>(), n, p, out, stream), "find_hits");

  // Misses sorted by (set, id): unique is ascending, so a stable sort by set keeps ids ascending.
  auto miss_u = torch::nonzero(hit.logical_not()).reshape({-1});
  auto miss_ids = unique.index_select(0, miss_u);
  auto sets = torch::empty_like(miss_ids);
  check_cuda(lsm::cache::sets_of_cuda(miss_ids.data_ptr<int64_t>(), miss_ids.numel(), v.num_sets,
                                      sets.data_ptr<int64_t>(), stream),
             "sets_of");
  auto order = std::get<1>(torch::sort(sets, /*stable=*/true));
  miss_u = miss_u.index_select(0, order).contiguous();
  auto miss_set = sets.index_select(0, order).contiguous();
  auto boundaries = torch::ones({miss_set.numel()}, opts.dtype(torch::kBool));
  if (miss_set.numel() > 1) boundaries.slice(0, 1).copy_(miss_set.slice(0, 1) != miss_set.slice(0, 0, -1));
  auto segment_start = torch::cat({torch::nonzero(boundaries).reshape({-1}),
                                   torch::full({1}, miss_set.numel(), opts)}).contiguous();
  auto counters = torch::zeros({2}, opts);
  const uint16_t* node_static_ptr = nullptr;
  if (node_static.has_value()) {
    TORCH_CHECK_VALUE(node_static->is_cuda(), "node_static must be on the cache's device");
    node_static_ptr = reinterpret_cast<const uint16_t*>(node_static->data_ptr<int16_t>());
  }
  check_cuda(lsm::cache::install_misses_cuda(
                 v, unique.data_ptr<int64_t>(), miss_u.data_ptr<int64_t>(), miss_set.data_ptr<int64_t>(),
                 segment_start.data_ptr<int64_t>(), segment_start.numel() - 1, node_static_ptr, p, out,
                 reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>()), stream),
             "install_misses");
  auto host_counters = counters.cpu();
  return py::make_tuple(line, hit, evicted_tag, evicted_record, evicted_line, host_counters[0].item<int64_t>(),
                        host_counters[1].item<int64_t>());
}

// PVP enqueue on CUDA: counters and queue_iteration on the cache's device,
// node/record/data in pinned host memory (written by the kernel through UVA).
py::tuple victim_enqueue_cuda(const torch::Tensor& count, const torch::Tensor& queue_iteration,
                              const torch::Tensor& node, const torch::Tensor& record, const torch::Tensor& data,
                              const torch::Tensor& evicted_tag, const torch::Tensor& evicted_record,
                              const torch::Tensor& evicted_line, const torch::Tensor& cache_data, int64_t iteration,
                              int64_t scan_base) {
  const c10::cuda::CUDAGuard guard(cache_data.device());
  TORCH_CHECK_VALUE(cache_data.is_cuda(), "victim_enqueue_cuda needs the cache's rows on a CUDA device");
  for (const auto* t : {&count, &queue_iteration, &evicted_tag, &evicted_record, &evicted_line}) {
    TORCH_CHECK_VALUE(t->device() == cache_data.device(), "victim counters and evicted_* must be on the cache's device");
  }
  for (const auto* t : {&node, &record, &data}) {
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->is_pinned(), "victim node/record/data must be pinned host memory");
  }
  auto q = lsm::cache::victim_queues_view(count, queue_iteration, node, record, data, cache_data);
  const int64_t n = evicted_tag.numel();
  for (const auto* t : {&evicted_tag, &evicted_record, &evicted_line}) {
    lsm::cache::check_tensor(*t, "evicted_*", torch::kInt64, n);
  }
  // With UVA, memory from cudaHostAlloc (torch's pinned allocator) is mapped
  // at the same address on the device.
  auto counters = torch::zeros({3}, evicted_tag.options());
  check_cuda(lsm::cache::enqueue_victims_cuda(
                 q, evicted_tag.data_ptr<int64_t>(),
                 reinterpret_cast<const uint64_t*>(evicted_record.data_ptr<int64_t>()),
                 evicted_line.data_ptr<int64_t>(), n, static_cast<const uint8_t*>(cache_data.data_ptr()), iteration,
                 scan_base, reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>()),
                 c10::cuda::getCurrentCUDAStream()),
             "enqueue_victims");
  auto host = counters.cpu();  // synchronizes the stream: the queues are complete when this returns
  return py::make_tuple(host[0].item<int64_t>(), host[1].item<int64_t>(), host[2].item<int64_t>());
}

void scan_cuda(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
               const torch::Tensor& static_score, const torch::Tensor& last_use, const torch::Tensor& rr_pointer,
               int ways, const lsm::cache::WindowIndex& window, int64_t limit) {
  const c10::cuda::CUDAGuard guard(tags.device());
  CacheView v = device_view(tags, records, flags, static_score, last_use, rr_pointer, ways);
  // The window index lives in host memory; copying its per-node arrays would
  // cost O(nodes) per scan, so they are registered and read through UVA.
  const int64_t n = window.num_nodes();
  auto register_host = [](const void* p, size_t bytes) {
    void* dev = nullptr;
    cudaError_t err = cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (err == cudaErrorHostMemoryAlreadyRegistered) cudaGetLastError();
    else check_cuda(err, "cudaHostRegister");
    check_cuda(cudaHostGetDevicePointer(&dev, const_cast<void*>(p), 0), "cudaHostGetDevicePointer");
    return dev;
  };
  auto* it = static_cast<const int64_t*>(register_host(window.first_iteration(), n * sizeof(int64_t)));
  auto* pos = static_cast<const int64_t*>(register_host(window.first_position(), n * sizeof(int64_t)));
  auto* rank = static_cast<const uint8_t*>(register_host(window.first_rank(), n * sizeof(uint8_t)));
  check_cuda(lsm::cache::scan_cuda(v, it, pos, rank, window.front_iteration(), limit, n,
                                   c10::cuda::getCurrentCUDAStream()),
             "scan");
}

}  // namespace

void bind_cache_cuda(py::module& m) {
  m.def("cache_assign_cuda", &assign_cuda, "cache_assign on CUDA tensors (untested)");
  m.def("cache_scan_cuda", &scan_cuda, "cache_scan on CUDA tensors (untested)");
  m.def("victim_enqueue_cuda", &victim_enqueue_cuda, "victim_enqueue with the cache on CUDA (untested)");
}

#endif  // LSM_GNN_WITH_CUDA
