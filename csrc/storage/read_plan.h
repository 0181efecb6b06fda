// Turns a batch of row ids into a read plan: ids sorted and deduplicated,
// rows whose blocks touch coalesced into runs, each run widened to the
// O_DIRECT alignment. The plan also keeps, for every distinct row, the
// output slots that want it, so duplicates are read once and copied many
// times.
//
// Rows need not be consecutive to share a run: a packed file holds several
// rows per 512-byte block (stride a power of two below 512), and any rows
// whose blocks are the same or adjacent are served by one read, so no block
// is read twice in one batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lsm {

// The format's block (lsm_gnn/data/format.py ROW_ALIGNMENT): packed rows never
// straddle one, and rows in the same or adjacent blocks share a read even
// when the reads need no alignment (buffered I/O).
constexpr uint64_t kRowBlock = 512;

struct FileLayout {
  uint64_t num_rows = 0;    // rows in the file
  uint64_t row_bytes = 0;   // useful bytes per row (what the caller gets)
  uint64_t row_stride = 0;  // distance between rows in the file
  uint64_t data_offset = 0; // byte offset of row 0
  uint64_t file_bytes = 0;  // file size; no read goes past it
};

// One contiguous read from the file, serving num_rows distinct rows in
// [first_row, last_row] (not necessarily consecutive).
struct ReadRun {
  uint64_t first_row;
  uint64_t last_row;
  uint32_t num_rows;     // distinct rows served
  uint64_t file_offset;  // aligned start of the read
  uint64_t length;       // aligned length of the read
  uint64_t skip;         // bytes between file_offset and first_row's data
  uint64_t needed;       // bytes from file_offset to the end of last_row's data: a read may stop here
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
// position) and builds the plan. `alignment` is a power of two. A run grows
// by the next row while that row's block (max(alignment, kRowBlock) bytes)
// starts no later than the end of the run's last block, and while the run's
// aligned length stays within max_request_bytes (checked only for rows that
// lengthen the read); a run of one row may be longer (its aligned length),
// never a run of several. Runs never share an aligned unit when the stride
// is a multiple or a divisor of the alignment (every packed layout, and every
// layout of the format read at 512 B alignment); otherwise a run cut at
// max_request_bytes may share one unit with the next.
ReadPlan make_read_plan(const int64_t* ids, size_t n, const FileLayout& layout,
                        uint64_t alignment, uint64_t max_request_bytes);

// Largest aligned length any run of this plan configuration can have, for
// every alignment that divides `alignment`; the size of one staging buffer.
uint64_t max_run_bytes(const FileLayout& layout, uint64_t alignment, uint64_t max_request_bytes);

// Copies the rows of `run` from `buffer` (holding the run's aligned read) to
// their output slots in `out` (row_bytes per slot), each from its own offset.
void scatter_run(const ReadPlan& plan, const ReadRun& run, const uint8_t* buffer,
                 const FileLayout& layout, uint8_t* out);

}  // namespace lsm
