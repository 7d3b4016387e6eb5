#include "ckpt/sink.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <system_error>
#include <thread>

#include "ckpt/error.h"
#include "io/direct_stage.h"
#include "io/temporaries.h"

namespace ckpt {

namespace {

// The slices of a write_sliced() block that starts at sink position `start`: cut where the
// position is a multiple of `slice`.
struct Slices {
  uint64_t lead;  // start % slice: how far the block starts into its first slice's span
  uint64_t size, slice;
  uint64_t count() const { return size == 0 ? 0 : (lead + size + slice - 1) / slice; }
  uint64_t begin(uint64_t i) const { return i == 0 ? 0 : i * slice - lead; }
  uint64_t end(uint64_t i) const { return std::min(size, (i + 1) * slice - lead); }
};

}  // namespace

void ByteSink::write_sliced(std::span<const std::byte> bytes, size_t slice,
                            const SliceVisitor& visit) {
  if (slice == 0)
    throw Error(ErrorCode::kInvalidArgument, "write_sliced with slices of 0 bytes", name());
  const Slices s{position() % slice, bytes.size(), slice};
  for (uint64_t i = 0; i < s.count(); ++i) {
    auto piece = bytes.subspan(s.begin(i), s.end(i) - s.begin(i));
    visit(i, s.begin(i), piece);
    write(piece);
  }
}

void MemorySink::write(std::span<const std::byte> bytes) {
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

void MemorySink::patch(uint64_t offset, std::span<const std::byte> bytes) {
  if (offset > buf_.size() || bytes.size() > buf_.size() - offset)
    throw Error(ErrorCode::kInvalidArgument, "patch past the written bytes", name_, {}, offset);
  std::memcpy(buf_.data() + offset, bytes.data(), bytes.size());
}

namespace {

using io::base_of;
using io::dir_of;

// Waits until `a` differs from `old` and returns its value. It spins for up to ~200 us before
// sleeping on the futex: write_sliced hands blocks over one after another with microseconds
// between them, and waking a sleeping thread cost tens of microseconds here (a VM), per block.
uint32_t await_change(const std::atomic<uint32_t>& a, uint32_t old) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + std::chrono::microseconds(200);
  for (uint32_t i = 1;; ++i) {
    uint32_t v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    if (i % 64 == 0 && Clock::now() > give_up) break;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  a.wait(old, std::memory_order_acquire);
  return a.load(std::memory_order_acquire);
}

// A second thread for FileSink::write_sliced, kept for the sink's life: starting a thread per
// block costs ~35 us here, ~9 ms over the 256 storages of a 1 GiB save.
class Helper {
 public:
  Helper() : thread_([this] { loop(); }) {}
  ~Helper() {
    stop_.store(true);
    gen_.fetch_add(1, std::memory_order_release);
    gen_.notify_one();
    thread_.join();
  }
  // Runs job(0) on the calling thread and job(1) on the helper; returns when both have.
  // `job` must not throw.
  void run_pair(const std::function<void(unsigned)>& job) {
    job_ = &job;
    const uint32_t g = gen_.fetch_add(1, std::memory_order_release) + 1;
    gen_.notify_one();
    job(0);
    for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != g;) await_change(done_, d);
    job_ = nullptr;
  }

 private:
  void loop() {
    uint32_t seen = 0;
    for (;;) {
      seen = await_change(gen_, seen);
      if (stop_.load()) return;
      (*job_)(1);
      done_.store(seen, std::memory_order_release);
      done_.notify_one();
    }
  }

  std::atomic<uint32_t> gen_{0}, done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(unsigned)>* job_ = nullptr;
  std::thread thread_;  // last: starts once the rest is initialized
};

class FileSink final : public ByteSink {
 public:
  FileSink(std::string path, FileSinkOptions opt) : path_(std::move(path)), opt_(opt) {
    if (opt_.atomic) {
      // Debris of writers killed before they could clean up (io/temporaries.h). A live writer
      // holds an exclusive flock on its temporary from the moment it exists (well, microseconds
      // later) until it commits or removes it; the kernel drops the lock when a process dies.
      io::sweep_stale_temporaries(dir_of(path_), base_of(path_));
      io::Temporary t;
      try {
        // "<dir>/.<name>.tmp-XXXXXX", registered for remove_temporaries_now(); the umask applies.
        t = io::create_temporary(dir_of(path_), base_of(path_), false,
                                 opt_.owner_only ? 0600 : 0666);
      } catch (const Error& e) {
        throw Error(e.code(), e.message(), path_);
      }
      fd_ = t.fd;
      tmp_ = std::move(t.path);
      slot_ = t.slot;
      ::flock(fd_, LOCK_EX | LOCK_NB);  // marks it as a live writer's
    } else {
      fd_ =
          ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (opt_.replace ? O_TRUNC : O_EXCL),
                 opt_.owner_only ? 0600 : 0666);
      if (fd_ < 0 && errno == EEXIST && !opt_.replace) exists();
      if (fd_ >= 0 && opt_.owner_only) ::fchmod(fd_, 0600);  // an existing file keeps its mode
      if (fd_ < 0) fail("cannot create");
    }
  }
  ~FileSink() override {
    direct_.reset();
    if (early_sync_.joinable()) early_sync_.join();
    helper_.reset();
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
    io::release_temporary(slot_);
  }
  const std::string& name() const override { return path_; }
  // Small writes (zip headers, records up to 64 KiB) are staged in a 1 MiB buffer and go out when
  // it fills, or with the next large write in one pwritev. A checkpoint of 20,000 tensors of
  // 52 KB was otherwise 60,000 writes, mostly not page-aligned, and ext4's buffered-write path
  // per call cost more than the copy: its save took ~450 ms, ~330 ms staged. Large writes are
  // never copied, unless the file is written past the page cache (reserve()).
  void write(std::span<const std::byte> bytes) override {
    if (direct_) {
      direct_->write(bytes);
      if (pos_ + bytes.size() >= direct_end_) {  // the reserved size: all there
        leave_direct();
        start_early_sync();
      }
    } else if (bytes.size() <= kStageMax) {
      if (stage_.size() + bytes.size() > kStageCap) flush();
      if (stage_.empty()) stage_at_ = pos_;
      stage_.insert(stage_.end(), bytes.begin(), bytes.end());
    } else if (stage_.empty()) {
      pwrite_all(pos_, bytes);
    } else {
      pwrite_two(stage_at_, stage_, bytes);
      stage_.clear();
    }
    pos_ += bytes.size();
  }
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    if (offset > pos_ || bytes.size() > pos_ - offset)
      throw Error(ErrorCode::kInvalidArgument, "patch past the written bytes", path_, {}, offset);
    leave_direct();
    flush();
    pwrite_all(offset, bytes);
  }
  uint64_t position() const override { return pos_; }

  void reserve(uint64_t size) override {
    preallocate(size);
    // A large file fsynced on commit is written past the page cache (io/direct_stage.h) until
    // the reserved size is written, or a write needs the page cache (patch, write_sliced).
    if (opt_.fsync && !direct_ && size >= kDirectMin) {
      flush();
      direct_ = io::DirectStage::start(fd_, pos_, path_);
      direct_end_ = pos_ + size;
    }
  }

  void preallocate(uint64_t size) {
    if (size == 0 || !preallocate_) return;
    // On ext4, writes into preallocated (unwritten) extents skip the per-block work of delayed
    // allocation: 1 GiB into the page cache took ~120 ms instead of ~180 ms here. tmpfs gains
    // nothing (it got ~3% slower), so it is left alone. KEEP_SIZE: the file's size still
    // grows with the writes alone, so a reservation never shows up as content.
    struct statfs fs;
    if (::fstatfs(fd_, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
      preallocate_ = false;
      return;
    }
    if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(pos_), static_cast<off_t>(size)) ==
        0)
      return;
    if (errno == ENOSPC || errno == EDQUOT)
      throw Error(ErrorCode::kIo,
                  "cannot reserve " + std::to_string(size) + " bytes: " + std::strerror(errno),
                  path_, {}, pos_);
    preallocate_ = false;  // not supported here (EOPNOTSUPP, ...): a hint, so carry on without
  }

  void write_sliced(std::span<const std::byte> bytes, size_t slice,
                    const SliceVisitor& visit) override {
    // Two threads take slices in turn, each checksumming a slice (visit) and then writing it
    // while it is in cache. The kernel serializes buffered writes to one file (the inode lock),
    // so the gain is that one thread's checksum and its read of the next slice overlap the
    // other's write: saving 1 GiB of 4 MiB storages took ~125 ms this way against ~140 ms on
    // one thread. Slices end on multiples of `slice` in the file: writes that cover whole large
    // folios of the page cache were 15-20% faster than the same writes 64 bytes off.
    leave_direct();
    flush();
    if (slice == 0 || bytes.size() / slice < kMinParallelSlices || !start_helper())
      return ByteSink::write_sliced(bytes, slice, visit);
    const uint64_t at = pos_;
    const Slices s{at % slice, bytes.size(), slice};
    const uint64_t count = s.count();
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first;
    helper_->run_pair([&](unsigned) {
      try {
        for (uint64_t i; !failed.load(std::memory_order_relaxed) &&
                         (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
          auto piece = bytes.subspan(s.begin(i), s.end(i) - s.begin(i));
          visit(i, s.begin(i), piece);
          pwrite_all(at + s.begin(i), piece);
        }
      } catch (...) {
        if (!failed.exchange(true)) first = std::current_exception();
      }
    });
    if (first) std::rethrow_exception(first);
    pos_ += bytes.size();
  }

  void commit() override {
    if (committed_) return;
    leave_direct();
    flush();
    join_early_sync();
    helper_.reset();
    if (opt_.atomic && opt_.replace && !opt_.owner_only) {
      // A file replaced keeps its permission bits, as writing into it would (torch.save opens
      // the existing file): a 0600 checkpoint does not become 0644 by being rewritten.
      struct stat old;
      if (::stat(path_.c_str(), &old) == 0 && S_ISREG(old.st_mode))
        ::fchmod(fd_, old.st_mode & 0777);
    }
    if (opt_.fsync && ::fsync(fd_) != 0) fail("fsync");
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail("close");
    }
    fd_ = -1;
    if (opt_.atomic) {
      if (opt_.replace) {
        if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename temporary file over");
      } else {
        rename_no_replace();
      }
      io::release_temporary(slot_);
      slot_ = -1;
      if (opt_.fsync) {
        int dfd = ::open(dir_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
          ::fsync(dfd);
          ::close(dfd);
        }
      }
    }
    committed_ = true;
  }

 private:
  // Blocks of fewer slices are written on the calling thread: handing over costs a few us.
  static constexpr size_t kMinParallelSlices = 4;

  bool start_helper() {
    if (helper_) return true;
    if (std::thread::hardware_concurrency() < 2) return false;
    try {
      helper_ = std::make_unique<Helper>();
    } catch (const std::system_error&) {
      return false;  // no thread to be had: write on this one
    }
    return true;
  }

  [[noreturn]] void exists() {
    throw Error(ErrorCode::kInvalidArgument, "the file exists; not replaced", path_);
  }
  // The temporary to the target unless a file is there by now (a key file another process wrote
  // since we looked): then the temporary goes and the other file stays.
  void rename_no_replace() {
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) == 0) return;
    if (errno == EEXIST) exists();
    if (errno != EINVAL && errno != ENOSYS) fail("cannot rename temporary file to");
    // A file system without RENAME_NOREPLACE: a hard link fails the same way when the name exists.
    if (::link(tmp_.c_str(), path_.c_str()) != 0) {
      if (errno == EEXIST) exists();
      fail("cannot link temporary file to");
    }
    ::unlink(tmp_.c_str());
  }
  [[noreturn]] void fail(const std::string& what) {
    throw Error(ErrorCode::kIo, what + ": " + std::strerror(errno), path_);
  }
  static constexpr uint64_t kDirectMin = 64 << 20;
  // The file written as reserved (direct writes done): its fsync starts now, on a thread of its
  // own, while the caller writes on (the next file of a shard set), so that the commit's fsync,
  // which is still what makes the file durable, finds little left to do. Its error counts as
  // the commit's: the kernel reports a writeback error to one fsync of a file description only.
  void start_early_sync() {
    if (early_sync_.joinable()) return;  // one at a time (a second reserve()d region)
    try {
      early_sync_ = std::thread([this] { early_errno_ = ::fsync(fd_) == 0 ? 0 : errno; });
    } catch (const std::system_error&) {  // no thread: the commit's fsync does it all
    }
  }
  void join_early_sync() {
    if (!early_sync_.joinable()) return;
    early_sync_.join();
    if (early_errno_ != 0) {
      errno = early_errno_;
      fail("fsync");
    }
  }
  // Back to writes through the page cache, the staged bytes written.
  void leave_direct() {
    if (!direct_) return;
    std::unique_ptr<io::DirectStage> d = std::move(direct_);
    d->finish();
  }
  static constexpr size_t kStageMax = 64 << 10, kStageCap = 1 << 20;
  void flush() {
    if (stage_.empty()) return;
    pwrite_all(stage_at_, stage_);
    stage_.clear();
  }
  // `a` then `b` at `offset`, in one pwritev when the kernel takes it all.
  void pwrite_two(uint64_t offset, std::span<const std::byte> a, std::span<const std::byte> b) {
    iovec iov[2] = {{const_cast<std::byte*>(a.data()), a.size()},
                    {const_cast<std::byte*>(b.data()), b.size()}};
    ssize_t n;
    do {
      n = ::pwritev(fd_, iov, 2, static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0)
      throw Error(ErrorCode::kIo, std::string("write: ") + std::strerror(errno), path_, {}, offset);
    const size_t done = static_cast<size_t>(n);
    if (done < a.size()) {
      pwrite_all(offset + done, a.subspan(done));
      pwrite_all(offset + a.size(), b);
    } else {
      pwrite_all(offset + done, b.subspan(done - a.size()));
    }
  }
  void pwrite_all(uint64_t offset, std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                           static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(ErrorCode::kIo, std::string("write: ") + std::strerror(errno), path_, {},
                    offset + done);
      }
      done += static_cast<size_t>(n);
    }
    // With fsync on commit: start the disk writeback of each large write now, so that it
    // overlaps the writes still to come and the final fsync waits only for the tail. A hint
    // (SYNC_FILE_RANGE_WRITE does not wait for the I/O, and its failure changes nothing: the
    // fsync at commit is what guarantees durability).
    if (opt_.fsync && bytes.size() >= kWritebackMin)
      (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes.size()),
                              SYNC_FILE_RANGE_WRITE);
  }
  static constexpr size_t kWritebackMin = 256 << 10;

  std::string path_, tmp_;
  FileSinkOptions opt_;
  int fd_ = -1;
  int slot_ = -1;  // registry slot of tmp_ (io/temporaries.h)
  uint64_t pos_ = 0;
  bool committed_ = false;
  bool preallocate_ = true;
  std::vector<std::byte> stage_;  // small writes not yet written, for the file at stage_at_
  uint64_t stage_at_ = 0;
  std::unique_ptr<Helper> helper_;
  std::unique_ptr<io::DirectStage> direct_;
  uint64_t direct_end_ = 0;  // where the reserved bytes end
  std::thread early_sync_;
  int early_errno_ = 0;  // of early_sync_'s fsync
};

}  // namespace

std::unique_ptr<ByteSink> create_file_sink(const std::string& path, FileSinkOptions options) {
  return std::make_unique<FileSink>(path, options);
}

}  // namespace ckpt
