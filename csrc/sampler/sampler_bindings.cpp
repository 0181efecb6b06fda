// Torch binding of the neighbor sampler.
#include <torch/extension.h>

#include "sampler/neighbor_sampler.h"

namespace py = pybind11;

namespace {

torch::Tensor to_tensor(std::vector<int64_t>&& v) {
  auto* owned = new std::vector<int64_t>(std::move(v));
  return torch::from_blob(owned->data(), {static_cast<int64_t>(owned->size())},
                          [owned](void*) { delete owned; }, torch::kInt64);
}

py::list sample_hops(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& seeds,
                     const std::vector<int64_t>& fanouts, uint64_t seed, int64_t iteration, int num_threads) {
  TORCH_CHECK_VALUE(indptr.device().is_cpu() && indptr.scalar_type() == torch::kInt64 && indptr.is_contiguous() &&
                        indptr.dim() == 1 && indptr.numel() >= 1,
                    "indptr must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK_VALUE(indices.device().is_cpu() && indices.is_contiguous() &&
                        (indices.scalar_type() == torch::kInt32 || indices.scalar_type() == torch::kInt64),
                    "indices must be a contiguous int32 or int64 CPU tensor");
  TORCH_CHECK_VALUE(seeds.device().is_cpu() && seeds.scalar_type() == torch::kInt64 && seeds.is_contiguous(),
                    "seeds must be a contiguous int64 CPU tensor");
  for (int64_t k : fanouts) TORCH_CHECK_VALUE(k == -1 || k >= 0, "fanouts must be >= 0 or -1 (all), got ", k);
  const int64_t num_nodes = indptr.numel() - 1;
  std::vector<lsm::sampler::Hop> hops;
  {
    py::gil_scoped_release release;
    if (indices.scalar_type() == torch::kInt32) {
      hops = lsm::sampler::sample_hops<int32_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int32_t>(), num_nodes,
                                                seeds.data_ptr<int64_t>(), seeds.numel(), fanouts, seed, iteration,
                                                num_threads);
    } else {
      hops = lsm::sampler::sample_hops<int64_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), num_nodes,
                                                seeds.data_ptr<int64_t>(), seeds.numel(), fanouts, seed, iteration,
                                                num_threads);
    }
  }
  py::list out;
  for (auto& h : hops) {
    out.append(py::make_tuple(to_tensor(std::move(h.nodes)), h.num_dst, to_tensor(std::move(h.src)),
                              to_tensor(std::move(h.dst))));
  }
  return out;
}

}  // namespace

void bind_sampler(py::module& m) {
  m.def("sample_hops", &sample_hops, py::arg("indptr"), py::arg("indices"), py::arg("seeds"), py::arg("fanouts"),
        py::arg("seed"), py::arg("iteration"), py::arg("num_threads") = 0,
        "Uniform neighbor sampling without replacement: [(nodes, num_dst, src_local, dst_local)] per hop");
}
