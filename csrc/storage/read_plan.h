// Turns a batch of row ids into a read plan: ids sorted and deduplicated,
// adjacent rows coalesced into runs, each run widened to the O_DIRECT
// alignment. The plan also keeps, for every distinct row, the output slots
// that want it, so duplicates are read once and copied many times.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lsm {

struct FileLayout {
  uint64_t num_rows = 0;    // rows in the file
  uint64_t row_bytes = 0;   // useful bytes per row (what the caller gets)
  uint64_t row_stride = 0;  // distance between rows in the file
  uint64_t data_offset = 0; // byte offset of row 0
  uint64_t file_bytes = 0;  // file size; no read goes past it
};

// One contiguous read from the file: rows [first_row, first_row + num_rows).
struct ReadRun {
  uint64_t first_row;
  uint32_t num_rows;
  uint64_t file_offset;  // aligned start of the read
  uint64_t length;       // aligned length of the read
  uint64_t skip;         // bytes between file_offset and first_row's data
  size_t first_target;   // targets of this run: [first_target, end_target)
  size_t end_target;
};

// A (row, output position) pair; targets are sorted by row.
struct ReadTarget {
  int64_t row;
  int64_t position;
};

struct ReadPlan {
  std::vector<ReadTarget> targets;
  std::vector<ReadRun> runs;
  uint64_t bytes_read = 0;    // sum of aligned run lengths
  uint64_t unique_rows = 0;
};

// Validates ids (raises std::out_of_range naming the first bad id and its
// position) and builds the plan. `alignment` is a power of two; runs are cut
// so no read is longer than max(max_request_bytes, one aligned row).
ReadPlan make_read_plan(const int64_t* ids, size_t n, const FileLayout& layout,
                        uint64_t alignment, uint64_t max_request_bytes);

// Largest aligned length any run of this plan configuration can have; the
// size of one staging buffer.
uint64_t max_run_bytes(const FileLayout& layout, uint64_t alignment, uint64_t max_request_bytes);

// Copies the rows of `run` from `buffer` (holding the run's aligned read) to
// their output slots in `out` (row_bytes per slot).
void scatter_run(const ReadPlan& plan, const ReadRun& run, const uint8_t* buffer,
                 const FileLayout& layout, uint8_t* out);

}  // namespace lsm
