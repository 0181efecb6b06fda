// Torch glue of the CUDA window scan, the last cache op without a Triton twin
// (assign, victim enqueue and the sampler are Triton kernels: lsm_gnn/kernels);
// compiled only into CUDA builds. UNTESTED on a GPU; syntax-checked against
// torch's CUDA headers by tests/test_cuda_sources.py where nvcc is installed.
#ifdef LSM_GNN_WITH_CUDA

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "cache/cuda_cache.h"
#include "cache/state_tensors.h"
#include "cache/window_index.h"

namespace py = pybind11;

namespace {

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
  m.def("cache_scan_cuda", &scan_cuda, "cache_scan on CUDA tensors (untested)");
}

#endif  // LSM_GNN_WITH_CUDA
