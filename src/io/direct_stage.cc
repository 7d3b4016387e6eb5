// Direct writes through two staging buffers (direct_stage.h).

#include "io/direct_stage.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "ckpt/error.h"

namespace ckpt::io {

namespace {

// 0, or the errno of the write that failed and (in `failed_at`) its offset.
int pwrite_full(int fd, const std::byte* p, size_t len, uint64_t off, uint64_t& failed_at) {
  for (size_t done = 0; done < len;) {
    const ssize_t n = ::pwrite(fd, p + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed_at = off + done;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

std::unique_ptr<DirectStage> DirectStage::start(int fd, uint64_t at, const std::string& path) {
  if (at % kAlign != 0) return nullptr;
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0 || fs.f_type == TMPFS_MAGIC) return nullptr;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return nullptr;
  try {
    return std::unique_ptr<DirectStage>(new DirectStage(fd, at, flags, path));
  } catch (const std::system_error&) {  // no thread to be had
  } catch (const std::bad_alloc&) {
  }
  ::fcntl(fd, F_SETFL, flags);
  return nullptr;
}

DirectStage::DirectStage(int fd, uint64_t at, int flags, const std::string& path)
    : fd_(fd),
      flags_(flags),
      path_(path),
      mem_(static_cast<std::byte*>(std::aligned_alloc(kAlign, 2 * kBuffer)), std::free),
      at_(at) {
  if (!mem_) throw std::bad_alloc();
  buf_[0] = mem_.get();
  buf_[1] = mem_.get() + kBuffer;
  thread_ = std::thread([this] { loop(); });
}

DirectStage::~DirectStage() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  ::fcntl(fd_, F_SETFL, flags_);
}

void DirectStage::write(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const size_t n = std::min(kBuffer - fill_, bytes.size());
    std::memcpy(buf_[cur_] + fill_, bytes.data(), n);
    fill_ += n;
    bytes = bytes.subspan(n);
    if (fill_ == kBuffer) submit(kBuffer);
  }
}

uint64_t DirectStage::finish() {
  const size_t whole = fill_ / kAlign * kAlign, tail = fill_ - whole;
  const std::byte* rest = buf_[cur_] + whole;
  const uint64_t rest_at = at_ + whole;
  if (whole) submit(whole);  // the buffer it leaves is not reused before the wait below
  wait_idle();
  ::fcntl(fd_, F_SETFL, flags_);
  uint64_t failed_at = 0;
  if (const int e = pwrite_full(fd_, rest, tail, rest_at, failed_at))
    throw Error(ErrorCode::kIo, std::string("write: ") + std::strerror(e), path_, {}, failed_at);
  fill_ = 0;
  at_ = rest_at + tail;
  return at_;
}

void DirectStage::submit(size_t len) {
  wait_idle();
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = buf_[cur_];
    job_len_ = len;
    job_off_ = at_;
  }
  cv_.notify_all();
  at_ += len;
  cur_ ^= 1;
  fill_ = 0;
}

void DirectStage::wait_idle() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return job_ == nullptr; });
  if (err_)
    throw Error(ErrorCode::kIo, std::string("write: ") + std::strerror(err_), path_, {}, err_off_);
}

void DirectStage::loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return job_ != nullptr || stop_; });
    if (!job_) return;
    const std::byte* p = job_;
    const size_t len = job_len_;
    const uint64_t off = job_off_;
    const bool skip = err_ != 0;  // after a failure nothing more is written
    l.unlock();
    if (!skip) write_at(p, len, off);
    l.lock();
    job_ = nullptr;
    cv_.notify_all();
  }
}

void DirectStage::write_at(const std::byte* p, size_t len, uint64_t off) {
  uint64_t failed_at = 0;
  int e = pwrite_full(fd_, p, len, off, failed_at);
  if (e == EINVAL && direct_) {
    // The file system takes O_DIRECT but not this write (a larger sector, say): the rest of the
    // file goes through the page cache.
    direct_ = false;
    ::fcntl(fd_, F_SETFL, flags_);
    e = pwrite_full(fd_, p + (failed_at - off), len - (failed_at - off), failed_at, failed_at);
  }
  if (e) {
    std::lock_guard<std::mutex> l(mu_);
    err_ = e;
    err_off_ = failed_at;
  }
}

}  // namespace ckpt::io
