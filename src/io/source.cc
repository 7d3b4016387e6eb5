#include "ckpt/source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "ckpt/error.h"
#include "io/local_file.h"

namespace ckpt {

namespace {
std::atomic<uint64_t> g_process_bytes{0};
}

uint64_t process_bytes_read() noexcept { return g_process_bytes.load(std::memory_order_relaxed); }

void internal::count_process_bytes(uint64_t bytes) noexcept {
  g_process_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void ByteSource::check_range(uint64_t offset, uint64_t len) const {
  if (offset > size() || len > size() - offset)
    throw Error(ErrorCode::kTruncated,
                "read of " + std::to_string(len) + " bytes passes the end of the file (" +
                    std::to_string(size()) + " bytes)",
                name(), {}, offset);
}

Bytes ByteSource::read(uint64_t offset, uint64_t len) const {
  check_range(offset, len);
  if (const std::byte* base = memory()) {
    count(len);
    return {std::span<const std::byte>(base + offset, len), memory_owner()};
  }
  auto buf = std::make_shared<std::vector<std::byte>>(len);
  read_into(offset, *buf);
  return {std::span<const std::byte>(buf->data(), buf->size()), buf};
}

void ByteSource::read_batch(std::span<const ReadRequest> requests) const {
  for (const auto& r : requests) read_into(r.offset, r.dst);
}

namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
              what + ": " + std::strerror(err), path);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

class FileSource final : public ByteSource {
 public:
  FileSource(std::string path, std::shared_ptr<Fd> fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }
  int fd() const { return fd_->fd; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    count(dst.size());
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n =
          ::pread(fd_->fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(ErrorCode::kIo, std::string("pread: ") + std::strerror(errno), path_, {},
                    offset + done);
      }
      if (n == 0)
        throw Error(ErrorCode::kTruncated, "file shrank while reading", path_, {}, offset + done);
      done += static_cast<size_t>(n);
    }
  }

 private:
  std::string path_;
  std::shared_ptr<Fd> fd_;
  uint64_t size_;
};

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr && len) ::munmap(addr, len);
  }
};

class MemorySourceBase : public ByteSource, public InMemory {
 public:
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    count(dst.size());
    if (!dst.empty()) std::memcpy(dst.data(), base_ + offset, dst.size());
  }
  const InMemory* in_memory() const override { return this; }
  const std::byte* base() const override { return base_; }
  std::shared_ptr<const void> owner() const override { return owner_; }

 protected:
  std::string name_;
  const std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

class MmapSource final : public MemorySourceBase {
 public:
  MmapSource(std::string path, std::shared_ptr<Mapping> m, uint64_t size, std::shared_ptr<Fd> fd,
             bool writable)
      : fd_(std::move(fd)), writable_(writable && size > 0) {
    name_ = std::move(path);
    base_ = static_cast<const std::byte*>(m->addr);
    size_ = size;
    owner_ = std::move(m);
  }
  bool writable() const override { return writable_; }
  int fd() const { return fd_ ? fd_->fd : -1; }
  SourcePtr pread_twin() const override {
    std::call_once(twin_once_, [&] { twin_ = std::make_shared<FileSource>(name_, fd_, size_); });
    return twin_;
  }
  // Whole pages inside the range only: a neighbouring page may hold bytes a caller wrote to
  // (the mapping is copy-on-write), which MADV_DONTNEED would throw away.
  void drop(uint64_t offset, uint64_t len) const override {
    if (offset >= size_ || len == 0) return;
    len = std::min(len, size_ - offset);
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = reinterpret_cast<uintptr_t>(base_ + offset);
    const uintptr_t start = (a + page - 1) & ~(page - 1), end = (a + len) & ~(page - 1);
    if (end > start) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
  }

 private:
  std::shared_ptr<Fd> fd_;
  bool writable_ = false;  // views handed out writable (open_mmap_source's writable_views)
  mutable std::once_flag twin_once_;
  mutable SourcePtr twin_;
};

class BufferSource final : public MemorySourceBase {
 public:
  BufferSource(std::string name, std::shared_ptr<std::vector<std::byte>> buf) {
    name_ = std::move(name);
    base_ = buf->data();
    size_ = buf->size();
    owner_ = std::move(buf);
  }
};

std::shared_ptr<Fd> open_fd(const std::string& path, uint64_t* size) {
  auto fd = std::make_shared<Fd>();
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever. Only regular
  // files are read; the flag is cleared once that is known.
  fd->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd->fd < 0) throw_errno("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd->fd, &st) != 0) throw_errno("cannot stat", path, errno);
  if (S_ISDIR(st.st_mode)) throw Error(ErrorCode::kInvalidArgument, "is a directory", path);
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::kInvalidArgument,
                std::string("is not a regular file (") +
                    (S_ISFIFO(st.st_mode)   ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a file") +
                    "); only regular files are read",
                path);
  const int flags = ::fcntl(fd->fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd->fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    throw_errno("cannot clear O_NONBLOCK on", path, errno);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

SourcePtr open_file_source(const std::string& path) {
  uint64_t size = 0;
  auto fd = open_fd(path, &size);
  return std::make_shared<FileSource>(path, std::move(fd), size);
}

SourcePtr open_mmap_source(const std::string& path, bool writable_views) {
  uint64_t size = 0;
  auto fd = open_fd(path, &size);
  auto m = std::make_shared<Mapping>();
  if (size > 0) {
    // MAP_NORESERVE: a writable private mapping is otherwise charged in full against the
    // overcommit heuristic, so a file larger than RAM + swap (a 1 TB checkpoint) failed to map
    // with ENOMEM. Pages are only charged when a caller writes to them.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd->fd, 0);
    if (p == MAP_FAILED) throw_errno("cannot mmap", path, errno);
    m->addr = p;
    m->len = size;
  }
  return std::make_shared<MmapSource>(path, std::move(m), size, std::move(fd), writable_views);
}

SourcePtr memory_source(std::vector<std::byte> bytes, std::string name) {
  return std::make_shared<BufferSource>(std::move(name),
                                        std::make_shared<std::vector<std::byte>>(std::move(bytes)));
}

SourcePtr memory_source(std::string_view bytes, std::string name) {
  auto p = reinterpret_cast<const std::byte*>(bytes.data());
  return memory_source(std::vector<std::byte>(p, p + bytes.size()), std::move(name));
}

bool internal::is_local_file(const ByteSource& source) noexcept {
  return local_file_fd(source) >= 0;
}

int internal::local_file_fd(const ByteSource& source) noexcept {
  if (const auto* f = dynamic_cast<const FileSource*>(&source)) return f->fd();
  if (const auto* m = dynamic_cast<const MmapSource*>(&source)) return m->fd();
  return -1;
}

}  // namespace ckpt
