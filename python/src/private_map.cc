// open_private_map: a ByteSource over a private copy-on-write mapping (see binding.h).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "binding.h"

namespace ckpt::py {
namespace {

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr) munmap(addr, len);
  }
};

class PrivateMapSource final : public ByteSource {
 public:
  PrivateMapSource(std::string name, std::shared_ptr<Mapping> map)
      : name_(std::move(name)), map_(std::move(map)) {}
  uint64_t size() const override { return map_->len; }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > map_->len || dst.size() > map_->len - offset)
      throw Error(ErrorCode::kTruncated,
                  "read of " + std::to_string(dst.size()) + " bytes past the end of the file",
                  name_, {}, offset);
    if (!dst.empty()) std::memcpy(dst.data(), base() + offset, dst.size());
  }
  const std::byte* memory() const override { return base(); }
  std::shared_ptr<const void> memory_owner() const override { return map_; }

 private:
  const std::byte* base() const { return static_cast<const std::byte*>(map_->addr); }
  std::string name_;
  std::shared_ptr<Mapping> map_;
};

[[noreturn]] void fail(const std::string& path, const char* what) {
  int e = errno;
  throw Error(e == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
              std::string(what) + ": " + std::strerror(e), path);
}

}  // namespace

SourcePtr open_private_map(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail(path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode) || st.st_size == 0) {
    ::close(fd);
    return open_file_source(path);  // reports an empty file or a folder its own way
  }
  auto map = std::make_shared<Mapping>();
  map->len = static_cast<size_t>(st.st_size);
  void* a = mmap(nullptr, map->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (a == MAP_FAILED) {
    errno = e;
    map->len = 0;
    fail(path, "cannot map");
  }
  map->addr = a;
  return std::make_shared<PrivateMapSource>(path, std::move(map));
}

}  // namespace ckpt::py
