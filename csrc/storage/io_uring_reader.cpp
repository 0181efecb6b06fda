// io_uring backend over the kernel's own interface (<linux/io_uring.h> and raw
// syscalls), so it builds and runs where liburing is not installed. Each
// in-flight read owns one slot of a staging arena registered with the ring
// (IORING_OP_READ_FIXED); completed slots are scattered to the caller's
// output while later reads are still in flight.
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/errors.h"
#include "storage/row_reader.h"

namespace lsm {

namespace {

int sys_io_uring_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}
int sys_io_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}
int sys_io_uring_register(int fd, unsigned opcode, const void* arg, unsigned nr_args) {
  return static_cast<int>(syscall(__NR_io_uring_register, fd, opcode, arg, nr_args));
}

// One ring with its staging slots. Used by one thread at a time.
class Ring {
 public:
  Ring(int file_fd, unsigned depth, uint64_t slot_bytes, uint64_t alignment) : depth_(depth), slot_bytes_(slot_bytes) {
    io_uring_params params{};
    ring_fd_ = sys_io_uring_setup(depth, &params);
    LSM_CHECK_SYSCALL(ring_fd_, "io_uring_setup(", depth, ") failed; the kernel may have io_uring disabled "
                      "(sysctl kernel.io_uring_disabled) - use backend='pread'");
    sq_entries_ = params.sq_entries;
    const size_t sq_bytes = params.sq_off.array + params.sq_entries * sizeof(unsigned);
    const size_t cq_bytes = params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe);
    single_mmap_ = (params.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single_mmap_) sq_map_bytes_ = cq_map_bytes_ = std::max(sq_bytes, cq_bytes);
    else { sq_map_bytes_ = sq_bytes; cq_map_bytes_ = cq_bytes; }
    sq_map_ = map(sq_map_bytes_, IORING_OFF_SQ_RING);
    cq_map_ = single_mmap_ ? sq_map_ : map(cq_map_bytes_, IORING_OFF_CQ_RING);
    sqes_bytes_ = params.sq_entries * sizeof(io_uring_sqe);
    sqes_ = static_cast<io_uring_sqe*>(map(sqes_bytes_, IORING_OFF_SQES));

    auto* sq = static_cast<uint8_t*>(sq_map_);
    sq_head_ = reinterpret_cast<unsigned*>(sq + params.sq_off.head);
    sq_tail_ = reinterpret_cast<unsigned*>(sq + params.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(sq + params.sq_off.ring_mask);
    sq_array_ = reinterpret_cast<unsigned*>(sq + params.sq_off.array);
    auto* cq = static_cast<uint8_t*>(cq_map_);
    cq_head_ = reinterpret_cast<unsigned*>(cq + params.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(cq + params.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(cq + params.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + params.cq_off.cqes);

    arena_ = alloc_aligned(slot_bytes_ * depth_, alignment);
    std::vector<iovec> iov(depth_);
    for (unsigned i = 0; i < depth_; ++i) iov[i] = iovec{arena_ + i * slot_bytes_, slot_bytes_};
    // Registered buffers skip per-read page pinning; a low RLIMIT_MEMLOCK on
    // old kernels refuses them, and plain IORING_OP_READ still works.
    fixed_buffers_ = sys_io_uring_register(ring_fd_, IORING_REGISTER_BUFFERS, iov.data(), depth_) == 0;
    fixed_file_ = sys_io_uring_register(ring_fd_, IORING_REGISTER_FILES, &file_fd, 1) == 0;
    file_fd_ = file_fd;
  }

  ~Ring() {
    if (sqes_) munmap(sqes_, sqes_bytes_);
    if (cq_map_ && !single_mmap_) munmap(cq_map_, cq_map_bytes_);
    if (sq_map_) munmap(sq_map_, sq_map_bytes_);
    if (ring_fd_ >= 0) close(ring_fd_);  // closing the ring also unregisters buffers and files
    free(arena_);
  }

  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  bool fixed_buffers() const { return fixed_buffers_; }

  // Reads every run of the plan, keeping up to depth_ reads in flight.
  // Returns the number of read requests issued (more than runs on short reads).
  uint64_t execute(const ReadPlan& plan, const FileLayout& layout, uint8_t* out) {
    struct Slot {
      size_t run = 0;
      uint64_t done = 0;  // bytes of the run already read into the slot
    };
    std::vector<Slot> slots(depth_);
    std::vector<unsigned> free_slots;
    free_slots.reserve(depth_);
    for (unsigned i = depth_; i-- > 0;) free_slots.push_back(i);

    size_t next_run = 0, finished = 0, pending_submit = 0;
    unsigned in_flight = 0;
    uint64_t requests = 0;
    const size_t num_runs = plan.runs.size();
    while (finished < num_runs) {
      while (next_run < num_runs && !free_slots.empty()) {
        const unsigned s = free_slots.back();
        free_slots.pop_back();
        slots[s] = Slot{next_run++, 0};
        push_read(s, plan.runs[slots[s].run], 0);
        ++pending_submit;
        ++requests;
      }
      // Submit what is queued and wait for at least one completion.
      const unsigned wait = in_flight + pending_submit > 0 ? 1 : 0;
      int rc = sys_io_uring_enter(ring_fd_, static_cast<unsigned>(pending_submit), wait, IORING_ENTER_GETEVENTS);
      if (rc < 0) {
        // Interrupted or the kernel is short of resources: nothing was
        // submitted; reap what has completed and try again.
        if (errno != EINTR && errno != EAGAIN && errno != EBUSY) throw_errno(errno, "io_uring_enter failed");
        rc = 0;
      }
      in_flight += static_cast<unsigned>(rc);
      pending_submit -= static_cast<size_t>(rc);

      // Acquire pairs with the kernel's release store of the CQ tail, so the
      // CQEs and the data they describe are visible before we read them.
      unsigned head = *cq_head_;
      const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
      for (; head != tail; ++head) {
        const io_uring_cqe& cqe = cqes_[head & cq_mask_];
        const unsigned s = static_cast<unsigned>(cqe.user_data);
        const int res = cqe.res;
        --in_flight;
        Slot& slot = slots[s];
        const ReadRun& run = plan.runs[slot.run];
        if (res < 0) {
          if (res == -EAGAIN || res == -EINTR) {
            push_read(s, run, slot.done);
            ++pending_submit;
            ++requests;
            continue;
          }
          // Release what we consumed before unwinding so the ring stays usable.
          __atomic_store_n(cq_head_, head + 1, __ATOMIC_RELEASE);
          drain(in_flight);
          throw_errno(-res, cat("io_uring read of ", run.length, " bytes at offset ", run.file_offset, " failed"));
        }
        slot.done += static_cast<uint64_t>(res);
        if (slot.done >= run.needed) {
          scatter_run(plan, run, arena_ + static_cast<uint64_t>(s) * slot_bytes_, layout, out);
          free_slots.push_back(s);
          ++finished;
        } else if (res == 0) {
          __atomic_store_n(cq_head_, head + 1, __ATOMIC_RELEASE);
          drain(in_flight);
          throw std::runtime_error(cat("unexpected end of file reading ", run.length, " bytes at offset ",
                                       run.file_offset, ": the feature file shrank while open"));
        } else {  // short read: ask for the rest
          push_read(s, run, slot.done);
          ++pending_submit;
          ++requests;
        }
      }
      // Release hands the consumed CQ slots back to the kernel.
      __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
    }
    return requests;
  }

 private:
  void* map(size_t bytes, off_t offset) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd_, offset);
    if (p == MAP_FAILED) throw_errno(errno, "mmap of the io_uring rings failed");
    return p;
  }

  void push_read(unsigned slot, const ReadRun& run, uint64_t done) {
    const unsigned tail = *sq_tail_;
    const unsigned index = tail & sq_mask_;
    io_uring_sqe* sqe = &sqes_[index];
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = fixed_buffers_ ? IORING_OP_READ_FIXED : IORING_OP_READ;
    sqe->fd = fixed_file_ ? 0 : file_fd_;
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    sqe->addr = reinterpret_cast<uint64_t>(arena_ + static_cast<uint64_t>(slot) * slot_bytes_ + done);
    sqe->len = static_cast<uint32_t>(run.length - done);
    sqe->off = run.file_offset + done;
    sqe->buf_index = fixed_buffers_ ? static_cast<uint16_t>(slot) : 0;
    sqe->user_data = slot;
    sq_array_[index] = index;
    // Release publishes the SQE before the kernel can see the new tail.
    __atomic_store_n(sq_tail_, tail + 1, __ATOMIC_RELEASE);
  }

  // After an error: wait for reads still in flight so no completion later
  // writes into a slot of a batch that has been abandoned.
  void drain(unsigned in_flight) {
    while (in_flight > 0) {
      if (sys_io_uring_enter(ring_fd_, 0, 1, IORING_ENTER_GETEVENTS) < 0 && errno != EINTR) break;
      unsigned head = *cq_head_;
      const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
      for (; head != tail; ++head) --in_flight;
      __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
    }
  }

  unsigned depth_;
  uint64_t slot_bytes_;
  int ring_fd_ = -1;
  int file_fd_ = -1;
  unsigned sq_entries_ = 0;
  bool single_mmap_ = false;
  bool fixed_buffers_ = false;
  bool fixed_file_ = false;
  void* sq_map_ = nullptr;
  void* cq_map_ = nullptr;
  size_t sq_map_bytes_ = 0, cq_map_bytes_ = 0, sqes_bytes_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_array_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  uint8_t* arena_ = nullptr;
};

class IoUringReader final : public RowReader {
 public:
  IoUringReader(const std::string& path, const FileLayout& layout, const ReaderOptions& options)
      : RowReader(path, layout, options) {
    slot_bytes_ = max_run_bytes(layout_, std::max<uint64_t>(alignment_, 4096), options_.max_request_bytes);
    // Create the first ring now so an io_uring refusal surfaces at open time.
    idle_.push_back(std::make_unique<Ring>(fd_, options_.queue_depth, slot_bytes_, 4096));
    registered_ = idle_.back()->fixed_buffers();
  }

  std::string backend() const override { return "io_uring"; }
  bool registered_buffers() const override { return registered_; }

 protected:
  void execute(const ReadPlan& plan, uint8_t* out) override {
    // Each concurrent caller takes a ring of its own; rings are reused.
    std::unique_ptr<Ring> ring;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        ring = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (!ring) ring = std::make_unique<Ring>(fd_, options_.queue_depth, slot_bytes_, 4096);
    struct Return {
      IoUringReader* self;
      std::unique_ptr<Ring>& ring;
      ~Return() {
        if (!ring) return;
        std::lock_guard<std::mutex> lock(self->mutex_);
        self->idle_.push_back(std::move(ring));
      }
    } give_back{this, ring};
    uint64_t requests = 0;
    try {
      requests = ring->execute(plan, layout_, out);
    } catch (...) {
      ring.reset();  // a failed ring may hold unsubmitted entries: never reuse it
      throw;
    }
    const uint64_t extra = requests - plan.runs.size();
    if (extra) counters_.requests.fetch_add(extra, std::memory_order_relaxed);
  }

 private:
  uint64_t slot_bytes_ = 0;
  bool registered_ = false;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Ring>> idle_;
};

}  // namespace

bool io_uring_available() {
  io_uring_params params{};
  const int fd = sys_io_uring_setup(1, &params);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::unique_ptr<RowReader> make_io_uring_reader(const std::string& path, const FileLayout& layout,
                                                const ReaderOptions& options) {
  return std::make_unique<IoUringReader>(path, layout, options);
}

}  // namespace lsm
