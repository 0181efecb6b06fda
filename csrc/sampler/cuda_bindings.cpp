// Torch glue of the CUDA neighbor sampler; compiled only into CUDA builds.
// UNTESTED on a GPU (see neighbor_sampler_cuda.cu); syntax-checked against
// torch's CUDA headers by tests/test_cuda_sources.py where nvcc is installed.
//
// Returns the structure of the CPU `sample_hops` (sampler_bindings.cpp), with
// every tensor on the seeds' device and identical values: the kernels draw
// the CPU's positions, and the relabelling below reproduces its numbering of
// new nodes by first occurrence in edge order.
#ifdef LSM_GNN_WITH_CUDA

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "sampler/neighbor_sampler_cuda.h"
#include "sampler/sampler_rng.h"

namespace py = pybind11;

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

// A device-readable address of a CSR array: device memory on the seeds'
// device, or pinned host memory through its UVA mapping.
const void* device_address(const torch::Tensor& t, const char* name, const torch::Device& device) {
  if (t.is_cuda()) {
    TORCH_CHECK_VALUE(t.device() == device, name, " is on ", t.device(), " but the seeds are on ", device);
    return t.data_ptr();
  }
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_pinned(), name,
                    " must be on the seeds' CUDA device or in pinned host memory (tensor.pin_memory())");
  if (t.numel() == 0) return nullptr;
  // cudaPointerGetAttributes accepts any address inside the allocation (a view's data_ptr).
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, t.data_ptr()), "cudaPointerGetAttributes");
  TORCH_CHECK_VALUE(attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr, name,
                    " is pinned but not mapped into the device's address space");
  return attributes.devicePointer;
}

// Seeds must be distinct node ids, as on the CPU (same exception types).
void check_seeds(const torch::Tensor& seeds, int64_t num_nodes) {
  if (seeds.numel() == 0) return;
  const auto bad = torch::logical_or(seeds < 0, seeds >= num_nodes);
  if (bad.any().item<bool>()) {
    const int64_t i = torch::nonzero(bad)[0][0].item<int64_t>();
    TORCH_CHECK_INDEX(false, "seed node ", seeds[i].item<int64_t>(), " at position ", i, " is outside [0, ",
                      num_nodes, ")");
  }
  const auto sorted = std::get<0>(torch::sort(seeds));
  const auto repeated = sorted.slice(0, 1) == sorted.slice(0, 0, -1);
  if (repeated.any().item<bool>()) {
    const int64_t v = sorted.slice(0, 1).masked_select(repeated)[0].item<int64_t>();
    TORCH_CHECK_VALUE(false, "seed node ", v, " appears twice in the batch; seeds must be distinct");
  }
}

py::list sample_hops_cuda(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& seeds,
                          const std::vector<int64_t>& fanouts, uint64_t seed, int64_t iteration) {
  TORCH_CHECK_VALUE(seeds.is_cuda() && seeds.scalar_type() == torch::kInt64 && seeds.dim() == 1,
                    "seeds must be a 1-D int64 CUDA tensor");
  TORCH_CHECK_VALUE(indptr.scalar_type() == torch::kInt64 && indptr.is_contiguous() && indptr.dim() == 1 &&
                        indptr.numel() >= 1,
                    "indptr must be a contiguous 1-D int64 tensor");
  TORCH_CHECK_VALUE(indices.is_contiguous() &&
                        (indices.scalar_type() == torch::kInt32 || indices.scalar_type() == torch::kInt64),
                    "indices must be a contiguous int32 or int64 tensor");
  for (int64_t k : fanouts) TORCH_CHECK_VALUE(k == -1 || k >= 0, "fanouts must be >= 0 or -1 (all), got ", k);
  const c10::cuda::CUDAGuard guard(seeds.device());
  const auto* indptr_ptr = static_cast<const int64_t*>(device_address(indptr, "indptr", seeds.device()));
  const void* indices_ptr = device_address(indices, "indices", seeds.device());
  const int64_t num_nodes = indptr.numel() - 1;
  check_seeds(seeds, num_nodes);

  auto stream = c10::cuda::getCurrentCUDAStream();  // torch ops below run on it too
  const auto opts = seeds.options();
  const uint64_t batch = lsm::sampler::batch_key(seed, iteration);
  torch::Tensor frontier = seeds.contiguous();
  py::list out;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t k = fanouts[h];
    const int64_t n = frontier.numel();
    auto counts = torch::empty({n}, opts);
    check_cuda(lsm::sampler::count_neighbors_cuda(indptr_ptr, frontier.data_ptr<int64_t>(), n, k,
                                                  counts.data_ptr<int64_t>(), stream),
               "count_neighbors");
    auto offsets = torch::cat({torch::zeros({1}, opts), counts.cumsum(0)});
    const int64_t total = offsets[n].item<int64_t>();  // sizes the outputs: one sync per hop
    auto src = torch::empty({total}, opts);
    auto dst = torch::empty({total}, opts);
    const uint64_t key = lsm::sampler::hop_key(batch, h);
    const cudaError_t err =
        indices.scalar_type() == torch::kInt32
            ? lsm::sampler::sample_neighbors_cuda(indptr_ptr, static_cast<const int32_t*>(indices_ptr),
                                                  frontier.data_ptr<int64_t>(), n, k, key,
                                                  offsets.data_ptr<int64_t>(), src.data_ptr<int64_t>(),
                                                  dst.data_ptr<int64_t>(), stream)
            : lsm::sampler::sample_neighbors_cuda(indptr_ptr, static_cast<const int64_t*>(indices_ptr),
                                                  frontier.data_ptr<int64_t>(), n, k, key,
                                                  offsets.data_ptr<int64_t>(), src.data_ptr<int64_t>(),
                                                  dst.data_ptr<int64_t>(), stream);
    check_cuda(err, "sample_neighbors");

    // Relabel as the CPU does: a node's local id is its rank by first
    // occurrence in [frontier, sampled sources]. The frontier is distinct, so
    // its nodes keep ids 0..n-1 and new nodes follow in edge order.
    auto all = torch::cat({frontier, src});
    auto [unique, inverse, unused] = torch::_unique2(all, /*sorted=*/true, /*return_inverse=*/true);
    auto first = torch::full({unique.numel()}, all.numel(), opts)
                     .scatter_reduce_(0, inverse, torch::arange(all.numel(), opts), "amin", /*include_self=*/true);
    auto [first_sorted, order] = torch::sort(first);  // first positions are distinct: no ties
    auto rank = torch::empty_like(order).scatter_(0, order, torch::arange(order.numel(), opts));
    auto nodes = all.index_select(0, first_sorted);  // frontier, then the new nodes
    auto src_local = rank.index_select(0, inverse.slice(0, n));
    out.append(py::make_tuple(nodes, n, src_local, dst));
    frontier = nodes;
  }
  return out;
}

}  // namespace

void bind_sampler_cuda(py::module& m) {
  m.def("sample_hops_cuda", &sample_hops_cuda, py::arg("indptr"), py::arg("indices"), py::arg("seeds"),
        py::arg("fanouts"), py::arg("seed"), py::arg("iteration"),
        "sample_hops on a CUDA device (untested): the CSR in device or pinned host memory, seeds on the device; "
        "returns the CPU sampler's hops with tensors on the device");
}

#endif  // LSM_GNN_WITH_CUDA
