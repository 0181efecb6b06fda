// Torch bindings of the cache ops: check tensors, release the GIL, forward pointers.
#include <torch/python.h>  // pybind11 with torch types, without the C++ frontend of torch/extension.h

#include "cache/belady.h"
#include "cache/cpu_cache.h"
#include "cache/read_ahead.h"
#include "cache/state_tensors.h"
#include "cache/victim_buffer.h"
#include "cache/window_index.h"

namespace py = pybind11;

namespace {

using lsm::cache::CacheView;

void check(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t numel) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor");
  lsm::cache::check_tensor(t, name, dtype, numel);
}

// A trace of int64 CPU tensors (one batch of distinct ids each) as the Belady core takes it.
std::vector<std::vector<int64_t>> trace_of(const std::vector<torch::Tensor>& batches) {
  std::vector<std::vector<int64_t>> trace;
  trace.reserve(batches.size());
  for (const auto& b : batches) {
    check(b, "batch", torch::kInt64, -1);
    trace.emplace_back(b.data_ptr<int64_t>(), b.data_ptr<int64_t>() + b.numel());
  }
  return trace;
}

CacheView view_of(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
                  const torch::Tensor& static_score, const torch::Tensor& last_use, const torch::Tensor& rr_pointer,
                  int ways) {
  TORCH_CHECK_VALUE(tags.device().is_cpu(), "the CPU cache ops need CPU state tensors");
  return lsm::cache::state_view(tags, records, flags, static_score, last_use, rr_pointer, ways);
}

py::tuple assign(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
                 const torch::Tensor& static_score, const torch::Tensor& last_use, const torch::Tensor& rr_pointer,
                 int ways, const torch::Tensor& unique, const std::optional<torch::Tensor>& node_static, int policy,
                 int64_t iteration, int64_t scan_base, int64_t threshold, std::vector<int> level_rank,
                 const std::optional<torch::Tensor>& queue_room, const std::optional<torch::Tensor>& first_iteration,
                 const std::optional<torch::Tensor>& first_position, const std::optional<torch::Tensor>& first_rank,
                 int64_t front, int64_t limit, bool bypass, int num_threads) {
  CacheView v = view_of(tags, records, flags, static_score, last_use, rr_pointer, ways);
  check(unique, "unique", torch::kInt64, -1);
  TORCH_CHECK_VALUE(level_rank.size() == 4, "level_rank must have 4 entries");
  const uint16_t* node_static_ptr = nullptr;
  if (node_static.has_value()) {
    check(*node_static, "node_static", torch::kInt16, -1);
    node_static_ptr = reinterpret_cast<const uint16_t*>(node_static->data_ptr<int16_t>());
  }
  lsm::cache::PolicyParams p;
  p.policy = policy;
  p.iteration = iteration;
  p.scan_base = scan_base;
  p.threshold = threshold;
  for (int k = 0; k < 4; ++k) p.level_rank[k] = level_rank[k];
  if (queue_room.has_value()) {
    check(*queue_room, "queue_room", torch::kUInt8, -1);
    TORCH_CHECK_VALUE(queue_room->numel() > 0, "queue_room must have one entry per victim queue");
    p.queue_room = queue_room->data_ptr<uint8_t>();
    p.num_queues = queue_room->numel();
  }
  TORCH_CHECK_VALUE(first_iteration.has_value() == first_position.has_value() &&
                        first_iteration.has_value() == first_rank.has_value(),
                    "give all of first_iteration, first_position and first_rank (a window index's arrays) or none");
  if (first_iteration.has_value()) {  // next use at assign
    const int64_t num_nodes = first_iteration->numel();
    check(*first_iteration, "first_iteration", torch::kInt32, num_nodes);
    check(*first_position, "first_position", torch::kInt32, num_nodes);
    check(*first_rank, "first_rank", torch::kUInt8, num_nodes);
    p.first_iteration = first_iteration->data_ptr<int32_t>();
    p.first_position = first_position->data_ptr<int32_t>();
    p.first_rank = first_rank->data_ptr<uint8_t>();
    p.num_nodes = num_nodes;
    p.front = front;
    p.limit = limit;
    p.bypass = bypass;
  }
  const int64_t n = unique.numel();
  auto line = torch::empty({n}, torch::kInt64);
  auto hit = torch::empty({n}, torch::kBool);
  auto evicted_tag = torch::empty({n}, torch::kInt64);
  auto evicted_record = torch::empty({n}, torch::kInt64);
  auto evicted_line = torch::empty({n}, torch::kInt64);
  lsm::cache::AssignOutput out;
  out.line = line.data_ptr<int64_t>();
  out.hit = reinterpret_cast<uint8_t*>(hit.data_ptr<bool>());
  out.evicted_tag = evicted_tag.data_ptr<int64_t>();
  out.evicted_record = reinterpret_cast<uint64_t*>(evicted_record.data_ptr<int64_t>());
  out.evicted_line = evicted_line.data_ptr<int64_t>();
  {
    py::gil_scoped_release release;
    lsm::cache::assign(v, unique.data_ptr<int64_t>(), n, node_static_ptr, p, out, num_threads);
  }
  return py::make_tuple(line, hit, evicted_tag, evicted_record, evicted_line, out.evictions, out.evicted_in_use,
                        out.bypassed);
}

py::tuple victim_enqueue(const torch::Tensor& count, const torch::Tensor& queue_iteration, const torch::Tensor& node,
                         const torch::Tensor& record, const torch::Tensor& data, const torch::Tensor& evicted_tag,
                         const torch::Tensor& evicted_record, const torch::Tensor& evicted_line,
                         const torch::Tensor& cache_data, int64_t iteration, int64_t scan_base, int num_threads) {
  for (const auto* t : {&count, &queue_iteration, &node, &record, &data, &cache_data}) {
    TORCH_CHECK_VALUE(t->device().is_cpu(), "victim_enqueue needs CPU tensors (use victim_enqueue_cuda)");
  }
  auto q = lsm::cache::victim_queues_view(count, queue_iteration, node, record, data, cache_data);
  const int64_t n = evicted_tag.numel();
  check(evicted_tag, "evicted_tag", torch::kInt64, n);
  check(evicted_record, "evicted_record", torch::kInt64, n);
  check(evicted_line, "evicted_line", torch::kInt64, n);
  const int64_t lines = cache_data.size(0);
  const int64_t* tag = evicted_tag.data_ptr<int64_t>();
  const int64_t* line = evicted_line.data_ptr<int64_t>();
  for (int64_t u = 0; u < n; ++u) {
    TORCH_CHECK_VALUE(tag[u] == lsm::cache::kInvalidTag || (line[u] >= 0 && line[u] < lines),
                      "evicted_line[", u, "] = ", line[u], " is not a line of the cache");
  }
  lsm::cache::EnqueueCounts c;
  {
    py::gil_scoped_release release;
    c = lsm::cache::enqueue_victims(q, tag, reinterpret_cast<const uint64_t*>(evicted_record.data_ptr<int64_t>()),
                                    line, n, static_cast<const uint8_t*>(cache_data.data_ptr()), iteration,
                                    scan_base, num_threads);
  }
  return py::make_tuple(c.enqueued, c.dropped_no_reuse, c.dropped_full);
}

void check_inverse(const torch::Tensor& inverse, int64_t n, int64_t num_unique) {
  check(inverse, "inverse", torch::kInt64, n);
  const int64_t* inv = inverse.data_ptr<int64_t>();
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK_VALUE(inv[j] >= 0 && inv[j] < num_unique, "inverse[", j, "] = ", inv[j], " is not in [0, ",
                      num_unique, ")");
  }
}

py::tuple pvp_match(const torch::Tensor& ids, const torch::Tensor& inverse, int64_t num_unique,
                    const torch::Tensor& node, const torch::Tensor& record) {
  const int64_t n = ids.numel(), lines = node.numel();
  check(ids, "ids", torch::kInt64, -1);
  check_inverse(inverse, n, num_unique);
  check(node, "node", torch::kInt64, -1);
  check(record, "record", torch::kInt64, lines);
  auto served = torch::empty({num_unique}, torch::kBool);
  auto entry = torch::empty({num_unique}, torch::kInt64);
  auto position = torch::empty({num_unique}, torch::kInt64);
  {
    py::gil_scoped_release release;
    lsm::cache::match_prefetched(ids.data_ptr<int64_t>(), n, inverse.data_ptr<int64_t>(), num_unique,
                                 node.data_ptr<int64_t>(), reinterpret_cast<const uint64_t*>(record.data_ptr<int64_t>()),
                                 lines, reinterpret_cast<uint8_t*>(served.data_ptr<bool>()), entry.data_ptr<int64_t>(),
                                 position.data_ptr<int64_t>());
  }
  return py::make_tuple(served, entry, position);
}

// Rows of one dtype and width: the cache's lines and the prefetch buffer (and the batch's rows).
void check_rows(std::initializer_list<const torch::Tensor*> tensors, const char* names) {
  const torch::Tensor& first = **tensors.begin();
  for (const torch::Tensor* t : tensors) {
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->dim() == 2 && t->is_contiguous() &&
                          t->scalar_type() == first.scalar_type() && t->size(1) == first.size(1),
                      names, " must be contiguous 2-D CPU tensors of one dtype and width");
  }
}

py::tuple pvp_fill(const torch::Tensor& ids, const torch::Tensor& inverse, const torch::Tensor& hit,
                   const torch::Tensor& line, const torch::Tensor& node, const torch::Tensor& record,
                   const torch::Tensor& pf_rows, torch::Tensor& cache_data) {
  const int64_t n = ids.numel(), num_unique = hit.numel(), lines = node.numel();
  check(ids, "ids", torch::kInt64, -1);
  check_inverse(inverse, n, num_unique);
  check(hit, "hit", torch::kBool, num_unique);
  check(line, "line", torch::kInt64, num_unique);
  check(node, "node", torch::kInt64, -1);
  check(record, "record", torch::kInt64, lines);
  check_rows({&cache_data, &pf_rows}, "cache_data and pf_rows");
  TORCH_CHECK_VALUE(pf_rows.size(0) >= lines, "pf_rows has ", pf_rows.size(0), " rows for ", lines,
                    " prefetched lines");
  const int64_t* l = line.data_ptr<int64_t>();
  for (int64_t u = 0; u < num_unique; ++u) {
    TORCH_CHECK_VALUE(l[u] < cache_data.size(0), "line[", u, "] = ", l[u], " is not a cache line");
  }
  auto from_pvp = torch::empty({num_unique}, torch::kBool);
  auto entry = torch::empty({num_unique}, torch::kInt64);
  {
    py::gil_scoped_release release;
    lsm::cache::fill_prefetched(ids.data_ptr<int64_t>(), n, inverse.data_ptr<int64_t>(), num_unique,
                                reinterpret_cast<const uint8_t*>(hit.data_ptr<bool>()), l, node.data_ptr<int64_t>(),
                                reinterpret_cast<const uint64_t*>(record.data_ptr<int64_t>()), lines,
                                static_cast<const uint8_t*>(pf_rows.data_ptr()),
                                static_cast<uint8_t*>(cache_data.data_ptr()),
                                cache_data.size(1) * cache_data.element_size(),
                                reinterpret_cast<uint8_t*>(from_pvp.data_ptr<bool>()), entry.data_ptr<int64_t>());
  }
  return py::make_tuple(from_pvp, entry);
}

void pvp_scatter(torch::Tensor& rows, torch::Tensor& cache_data, const torch::Tensor& pf_rows,
                 const torch::Tensor& inverse, const torch::Tensor& from_pvp, const torch::Tensor& entry,
                 const std::optional<torch::Tensor>& line) {
  check_rows({&rows, &cache_data, &pf_rows}, "rows, cache_data and pf_rows");
  const int64_t num_unique = from_pvp.numel();
  check(from_pvp, "from_pvp", torch::kBool, num_unique);
  check(entry, "entry", torch::kInt64, num_unique);
  check_inverse(inverse, rows.size(0), num_unique);
  const bool* served = from_pvp.data_ptr<bool>();
  const int64_t* e = entry.data_ptr<int64_t>();
  const int64_t* l = nullptr;
  if (line.has_value()) {
    check(*line, "line", torch::kInt64, num_unique);
    l = line->data_ptr<int64_t>();
  }
  for (int64_t u = 0; u < num_unique; ++u) {
    if (!served[u]) continue;
    TORCH_CHECK_VALUE(e[u] >= 0 && e[u] < pf_rows.size(0), "entry[", u, "] = ", e[u], " is not a prefetched line");
    TORCH_CHECK_VALUE(l == nullptr || l[u] < cache_data.size(0), "line[", u, "] = ", l[u], " is not a cache line");
  }
  const int64_t row_bytes = rows.size(1) * rows.element_size();
  py::gil_scoped_release release;
  lsm::cache::scatter_prefetched(static_cast<uint8_t*>(rows.data_ptr()), rows.size(0),
                                 static_cast<uint8_t*>(cache_data.data_ptr()),
                                 static_cast<const uint8_t*>(pf_rows.data_ptr()), inverse.data_ptr<int64_t>(),
                                 reinterpret_cast<const uint8_t*>(served), e, l, num_unique, row_bytes);
}

void scan(const torch::Tensor& tags, const torch::Tensor& records, const torch::Tensor& flags,
          const torch::Tensor& first_iteration, const torch::Tensor& first_position, const torch::Tensor& first_rank,
          int64_t front, int64_t limit, int num_threads) {
  const int64_t lines = tags.numel();
  check(tags, "tags", torch::kInt64, lines);
  check(records, "records", torch::kInt64, lines);
  check(flags, "flags", torch::kUInt8, lines);
  const int64_t num_nodes = first_iteration.numel();
  check(first_iteration, "first_iteration", torch::kInt32, num_nodes);
  check(first_position, "first_position", torch::kInt32, num_nodes);
  check(first_rank, "first_rank", torch::kUInt8, num_nodes);
  py::gil_scoped_release release;
  lsm::cache::scan(lines, tags.data_ptr<int64_t>(), reinterpret_cast<uint64_t*>(records.data_ptr<int64_t>()),
                   flags.data_ptr<uint8_t>(), first_iteration.data_ptr<int32_t>(), first_position.data_ptr<int32_t>(),
                   first_rank.data_ptr<uint8_t>(), num_nodes, front, limit, num_threads);
}

// A getter of one of a WindowIndex's per-node arrays as a tensor sharing its
// memory (the arrays never reallocate); keep_alive holds the index while the view lives.
template <typename T>
py::cpp_function index_view_getter(const T* (lsm::cache::WindowIndex::*array)() const, torch::ScalarType dtype) {
  return py::cpp_function(
      [array, dtype](const lsm::cache::WindowIndex& w) {
        return torch::from_blob(const_cast<T*>((w.*array)()), {w.num_nodes()}, torch::TensorOptions().dtype(dtype));
      },
      py::keep_alive<0, 1>());
}

// int64 CPU tensors as the id spans the read-ahead core takes.
std::vector<lsm::cache::IdSpan> id_spans(const std::vector<torch::Tensor>& tensors, const char* name) {
  std::vector<lsm::cache::IdSpan> out;
  for (const auto& t : tensors) {
    check(t, name, torch::kInt64, -1);
    out.push_back({t.data_ptr<int64_t>(), static_cast<size_t>(t.numel())});
  }
  return out;
}

std::vector<torch::Tensor> ahead_misses(const torch::Tensor& tags, int64_t ways,
                                        const std::vector<torch::Tensor>& batches,
                                        const std::vector<torch::Tensor>& known) {
  check(tags, "tags", torch::kInt64, -1);
  TORCH_CHECK_VALUE(ways > 0 && tags.numel() % ways == 0, "tags must hold whole sets of ", ways, " ways");
  const auto b = id_spans(batches, "batch");
  const auto k = id_spans(known, "known");
  std::vector<std::vector<int64_t>> want;
  {
    py::gil_scoped_release release;
    want = lsm::cache::ahead_misses(tags.data_ptr<int64_t>(), tags.numel() / ways, static_cast<int>(ways), b, k);
  }
  std::vector<torch::Tensor> out;
  for (auto& w : want) {
    auto t = torch::empty({static_cast<int64_t>(w.size())}, torch::kInt64);
    std::copy(w.begin(), w.end(), t.data_ptr<int64_t>());
    out.push_back(t);
  }
  return out;
}

void bind_window_index(py::module& m) {
  using lsm::cache::WindowIndex;
  py::class_<WindowIndex>(m, "WindowIndex")
      .def(py::init<int64_t, int64_t, int32_t>(), py::arg("num_nodes"), py::arg("start_iteration") = 0,
           py::arg("rebase_after") = WindowIndex::kMaxStoredIteration)
      .def("push",
           [](WindowIndex& w, const torch::Tensor& ids, int rank) {
             check(ids, "ids", torch::kInt64, -1);
             TORCH_CHECK_VALUE(rank >= 0 && rank < 256, "rank must be in 0..255, got ", rank);
             w.push(ids.data_ptr<int64_t>(), ids.numel(), rank);
           },
           py::arg("ids"), py::arg("rank") = 0)
      .def("pop", &WindowIndex::pop)
      .def("__len__", &WindowIndex::size)
      .def_property_readonly("front_iteration", &WindowIndex::front_iteration)
      .def_property_readonly("iteration_base", &WindowIndex::iteration_base,
                             "the iteration first_iteration counts from; it moves before a stored one would "
                             "exceed rebase_after")
      .def_property_readonly("front_offset", &WindowIndex::front_offset,
                             "front_iteration - iteration_base: the front as first_iteration counts it")
      .def_property_readonly("num_nodes", &WindowIndex::num_nodes)
      .def_property_readonly("allocated_bytes", &WindowIndex::allocated_bytes,
                             "bytes held: the per-node arrays, the occurrence ring and the batch list")
      .def_property_readonly_static("bytes_per_node", [](const py::object&) { return WindowIndex::kBytesPerNode; },
                                    "bytes kept for every node of the graph")
      .def_property_readonly("first_iteration", index_view_getter(&WindowIndex::first_iteration, torch::kInt32),
                             "per node: iteration of its first occurrence in the window, counted from "
                             "iteration_base (-1: none); a view")
      .def_property_readonly("first_position", index_view_getter(&WindowIndex::first_position, torch::kInt32),
                             "per node: its position in that batch; a view")
      .def_property_readonly("first_rank", index_view_getter(&WindowIndex::first_rank, torch::kUInt8),
                             "per node: the rank that pushed that batch; a view")
      .def("next_records",
           [](const WindowIndex& w, const torch::Tensor& ids, int64_t limit) {
             check(ids, "ids", torch::kInt64, -1);
             auto out = torch::empty({ids.numel()}, torch::kInt64);
             const int64_t* in = ids.data_ptr<int64_t>();
             int64_t* o = out.data_ptr<int64_t>();
             for (int64_t k = 0; k < ids.numel(); ++k) o[k] = static_cast<int64_t>(w.next_record(in[k], limit));
             return out;
           },
           py::arg("ids"), py::arg("limit"));
}

// The offline bounds and the read-ahead's plan: ops over a trace, not over a cache's lines.
void bind_trace_ops(py::module& m) {
  m.def(
      "belady_min",
      [](const std::vector<torch::Tensor>& batches, int64_t num_nodes, int64_t capacity, int64_t count_from) {
        const auto trace = trace_of(batches);
        py::gil_scoped_release release;
        const auto r = lsm::cache::belady_min(trace, num_nodes, capacity, count_from);
        return std::make_pair(r.hits, r.requests);
      },
      py::arg("batches"), py::arg("num_nodes"), py::arg("capacity"), py::arg("count_from") = 0,
      "Belady's MIN: (hits, requests) for batches of distinct ids, counted from iteration count_from");
  m.def(
      "belady_set_associative",
      [](const std::vector<torch::Tensor>& batches, int64_t num_nodes, int64_t num_sets, int64_t ways,
         int64_t count_from) {
        const auto trace = trace_of(batches);
        py::gil_scoped_release release;
        const auto r = lsm::cache::belady_set_associative(trace, num_nodes, num_sets, ways, count_from);
        return std::make_pair(r.hits, r.requests);
      },
      py::arg("batches"), py::arg("num_nodes"), py::arg("num_sets"), py::arg("ways"), py::arg("count_from") = 0,
      "Belady's MIN per set of a num_sets x ways cache (the cache's set_of): (hits, requests)");
  m.def("ahead_misses", &ahead_misses, py::arg("tags"), py::arg("ways"), py::arg("batches"), py::arg("known"),
        "Per next batch: its sorted distinct ids the cache does not hold, no earlier batch has and known[j] lacks");
}

// The ops over a cache's lines: assign, the victim buffer (PVP) and the window scan.
void bind_line_ops(py::module& m) {
  m.def("cache_assign", &assign, py::arg("tags"), py::arg("records"), py::arg("flags"), py::arg("static_score"),
        py::arg("last_use"), py::arg("rr_pointer"), py::arg("ways"), py::arg("unique"), py::arg("node_static"),
        py::arg("policy"), py::arg("iteration"), py::arg("scan_base"), py::arg("threshold"), py::arg("level_rank"),
        py::arg("queue_room") = py::none(), py::arg("first_iteration") = py::none(),
        py::arg("first_position") = py::none(), py::arg("first_rank") = py::none(), py::arg("front") = 0,
        py::arg("limit") = 0, py::arg("bypass") = false, py::arg("num_threads") = 0);
  m.def("victim_enqueue", &victim_enqueue, py::arg("count"), py::arg("queue_iteration"), py::arg("node"),
        py::arg("record"), py::arg("data"), py::arg("evicted_tag"), py::arg("evicted_record"), py::arg("evicted_line"),
        py::arg("cache_data"), py::arg("iteration"), py::arg("scan_base"), py::arg("num_threads") = 0,
        "PVP: offers one batch's victims to their iteration's queue; returns (enqueued, dropped_no_reuse, dropped_full)");
  m.def("pvp_match", &pvp_match, py::arg("ids"), py::arg("inverse"), py::arg("num_unique"), py::arg("node"),
        py::arg("record"), "PVP serve: (served, entry, position) per distinct id of the batch");
  m.def("pvp_fill", &pvp_fill, py::arg("ids"), py::arg("inverse"), py::arg("hit"), py::arg("line"), py::arg("node"),
        py::arg("record"), py::arg("pf_rows"), py::arg("cache_data"),
        "PVP fill (reinstalling): the prefetched rows of the ids the cache missed into their new lines; "
        "(from_pvp, entry) per distinct id");
  m.def("pvp_scatter", &pvp_scatter, py::arg("rows"), py::arg("cache_data"), py::arg("pf_rows"), py::arg("inverse"),
        py::arg("from_pvp"), py::arg("entry"), py::arg("line") = py::none(),
        "PVP scatter: prefetched rows to every position of their ids and, reinstalling, to their lines");
  m.def("cache_scan", &scan, py::arg("tags"), py::arg("records"), py::arg("flags"), py::arg("first_iteration"),
        py::arg("first_position"), py::arg("first_rank"), py::arg("front"), py::arg("limit"),
        py::arg("num_threads") = 0,
        "The window scan: every valid line's PVP record from a window's per-node first occurrences");
}

}  // namespace

void bind_cache(py::module& m) {
  bind_window_index(m);
  bind_trace_ops(m);
  bind_line_ops(m);
}
