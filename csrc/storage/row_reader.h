// The storage engine's interface: read a batch of rows of a fixed-stride file
// into a caller buffer, in request order. Backends differ only in how they
// execute a ReadPlan (io_uring, a pread thread pool, mmap); validation,
// planning and counters live here once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "storage/read_plan.h"

namespace lsm {

struct ReaderOptions {
  int queue_depth = 64;               // reads in flight (io_uring) or threads (pread)
  bool direct = true;                 // O_DIRECT; falls back to buffered I/O where refused
  uint64_t max_request_bytes = 128 * 1024;
};

// Monotonic counters; all updates are relaxed atomics because readers only
// need eventually consistent totals, never ordering against the data.
struct ReaderCounters {
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> rows{0};          // rows requested (with duplicates)
  std::atomic<uint64_t> unique_rows{0};
  std::atomic<uint64_t> requests{0};      // read requests issued to the OS
  std::atomic<uint64_t> bytes_read{0};    // bytes transferred from the file
  std::atomic<uint64_t> bytes_useful{0};  // unique_rows * row_bytes
  std::atomic<uint64_t> total_ns{0};
  std::atomic<uint64_t> last_batch_ns{0};
  std::atomic<uint64_t> max_batch_ns{0};
  // Time with at least one read in flight: reads on several threads (a cache's read-ahead beside its own
  // misses) overlap, so their total_ns can exceed the wall time the storage was busy.
  std::atomic<uint64_t> busy_ns{0};
};

class RowReader {
 public:
  RowReader(std::string path, FileLayout layout, ReaderOptions options);
  virtual ~RowReader();
  RowReader(const RowReader&) = delete;
  RowReader& operator=(const RowReader&) = delete;

  // Reads rows ids[0..n) into out: row i at out + i * row_bytes (n * row_bytes bytes), or with slots at
  // out + slots[i] * row_bytes (a cache's misses straight into their lines). Thread-safe.
  void read(const int64_t* ids, size_t n, uint8_t* out, const int64_t* slots = nullptr);

  const FileLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  uint64_t alignment() const { return alignment_; }
  virtual std::string backend() const = 0;
  // io_uring: whether staging buffers are registered with the ring (a low
  // RLIMIT_MEMLOCK refuses them and reads fall back to plain IORING_OP_READ).
  virtual bool registered_buffers() const { return false; }
  const ReaderCounters& counters() const { return counters_; }
  void reset_counters();

 protected:
  // Executes the plan: reads every run and scatters its rows into out.
  virtual void execute(const ReadPlan& plan, uint8_t* out) = 0;

  std::string path_;
  FileLayout layout_;
  ReaderOptions options_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t alignment_ = 1;
  ReaderCounters counters_;

 private:
  // Busy time as a union of intervals: the first read in starts it, the last one out adds it.
  void enter_busy();
  void leave_busy();
  std::mutex busy_mutex_;
  int in_flight_ = 0;
  uint64_t busy_since_ns_ = 0;
};

// Factory by backend name: "io_uring", "pread", "mmap". Raises
// std::invalid_argument for an unknown name and std::system_error when the
// kernel refuses the backend (io_uring disabled, for example).
std::unique_ptr<RowReader> make_row_reader(const std::string& backend, const std::string& path,
                                           const FileLayout& layout, const ReaderOptions& options);

// Whether this kernel lets the process create an io_uring instance.
bool io_uring_available();

// Aligned allocation for O_DIRECT buffers, freed with free().
uint8_t* alloc_aligned(uint64_t bytes, uint64_t alignment);

// Backend constructors (one file each).
std::unique_ptr<RowReader> make_io_uring_reader(const std::string& path, const FileLayout& layout,
                                                const ReaderOptions& options);
std::unique_ptr<RowReader> make_pread_reader(const std::string& path, const FileLayout& layout,
                                             const ReaderOptions& options);
std::unique_ptr<RowReader> make_mmap_reader(const std::string& path, const FileLayout& layout,
                                            const ReaderOptions& options);

}  // namespace lsm
