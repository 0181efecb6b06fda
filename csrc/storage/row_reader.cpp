#include "storage/row_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>

#include "common/errors.h"

namespace lsm {

namespace {

// The file's O_DIRECT offset alignment from statx (Linux 6.1+); 4096 when the
// kernel or headers cannot tell, which satisfies every device with logical
// blocks of at most 4 KiB.
uint64_t direct_io_alignment(int fd) {
#if defined(STATX_DIOALIGN) && defined(SYS_statx)
  struct statx stx {};
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align > 0) {
    return std::max<uint64_t>({uint64_t{stx.stx_dio_offset_align}, uint64_t{stx.stx_dio_mem_align}, uint64_t{512}});
  }
#endif
  (void)fd;
  return 4096;
}

void atomic_max(std::atomic<uint64_t>& target, uint64_t value) {
  uint64_t seen = target.load(std::memory_order_relaxed);
  while (seen < value && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

uint8_t* alloc_aligned(uint64_t bytes, uint64_t alignment) {
  void* p = nullptr;
  if (posix_memalign(&p, std::max<uint64_t>(alignment, sizeof(void*)), std::max<uint64_t>(bytes, 1)) != 0) {
    throw std::bad_alloc();
  }
  return static_cast<uint8_t*>(p);
}

RowReader::RowReader(std::string path, FileLayout layout, ReaderOptions options)
    : path_(std::move(path)), layout_(layout), options_(options) {
  LSM_CHECK_ARG(layout_.row_stride > 0 && layout_.row_bytes > 0 && layout_.row_bytes <= layout_.row_stride,
                "invalid row layout for ", path_, ": row_bytes=", layout_.row_bytes, " row_stride=", layout_.row_stride);
  LSM_CHECK_ARG(options_.queue_depth >= 1 && options_.queue_depth <= 4096, "queue_depth must be in 1..4096, got ",
                options_.queue_depth);
  if (options_.direct) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    // tmpfs and some network file systems refuse O_DIRECT with EINVAL: fall
    // back to buffered reads rather than failing; direct() reports it.
    direct_ = fd_ >= 0;
  }
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  LSM_CHECK_SYSCALL(fd_, "cannot open feature file ", path_);
  struct stat st {};
  LSM_CHECK_SYSCALL(::fstat(fd_, &st), "cannot stat feature file ", path_);
  layout_.file_bytes = static_cast<uint64_t>(st.st_size);
  const uint64_t needed = layout_.num_rows == 0 ? 0
                              : layout_.data_offset + (layout_.num_rows - 1) * layout_.row_stride + layout_.row_bytes;
  if (layout_.file_bytes < needed) {
    ::close(fd_);
    throw std::runtime_error(cat("feature file ", path_, " is truncated: ", layout_.file_bytes, " bytes, but ",
                                 layout_.num_rows, " rows of stride ", layout_.row_stride, " need ", needed,
                                 " bytes; re-create the dataset (lsm-gnn prepare)"));
  }
  alignment_ = direct_ ? direct_io_alignment(fd_) : 1;
}

RowReader::~RowReader() {
  if (fd_ >= 0) ::close(fd_);
}

void RowReader::reset_counters() {
  for (auto* c : {&counters_.batches, &counters_.rows, &counters_.unique_rows, &counters_.requests,
                  &counters_.bytes_read, &counters_.bytes_useful, &counters_.total_ns, &counters_.last_batch_ns,
                  &counters_.max_batch_ns, &counters_.busy_ns}) {
    c->store(0, std::memory_order_relaxed);
  }
}

static uint64_t steady_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void RowReader::enter_busy() {
  std::lock_guard<std::mutex> lock(busy_mutex_);
  if (in_flight_++ == 0) busy_since_ns_ = steady_ns();
}

void RowReader::leave_busy() {
  std::lock_guard<std::mutex> lock(busy_mutex_);
  if (--in_flight_ == 0) counters_.busy_ns.fetch_add(steady_ns() - busy_since_ns_, std::memory_order_relaxed);
}

void RowReader::read(const int64_t* ids, size_t n, uint8_t* out, const int64_t* slots) {
  const auto start = std::chrono::steady_clock::now();
  ReadPlan plan = make_read_plan(ids, n, layout_, alignment_, options_.max_request_bytes);
  if (slots != nullptr) {  // every backend scatters rows to their targets' positions: make those the slots
    for (ReadTarget& target : plan.targets) target.position = slots[target.position];
  }
  if (n > 0) {
    struct Busy {
      RowReader* self;
      ~Busy() { self->leave_busy(); }
    };
    enter_busy();
    Busy busy{this};
    execute(plan, out);
  }
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  counters_.rows.fetch_add(n, std::memory_order_relaxed);
  counters_.unique_rows.fetch_add(plan.unique_rows, std::memory_order_relaxed);
  counters_.bytes_useful.fetch_add(plan.unique_rows * layout_.row_bytes, std::memory_order_relaxed);
  counters_.requests.fetch_add(plan.runs.size(), std::memory_order_relaxed);
  counters_.bytes_read.fetch_add(plan.bytes_read, std::memory_order_relaxed);
  counters_.total_ns.fetch_add(ns, std::memory_order_relaxed);
  counters_.last_batch_ns.store(ns, std::memory_order_relaxed);
  atomic_max(counters_.max_batch_ns, ns);
}

std::unique_ptr<RowReader> make_row_reader(const std::string& backend, const std::string& path,
                                           const FileLayout& layout, const ReaderOptions& options) {
  if (backend == "io_uring") return make_io_uring_reader(path, layout, options);
  if (backend == "pread") return make_pread_reader(path, layout, options);
  if (backend == "mmap") return make_mmap_reader(path, layout, options);
  throw std::invalid_argument(cat("unknown native storage backend '", backend,
                                  "'; valid names are io_uring, pread, mmap"));
}

}  // namespace lsm
