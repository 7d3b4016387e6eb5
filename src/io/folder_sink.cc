// FolderSink: a folder of files written into a temporary sibling and renamed into place whole
// (include/ckpt/sink.h).

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "io/temporaries.h"

namespace ckpt {
namespace {

enum class Target { kAbsent, kEmptyFolder, kFolder };

// What is at the target path now. Throws Error{kInvalidArgument} for anything but a folder.
Target inspect(const std::string& path, const std::string& shown) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Target::kAbsent;
    throw Error(ErrorCode::kIo, std::string("cannot inspect: ") + std::strerror(errno), shown);
  }
  if (S_ISLNK(st.st_mode))
    throw Error(ErrorCode::kInvalidArgument,
                "is a symbolic link; name the folder it points to instead", shown);
  if (!S_ISDIR(st.st_mode))
    throw Error(ErrorCode::kInvalidArgument, "exists and is not a folder", shown);
  std::error_code ec;
  const bool empty = std::filesystem::is_empty(path, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot read the folder: " + ec.message(), shown);
  return empty ? Target::kEmptyFolder : Target::kFolder;
}

[[noreturn]] void not_empty(const std::string& shown) {
  throw Error(ErrorCode::kInvalidArgument, "folder exists and is not empty", shown);
}

void fsync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

class DirSink final : public FolderSink {
 public:
  DirSink(std::string path, FolderSinkOptions opt) : path_(std::move(path)), opt_(opt) {
    target_ = path_;
    while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
    const std::string base = io::base_of(target_);
    if (target_.empty() || base.empty() || base == "." || base == "..")
      throw Error(ErrorCode::kInvalidArgument, "not a folder name that can be created", path_);
    dir_ = io::dir_of(target_);
    if (inspect(target_, path_) == Target::kFolder && !opt_.replace) not_empty(path_);
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec)
      throw Error(ErrorCode::kIo, "cannot create folder " + dir_ + ": " + ec.message(), path_);
    io::sweep_stale_temporaries(dir_, base);
    io::Temporary t;
    try {
      t = io::create_temporary(dir_, base, true, 0777);
    } catch (const Error& e) {
      throw Error(e.code(), e.message(), path_);
    }
    fd_ = t.fd;
    tmp_ = std::move(t.path);
    slot_ = t.slot;
    ::flock(fd_, LOCK_EX | LOCK_NB);  // a live writer's (io::sweep_stale_temporaries)
  }
  ~DirSink() override {
    if (!committed_) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_, ec);
    }
    if (fd_ >= 0) ::close(fd_);
    io::release_temporary(slot_);
  }

  const std::string& path() const override { return path_; }

  std::unique_ptr<ByteSink> create(const std::string& name) override {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      throw Error(ErrorCode::kInvalidArgument, "not a file name: '" + name + "'", path_);
    if (committed_)
      throw Error(ErrorCode::kInvalidArgument, "folder already committed", path_, name);
    // The folder is the unit of atomicity: its files are plain ones, synced together on commit.
    return create_file_sink(tmp_ + "/" + name, {.atomic = false, .fsync = false});
  }

  void commit() override {
    if (committed_) return;
    // One syncfs for the whole folder: an fsync per file costs a device flush each, which for
    // thousands of small files is most of the time.
    if (opt_.fsync && (::syncfs(fd_) != 0 || ::fsync(fd_) != 0)) fail("cannot sync");
    const Target t = inspect(target_, path_);
    if (t == Target::kFolder && !opt_.replace) not_empty(path_);
    if (t != Target::kFolder) {
      // Absent, or an empty folder, which rename replaces.
      if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
        if (errno == ENOTEMPTY || errno == EEXIST) not_empty(path_);
        fail("cannot rename the temporary folder into place");
      }
    } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) ==
               0) {
      // The new folder is in place in one step; tmp_ holds the old one, still registered (a
      // signal now removes it too), and goes whole.
      std::error_code ec;
      std::filesystem::remove_all(tmp_, ec);
    } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      // No exchange here (some network and FUSE file systems): move the old folder aside first.
      // In between there is no folder at the path; a signal then leaves the old one aside.
      const std::string aside = dir_ + "/." + io::base_of(target_) + ".old-" + io::random_suffix();
      if (::rename(target_.c_str(), aside.c_str()) != 0)
        fail("cannot move the old folder aside to " + aside);
      if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
        const int err = errno;
        ::rename(aside.c_str(), target_.c_str());
        errno = err;
        fail("cannot rename the temporary folder into place");
      }
      std::error_code ec;
      std::filesystem::remove_all(aside, ec);
    } else {
      fail("cannot exchange the new folder with the old one");
    }
    committed_ = true;
    ::close(fd_);
    fd_ = -1;
    io::release_temporary(slot_);
    slot_ = -1;
    if (opt_.fsync) fsync_folder(dir_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw Error(ErrorCode::kIo, what + ": " + std::strerror(errno), path_);
  }

  std::string path_, target_, dir_, tmp_;
  FolderSinkOptions opt_;
  int fd_ = -1;
  int slot_ = -1;
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<FolderSink> create_folder_sink(const std::string& path, FolderSinkOptions options) {
  return std::make_unique<DirSink>(path, options);
}

}  // namespace ckpt
