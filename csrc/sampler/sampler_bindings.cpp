// Torch binding of the neighbor sampler.
#include <torch/python.h>  // pybind11 with torch types, without the C++ frontend of torch/extension.h

#include "graph/csr_check.h"
#include "sampler/neighbor_sampler.h"

namespace py = pybind11;

namespace {

torch::Tensor to_tensor(std::vector<int64_t>&& v) {
  auto* owned = new std::vector<int64_t>(std::move(v));
  return torch::from_blob(owned->data(), {static_cast<int64_t>(owned->size())},
                          [owned](void*) { delete owned; }, torch::kInt64);
}

py::list sample_hops(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& seeds,
                     const std::vector<int64_t>& fanouts, uint64_t seed, int64_t iteration, int num_threads,
                     int64_t num_ids) {
  TORCH_CHECK_VALUE(indptr.device().is_cpu() && indptr.scalar_type() == torch::kInt64 && indptr.is_contiguous() &&
                        indptr.dim() == 1 && indptr.numel() >= 1,
                    "indptr must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK_VALUE(indices.device().is_cpu() && indices.is_contiguous() && indices.dim() == 1 &&
                        (indices.scalar_type() == torch::kInt32 || indices.scalar_type() == torch::kInt64),
                    "indices must be a contiguous 1-D int32 or int64 CPU tensor");
  TORCH_CHECK_VALUE(seeds.device().is_cpu() && seeds.scalar_type() == torch::kInt64 && seeds.is_contiguous(),
                    "seeds must be a contiguous int64 CPU tensor");
  for (int64_t k : fanouts) TORCH_CHECK_VALUE(k == -1 || k >= 0, "fanouts must be >= 0 or -1 (all), got ", k);
  const int64_t num_nodes = indptr.numel() - 1, num_edges = indices.numel();
  if (num_ids < 0) num_ids = num_nodes;  // neighbor ids are rows of this CSR
  std::vector<lsm::sampler::Hop> hops;
  {
    py::gil_scoped_release release;
    if (indices.scalar_type() == torch::kInt32) {
      hops = lsm::sampler::sample_hops<int32_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int32_t>(), num_nodes,
                                                num_edges, seeds.data_ptr<int64_t>(), seeds.numel(), fanouts, seed,
                                                iteration, num_threads, num_ids);
    } else {
      hops = lsm::sampler::sample_hops<int64_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), num_nodes,
                                                num_edges, seeds.data_ptr<int64_t>(), seeds.numel(), fanouts, seed,
                                                iteration, num_threads, num_ids);
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
  // A corrupt CSR (from the sampler or PageRank) becomes CorruptGraphError(message, array), a ValueError;
  // lsm_gnn turns it into a DatasetError naming the file. Registered here, beside the CSR's main reader.
  // The type is leaked on purpose: it must outlive the module for the translator.
  static PyObject* corrupt_graph =
      PyErr_NewExceptionWithDoc("lsm_gnn._C.CorruptGraphError",
                                "A CSR array is corrupt; args are (message, 'indptr' or 'indices').",
                                PyExc_ValueError, nullptr);
  if (corrupt_graph == nullptr) throw py::error_already_set();
  m.attr("CorruptGraphError") = py::handle(corrupt_graph);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lsm::graph::CorruptGraph& e) {
      py::tuple args = py::make_tuple(e.what(), e.array());
      PyErr_SetObject(corrupt_graph, args.ptr());
    }
  });
  m.def("sample_hops", &sample_hops, py::arg("indptr"), py::arg("indices"), py::arg("seeds"), py::arg("fanouts"),
        py::arg("seed"), py::arg("iteration"), py::arg("num_threads") = 0, py::arg("num_ids") = -1,
        "Uniform neighbor sampling without replacement: [(nodes, num_dst, src_local, dst_local)] per hop; "
        "neighbor ids lie in [0, num_ids) (-1: the CSR's rows)");
}
