// pread backend: an OpenMP team of queue_depth threads, each issuing one
// blocking read at a time into its own aligned buffer. The fallback where
// io_uring is unavailable; with enough threads it keeps as many reads in
// flight as the ring does.
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>

#include "common/errors.h"
#include "storage/row_reader.h"

namespace lsm {

namespace {

class PreadReader final : public RowReader {
 public:
  PreadReader(const std::string& path, const FileLayout& layout, const ReaderOptions& options)
      : RowReader(path, layout, options) {
    buffer_bytes_ = max_run_bytes(layout_, std::max<uint64_t>(alignment_, 4096), options_.max_request_bytes);
  }

  std::string backend() const override { return "pread"; }

 protected:
  void execute(const ReadPlan& plan, uint8_t* out) override {
    const int64_t num_runs = static_cast<int64_t>(plan.runs.size());
    const int threads = static_cast<int>(std::min<int64_t>(options_.queue_depth, num_runs));
    std::atomic<uint64_t> requests{0};
    std::exception_ptr error;
    std::mutex error_mutex;
#pragma omp parallel num_threads(threads)
    {
      uint8_t* buffer = alloc_aligned(buffer_bytes_, 4096);
      uint64_t local_requests = 0;
#pragma omp for schedule(dynamic, 1)
      for (int64_t r = 0; r < num_runs; ++r) {
        try {
          const ReadRun& run = plan.runs[r];
          uint64_t done = 0;
          while (done < run.needed) {
            ++local_requests;
            const ssize_t got = ::pread(fd_, buffer + done, run.length - done, static_cast<off_t>(run.file_offset + done));
            if (got < 0) {
              if (errno == EINTR || errno == EAGAIN) continue;
              throw_errno(errno, cat("pread of ", run.length - done, " bytes at offset ", run.file_offset + done,
                                     " from ", path_, " failed"));
            }
            if (got == 0) {
              throw std::runtime_error(cat("unexpected end of file reading ", path_, " at offset ",
                                           run.file_offset + done, ": the feature file shrank while open"));
            }
            done += static_cast<uint64_t>(got);
          }
          scatter_run(plan, run, buffer, layout_, out);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
      free(buffer);
      requests.fetch_add(local_requests, std::memory_order_relaxed);
    }
    if (error) std::rethrow_exception(error);
    // The base class counts one request per run; add the retries.
    const uint64_t issued = requests.load(std::memory_order_relaxed);
    if (issued > plan.runs.size()) counters_.requests.fetch_add(issued - plan.runs.size(), std::memory_order_relaxed);
  }

 private:
  uint64_t buffer_bytes_ = 0;
};

}  // namespace

std::unique_ptr<RowReader> make_pread_reader(const std::string& path, const FileLayout& layout,
                                             const ReaderOptions& options) {
  return std::make_unique<PreadReader>(path, layout, options);
}

}  // namespace lsm
