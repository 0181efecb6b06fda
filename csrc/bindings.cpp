// The one place that knows both torch and the native core: thin wrappers
// that check tensors, release the GIL and forward raw pointers.
#include <ATen/Parallel.h>
#include <torch/python.h>  // pybind11 with torch types, without the C++ frontend of torch/extension.h

#include <cstring>
#include <system_error>

#include <unistd.h>
#include <cerrno>

#include "common/unique_ids.h"
#include "graph/pagerank.h"
#include "storage/row_reader.h"

namespace py = pybind11;

void bind_cache(py::module& m);    // cache/cache_bindings.cpp
void bind_sampler(py::module& m);  // sampler/sampler_bindings.cpp

namespace {

void check_cpu_contiguous(const torch::Tensor& t, const char* name, torch::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, " must have dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// (sorted distinct ids, inverse) of a 1-D int64 tensor; None when an id is negative.
py::object unique_inverse(const torch::Tensor& ids) {
  check_cpu_contiguous(ids, "ids", torch::kInt64);
  TORCH_CHECK_VALUE(ids.dim() == 1, "ids must be one-dimensional, got shape ", ids.sizes());
  auto inverse = torch::empty_like(ids);
  std::vector<int64_t> unique;
  bool ok;
  {
    py::gil_scoped_release release;
    ok = lsm::unique_inverse(ids.data_ptr<int64_t>(), ids.numel(), unique, inverse.data_ptr<int64_t>());
  }
  if (!ok) return py::none();
  auto distinct = torch::empty({static_cast<int64_t>(unique.size())}, torch::kInt64);
  std::copy(unique.begin(), unique.end(), distinct.data_ptr<int64_t>());
  return py::make_tuple(distinct, inverse);
}

// dst[dst_index[i]] = src[src_index[i]] for every i, rows of bytes, without the GIL: rows gathered from one
// buffer and scattered into another in one copy (torch would gather into a temporary, then scatter it).
void copy_rows(torch::Tensor& dst, const torch::Tensor& dst_index, const torch::Tensor& src,
               const torch::Tensor& src_index) {
  check_cpu_contiguous(dst, "dst", torch::kUInt8);
  check_cpu_contiguous(src, "src", torch::kUInt8);
  check_cpu_contiguous(dst_index, "dst_index", torch::kInt64);
  check_cpu_contiguous(src_index, "src_index", torch::kInt64);
  TORCH_CHECK_VALUE(dst.dim() == 2 && src.dim() == 2 && dst.size(1) == src.size(1),
                    "dst and src must be [rows, row_bytes] with the same row_bytes, got ", dst.sizes(), " and ",
                    src.sizes());
  TORCH_CHECK_VALUE(dst_index.numel() == src_index.numel(), "one source row per destination row: ",
                    src_index.numel(), " sources for ", dst_index.numel(), " destinations");
  const int64_t n = dst_index.numel(), row_bytes = dst.size(1), dst_rows = dst.size(0), src_rows = src.size(0);
  const int64_t* to = dst_index.data_ptr<int64_t>();
  const int64_t* from = src_index.data_ptr<int64_t>();
  uint8_t* out = dst.data_ptr<uint8_t>();
  const uint8_t* in = src.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_INDEX(to[i] >= 0 && to[i] < dst_rows && from[i] >= 0 && from[i] < src_rows, "copy_rows: pair ", i,
                      " copies row ", from[i], " of ", src_rows, " to row ", to[i], " of ", dst_rows);
  }
  py::gil_scoped_release release;
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::memcpy(out + to[i] * row_bytes, in + from[i] * row_bytes, row_bytes);
  });
}

class PyRowReader {
 public:
  PyRowReader(const std::string& backend, const std::string& path, uint64_t num_rows, uint64_t row_bytes,
              uint64_t row_stride, uint64_t data_offset, int queue_depth, bool direct, uint64_t max_request_bytes) {
    lsm::FileLayout layout;
    layout.num_rows = num_rows;
    layout.row_bytes = row_bytes;
    layout.row_stride = row_stride;
    layout.data_offset = data_offset;
    lsm::ReaderOptions options;
    options.queue_depth = queue_depth;
    options.direct = direct;
    options.max_request_bytes = max_request_bytes;
    reader_ = lsm::make_row_reader(backend, path, layout, options);
  }

  // Rows of ids into out, in request order; with slots, row i into row slots[i] of out (any number of rows).
  void read(const torch::Tensor& ids, torch::Tensor& out, const std::optional<torch::Tensor>& slots) {
    check_cpu_contiguous(ids, "ids", torch::kInt64);
    check_cpu_contiguous(out, "out", torch::kUInt8);
    TORCH_CHECK_VALUE(ids.dim() == 1, "ids must be one-dimensional, got shape ", ids.sizes());
    const auto row_bytes = static_cast<int64_t>(reader_->layout().row_bytes);
    const int64_t* slot_ptr = nullptr;
    if (slots.has_value()) {
      check_cpu_contiguous(*slots, "slots", torch::kInt64);
      TORCH_CHECK_VALUE(slots->numel() == ids.numel(), "slots must hold one slot per id: ", slots->numel(),
                        " for ", ids.numel());
      TORCH_CHECK_VALUE(out.numel() % row_bytes == 0, "out must hold whole rows of ", row_bytes, " bytes, got ",
                        out.numel());
      slot_ptr = slots->data_ptr<int64_t>();
      const int64_t rows = out.numel() / row_bytes;
      for (int64_t i = 0; i < ids.numel(); ++i) {
        TORCH_CHECK_INDEX(slot_ptr[i] >= 0 && slot_ptr[i] < rows, "slots[", i, "] = ", slot_ptr[i],
                          " is not a row of out (", rows, " rows)");
      }
    } else {
      TORCH_CHECK_VALUE(out.numel() == ids.numel() * row_bytes, "out must hold ", ids.numel(), " rows of ",
                        row_bytes, " bytes (", ids.numel() * row_bytes, " bytes), got ", out.numel());
    }
    const int64_t* id_ptr = ids.data_ptr<int64_t>();
    uint8_t* out_ptr = out.data_ptr<uint8_t>();
    const size_t n = static_cast<size_t>(ids.numel());
    py::gil_scoped_release release;
    reader_->read(id_ptr, n, out_ptr, slot_ptr);
  }

  py::dict counters() const {
    const auto& c = reader_->counters();
    py::dict d;
    d["batches"] = c.batches.load();
    d["rows"] = c.rows.load();
    d["unique_rows"] = c.unique_rows.load();
    d["requests"] = c.requests.load();
    d["bytes_read"] = c.bytes_read.load();
    d["bytes_useful"] = c.bytes_useful.load();
    d["total_ns"] = c.total_ns.load();
    d["last_batch_ns"] = c.last_batch_ns.load();
    d["max_batch_ns"] = c.max_batch_ns.load();
    d["busy_ns"] = c.busy_ns.load();
    return d;
  }

  void reset_counters() { reader_->reset_counters(); }
  std::string backend() const { return reader_->backend(); }
  bool direct() const { return reader_->direct(); }
  bool registered_buffers() const { return reader_->registered_buffers(); }
  uint64_t alignment() const { return reader_->alignment(); }
  uint64_t file_bytes() const { return reader_->layout().file_bytes; }

 private:
  std::unique_ptr<lsm::RowReader> reader_;
};

// The read plan a reader would build for `ids`, as arrays (one entry per
// read): how the storage engine coalesces rows, testable on any file system.
py::dict plan_reads(const torch::Tensor& ids, uint64_t num_rows, uint64_t row_bytes, uint64_t row_stride,
                    uint64_t file_bytes, uint64_t alignment, uint64_t max_request_bytes) {
  check_cpu_contiguous(ids, "ids", torch::kInt64);
  TORCH_CHECK_VALUE(ids.dim() == 1, "ids must be one-dimensional, got shape ", ids.sizes());
  TORCH_CHECK_VALUE(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two, got ",
                    alignment);
  TORCH_CHECK_VALUE(row_bytes > 0 && row_bytes <= row_stride, "need 0 < row_bytes <= row_stride, got ", row_bytes,
                    " and ", row_stride);
  lsm::FileLayout layout;
  layout.num_rows = num_rows;
  layout.row_bytes = row_bytes;
  layout.row_stride = row_stride;
  layout.file_bytes = file_bytes;
  const lsm::ReadPlan plan = lsm::make_read_plan(ids.data_ptr<int64_t>(), static_cast<size_t>(ids.numel()), layout,
                                                 alignment, max_request_bytes);
  const auto count = static_cast<int64_t>(plan.runs.size());
  auto offsets = torch::empty({count}, torch::kInt64), lengths = torch::empty({count}, torch::kInt64);
  auto rows = torch::empty({count}, torch::kInt64);
  for (int64_t r = 0; r < count; ++r) {
    offsets[r] = static_cast<int64_t>(plan.runs[r].file_offset);
    lengths[r] = static_cast<int64_t>(plan.runs[r].length);
    rows[r] = static_cast<int64_t>(plan.runs[r].num_rows);
  }
  py::dict d;
  d["file_offset"] = offsets;
  d["length"] = lengths;
  d["num_rows"] = rows;
  d["bytes_read"] = plan.bytes_read;
  d["unique_rows"] = plan.unique_rows;
  d["max_run_bytes"] = lsm::max_run_bytes(layout, alignment, max_request_bytes);
  return d;
}

py::tuple reverse_pagerank(const torch::Tensor& indptr, const torch::Tensor& indices, double damping,
                           int max_iterations, double tolerance, int num_threads) {
  check_cpu_contiguous(indptr, "indptr", torch::kInt64);
  TORCH_CHECK_VALUE(indices.device().is_cpu() && indices.is_contiguous(), "indices must be a contiguous CPU tensor");
  TORCH_CHECK_VALUE(indptr.dim() == 1 && indptr.numel() >= 2, "indptr must be 1-D with at least two entries");
  const int64_t n = indptr.numel() - 1, num_edges = indices.numel();
  lsm::PageRankResult result;
  {
    py::gil_scoped_release release;
    if (indices.scalar_type() == torch::kInt32) {
      result = lsm::reverse_pagerank<int32_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int32_t>(), n, num_edges,
                                              damping, max_iterations, tolerance, num_threads);
    } else if (indices.scalar_type() == torch::kInt64) {
      result = lsm::reverse_pagerank<int64_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), n, num_edges,
                                              damping, max_iterations, tolerance, num_threads);
    } else {
      throw std::invalid_argument("indices must be int32 or int64");
    }
  }
  auto scores = torch::from_blob(result.scores.data(), {n}, torch::kFloat32).clone();
  return py::make_tuple(scores, result.iterations, result.residual);
}

// Writes rows[i] (row_bytes each) at byte ids[i] * row_stride of file descriptor fd: one pwrite per row, in C
// and without the GIL, for an embedding table's scattered write-backs. Returns the bytes written; a failed
// write raises OSError with its errno (ENOSPC: the disk is full).
int64_t write_rows(int fd, const torch::Tensor& ids, const torch::Tensor& rows, uint64_t row_stride) {
  check_cpu_contiguous(ids, "ids", torch::kInt64);
  check_cpu_contiguous(rows, "rows", torch::kUInt8);
  TORCH_CHECK_VALUE(ids.dim() == 1 && rows.dim() == 2 && rows.size(0) == ids.numel(),
                    "rows must hold one row per id, got ", rows.sizes(), " for ", ids.numel(), " ids");
  const int64_t n = ids.numel();
  const auto row_bytes = static_cast<uint64_t>(rows.size(1));
  TORCH_CHECK_VALUE(row_bytes > 0 && row_bytes <= row_stride, "need 0 < row_bytes <= row_stride, got ", row_bytes,
                    " and ", row_stride);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* source = rows.data_ptr<uint8_t>();
  py::gil_scoped_release release;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(id[i] >= 0, "row ids must be >= 0, got ", id[i]);
    const uint8_t* from = source + static_cast<uint64_t>(i) * row_bytes;
    uint64_t left = row_bytes;
    auto offset = static_cast<off_t>(static_cast<uint64_t>(id[i]) * row_stride);
    while (left > 0) {
      const ssize_t done = ::pwrite(fd, from, left, offset);
      if (done < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "writing an embedding table row");
      }
      from += done;
      left -= static_cast<uint64_t>(done);
      offset += done;
    }
  }
  return n * static_cast<int64_t>(row_bytes);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lsm-gnn native core";

  // Keep errno: a failed syscall becomes OSError(errno, message).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::system_error& e) {
      py::object err = py::reinterpret_steal<py::object>(PyObject_CallFunction(
          PyExc_OSError, "is", e.code().value(), e.what()));
      PyErr_SetObject(PyExc_OSError, err.ptr());
    }
  });

  py::class_<PyRowReader>(m, "RowReader")
      .def(py::init<const std::string&, const std::string&, uint64_t, uint64_t, uint64_t, uint64_t, int, bool,
                    uint64_t>(),
           py::arg("backend"), py::arg("path"), py::arg("num_rows"), py::arg("row_bytes"), py::arg("row_stride"),
           py::arg("data_offset") = 0, py::arg("queue_depth") = 64, py::arg("direct") = true,
           py::arg("max_request_bytes") = 128 * 1024)
      .def("read", &PyRowReader::read, py::arg("ids"), py::arg("out"), py::arg("slots") = py::none())
      .def("counters", &PyRowReader::counters)
      .def("reset_counters", &PyRowReader::reset_counters)
      .def_property_readonly("backend", &PyRowReader::backend)
      .def_property_readonly("direct", &PyRowReader::direct)
      .def_property_readonly("registered_buffers", &PyRowReader::registered_buffers)
      .def_property_readonly("alignment", &PyRowReader::alignment)
      .def_property_readonly("file_bytes", &PyRowReader::file_bytes);

  m.def("plan_reads", &plan_reads, py::arg("ids"), py::arg("num_rows"), py::arg("row_bytes"), py::arg("row_stride"),
        py::arg("file_bytes"), py::arg("alignment"), py::arg("max_request_bytes"),
        "The storage engine's read plan for ids: file_offset, length and num_rows per read, bytes_read, "
        "unique_rows, max_run_bytes");
  m.def("unique_inverse", &unique_inverse, py::arg("ids"),
        "(sorted distinct ids, index of each id among them) in linear time; None if an id is negative");
  m.def("copy_rows", &copy_rows, py::arg("dst"), py::arg("dst_index"), py::arg("src"), py::arg("src_index"),
        "dst[dst_index[i]] = src[src_index[i]] for each i: rows of bytes in one copy, without the GIL");
  m.def("write_rows", &write_rows, py::arg("fd"), py::arg("ids"), py::arg("rows"), py::arg("row_stride"),
        "pwrite rows[i] at ids[i] * row_stride of fd, one call per row without the GIL; returns the bytes");
  m.def("io_uring_available", &lsm::io_uring_available, "Whether the kernel allows io_uring for this process");
  m.def("reverse_pagerank", &reverse_pagerank, py::arg("indptr"), py::arg("indices"), py::arg("damping") = 0.85,
        py::arg("max_iterations") = 100, py::arg("tolerance") = 1e-7, py::arg("num_threads") = 0);
  bind_cache(m);
  bind_sampler(m);
}
