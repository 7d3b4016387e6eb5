#include "ckpt/sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ckpt/error.h"

namespace ckpt {

void MemorySink::write(std::span<const std::byte> bytes) {
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

void MemorySink::patch(uint64_t offset, std::span<const std::byte> bytes) {
  if (offset > buf_.size() || bytes.size() > buf_.size() - offset)
    throw Error(ErrorCode::kInvalidArgument, "patch past the written bytes", name_, {}, offset);
  std::memcpy(buf_.data() + offset, bytes.data(), bytes.size());
}

namespace {

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
std::string base_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class FileSink final : public ByteSink {
 public:
  FileSink(std::string path, FileSinkOptions opt) : path_(std::move(path)), opt_(opt) {
    if (opt_.atomic) {
      std::string tmpl = dir_of(path_) + "/." + base_of(path_) + ".tmp-XXXXXX";
      std::vector<char> buf(tmpl.begin(), tmpl.end());
      buf.push_back('\0');
      fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
      if (fd_ < 0) fail("cannot create temporary file in " + dir_of(path_));
      tmp_ = buf.data();
      // mkostemp makes 0600 files; give the usual mode (umask applies).
      mode_t mask = ::umask(0);
      ::umask(mask);
      ::fchmod(fd_, 0666 & ~mask);
    } else {
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (fd_ < 0) fail("cannot create");
    }
  }
  ~FileSink() override {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  }
  const std::string& name() const override { return path_; }
  void write(std::span<const std::byte> bytes) override {
    pwrite_all(pos_, bytes);
    pos_ += bytes.size();
  }
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    if (offset > pos_ || bytes.size() > pos_ - offset)
      throw Error(ErrorCode::kInvalidArgument, "patch past the written bytes", path_, {}, offset);
    pwrite_all(offset, bytes);
  }
  uint64_t position() const override { return pos_; }
  void commit() override {
    if (committed_) return;
    if (opt_.fsync && ::fsync(fd_) != 0) fail("fsync");
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail("close");
    }
    fd_ = -1;
    if (opt_.atomic) {
      if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename temporary file over");
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
  [[noreturn]] void fail(const std::string& what) {
    throw Error(ErrorCode::kIo, what + ": " + std::strerror(errno), path_);
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
  }

  std::string path_, tmp_;
  FileSinkOptions opt_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<ByteSink> create_file_sink(const std::string& path, FileSinkOptions options) {
  return std::make_unique<FileSink>(path, options);
}

}  // namespace ckpt
