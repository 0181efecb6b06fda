#include "storage/read_plan.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/errors.h"

namespace lsm {

namespace {

uint64_t align_down(uint64_t x, uint64_t a) { return x & ~(a - 1); }
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

uint64_t rows_per_run(const FileLayout& layout, uint64_t max_request_bytes) {
  return std::max<uint64_t>(1, max_request_bytes / layout.row_stride);
}

}  // namespace

uint64_t max_run_bytes(const FileLayout& layout, uint64_t alignment, uint64_t max_request_bytes) {
  // A run of k rows starting anywhere spans at most k*stride bytes plus one
  // alignment unit on each side.
  return align_up(rows_per_run(layout, max_request_bytes) * layout.row_stride, alignment) + alignment;
}

ReadPlan make_read_plan(const int64_t* ids, size_t n, const FileLayout& layout,
                        uint64_t alignment, uint64_t max_request_bytes) {
  ReadPlan plan;
  plan.targets.resize(n);
  const int64_t num_rows = static_cast<int64_t>(layout.num_rows);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= num_rows) {
      throw std::out_of_range(cat("node id ", id, " at position ", i, " is out of range: the feature file has ",
                                  num_rows, " rows (valid ids are 0..", num_rows - 1, ")"));
    }
    plan.targets[i] = ReadTarget{id, static_cast<int64_t>(i)};
  }
  std::sort(plan.targets.begin(), plan.targets.end(),
            [](const ReadTarget& a, const ReadTarget& b) { return a.row < b.row; });

  const uint64_t max_rows = rows_per_run(layout, max_request_bytes);
  size_t t = 0;
  while (t < n) {
    ReadRun run{};
    run.first_row = static_cast<uint64_t>(plan.targets[t].row);
    run.first_target = t;
    uint64_t last_row = run.first_row;
    uint32_t count = 1;
    ++plan.unique_rows;
    ++t;
    while (t < n) {
      const uint64_t row = static_cast<uint64_t>(plan.targets[t].row);
      if (row == last_row) { ++t; continue; }                 // duplicate: same run, read once
      if (row != last_row + 1 || count >= max_rows) break;    // gap or run full
      last_row = row;
      ++count;
      ++plan.unique_rows;
      ++t;
    }
    run.end_target = t;
    run.num_rows = count;
    const uint64_t begin = layout.data_offset + run.first_row * layout.row_stride;
    const uint64_t end = layout.data_offset + last_row * layout.row_stride + layout.row_bytes;
    run.file_offset = align_down(begin, alignment);
    // Never past the end of the file: the last aligned block may be short
    // only when the file itself is not padded, which open() reports.
    run.length = std::min(align_up(end, alignment), align_up(layout.file_bytes, alignment)) - run.file_offset;
    run.skip = begin - run.file_offset;
    plan.bytes_read += run.length;
    plan.runs.push_back(run);
  }
  return plan;
}

void scatter_run(const ReadPlan& plan, const ReadRun& run, const uint8_t* buffer,
                 const FileLayout& layout, uint8_t* out) {
  const uint8_t* base = buffer + run.skip;
  for (size_t t = run.first_target; t < run.end_target; ++t) {
    const ReadTarget& target = plan.targets[t];
    const uint64_t rel = static_cast<uint64_t>(target.row) - run.first_row;
    std::memcpy(out + static_cast<uint64_t>(target.position) * layout.row_bytes,
                base + rel * layout.row_stride, layout.row_bytes);
  }
}

}  // namespace lsm
