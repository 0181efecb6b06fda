#include "storage/read_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "common/errors.h"

namespace lsm {

namespace {

uint64_t align_down(uint64_t x, uint64_t a) { return x & ~(a - 1); }
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

static_assert((kRowBlock & (kRowBlock - 1)) == 0, "the row block must be a power of two");

}  // namespace

uint64_t max_run_bytes(const FileLayout& layout, uint64_t alignment, uint64_t max_request_bytes) {
  // A run is at most max_request_bytes long (for any smaller alignment too),
  // or as long as the aligned span of its first row: that row's bytes rounded
  // up, plus at most one alignment unit in front.
  return std::max(max_request_bytes, align_up(layout.row_bytes, alignment) + alignment);
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

  // Rows merge at the granularity of a block: with O_DIRECT the device's
  // alignment (or the format's 512-byte block when that is larger), so two
  // rows in one aligned block always share a read.
  const uint64_t block = std::max(alignment, kRowBlock);
  const auto row_begin = [&](uint64_t row) { return layout.data_offset + row * layout.row_stride; };
  size_t t = 0;
  while (t < n) {
    ReadRun run{};
    run.first_row = static_cast<uint64_t>(plan.targets[t].row);
    run.first_target = t;
    const uint64_t begin = row_begin(run.first_row);
    run.file_offset = align_down(begin, alignment);
    uint64_t last_row = run.first_row;
    uint64_t end = begin + layout.row_bytes;  // end of the last row's data
    uint32_t count = 1;
    ++plan.unique_rows;
    ++t;
    while (t < n) {
      const uint64_t row = static_cast<uint64_t>(plan.targets[t].row);
      if (row == last_row) { ++t; continue; }  // duplicate: same run, read once
      const uint64_t row_start = row_begin(row);
      const uint64_t row_end = row_start + layout.row_bytes;
      if (align_down(row_start, block) > align_up(end, block)) break;  // a whole block between: a new read
      // The length limit applies only to a row that makes the read longer: a
      // row inside the run's last aligned unit always joins, so a cut splits
      // no unit between two reads unless a row straddles units and the next
      // starts inside one (strides neither a multiple nor a divisor of the
      // alignment, e.g. 1536 B rows on a 4 KiB device).
      const uint64_t grown = align_up(row_end, alignment);
      if (grown > align_up(end, alignment) && grown - run.file_offset > max_request_bytes) break;
      if (count == std::numeric_limits<uint32_t>::max()) break;
      last_row = row;
      end = row_end;
      ++count;
      ++plan.unique_rows;
      ++t;
    }
    run.end_target = t;
    run.last_row = last_row;
    run.num_rows = count;
    // Never past the end of the file: the last aligned block may be short
    // only when the file itself is not padded, which open() reports.
    run.length = std::min(align_up(end, alignment), align_up(layout.file_bytes, alignment)) - run.file_offset;
    run.skip = begin - run.file_offset;
    run.needed = end - run.file_offset;
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
