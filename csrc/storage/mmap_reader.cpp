// mmap backend: the baseline an out-of-core user gets from np.memmap, here
// with the same planning (sorted, coalesced) so the comparison isolates the
// page-fault path. bytes_read counts the 4 KiB pages touched; kernel
// readahead may fetch more.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "common/errors.h"
#include "storage/row_reader.h"

namespace lsm {

namespace {

ReaderOptions buffered(ReaderOptions options) {
  options.direct = false;  // O_DIRECT has no meaning for a mapping
  return options;
}

class MmapReader final : public RowReader {
 public:
  MmapReader(const std::string& path, const FileLayout& layout, const ReaderOptions& options)
      : RowReader(path, layout, buffered(options)) {
    alignment_ = 4096;
    if (layout_.file_bytes > 0) {
      map_ = mmap(nullptr, layout_.file_bytes, PROT_READ, MAP_SHARED, fd_, 0);
      if (map_ == MAP_FAILED) throw_errno(errno, cat("mmap of ", path_, " failed"));
      madvise(map_, layout_.file_bytes, MADV_RANDOM);
    }
  }
  ~MmapReader() override {
    if (map_ && map_ != MAP_FAILED) munmap(map_, layout_.file_bytes);
  }

  std::string backend() const override { return "mmap"; }

 protected:
  void execute(const ReadPlan& plan, uint8_t* out) override {
    const auto* base = static_cast<const uint8_t*>(map_);
    const int64_t num_runs = static_cast<int64_t>(plan.runs.size());
#pragma omp parallel for schedule(dynamic, 16) num_threads(options_.queue_depth) if (num_runs > 64)
    for (int64_t r = 0; r < num_runs; ++r) {
      scatter_run(plan, plan.runs[r], base + plan.runs[r].file_offset, layout_, out);
    }
  }

 private:
  void* map_ = nullptr;
};

}  // namespace

std::unique_ptr<RowReader> make_mmap_reader(const std::string& path, const FileLayout& layout,
                                            const ReaderOptions& options) {
  return std::make_unique<MmapReader>(path, layout, options);
}

}  // namespace lsm
