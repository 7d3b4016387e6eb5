// cuFile by dlopen (device/cufile.h). The few entry points used are declared here with the plain
// C types of their ABI: CUfileError_t is two ints (the cuFile status, 0 for success, and a CUDA
// driver result), a handle is a pointer, and the file descriptor record is a handle type (1: a
// Linux file descriptor), a union of an int fd and a pointer, and a pointer to optional
// filesystem operations (null). cuFileRead returns the bytes read or a negative error.

#include "device/cufile.h"

#include <dlfcn.h>
#include <sys/types.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {

struct CuFileStatus {
  int err;
  int cu_err;
};
struct CuFileDescr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
constexpr int kHandleTypeFd = 1;

struct Library {
  std::string path, missing;
  CuFileStatus (*DriverOpen)() = nullptr;
  CuFileStatus (*HandleRegister)(void**, CuFileDescr*) = nullptr;
  void (*HandleDeregister)(void*) = nullptr;
  ssize_t (*Read)(void*, void*, size_t, off_t, off_t) = nullptr;
};

std::string status_text(CuFileStatus s) {
  std::string t = "cuFile error " + std::to_string(s.err);
  if (s.err == 5001) t += " (the nvidia-fs driver is not loaded and compatibility mode is off)";
  if (s.cu_err) t += ", CUDA driver error " + std::to_string(s.cu_err);
  return t;
}

const Library& library() {
  static const Library lib = [] {
    Library l;
    std::vector<std::string> names;
    if (const char* env = std::getenv("CKPT_CUFILE"); env && *env)
      names.push_back(env);
    else
      for (const char* n :
           {"libcufile.so.0", "libcufile.so", "/usr/local/cuda/lib64/libcufile.so.0"})
        names.push_back(n);
    void* h = nullptr;
    for (const std::string& n : names)
      if ((h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) {
        l.path = n;
        break;
      }
    if (!h) {
      l.missing = "no cuFile library: none of";
      for (const std::string& n : names) l.missing += " " + n;
      l.missing += " could be loaded (set CKPT_CUFILE to its path)";
      return l;
    }
    l.DriverOpen = reinterpret_cast<decltype(l.DriverOpen)>(::dlsym(h, "cuFileDriverOpen"));
    l.HandleRegister =
        reinterpret_cast<decltype(l.HandleRegister)>(::dlsym(h, "cuFileHandleRegister"));
    l.HandleDeregister =
        reinterpret_cast<decltype(l.HandleDeregister)>(::dlsym(h, "cuFileHandleDeregister"));
    l.Read = reinterpret_cast<decltype(l.Read)>(::dlsym(h, "cuFileRead"));
    if (!l.DriverOpen || !l.HandleRegister || !l.HandleDeregister || !l.Read) {
      l.missing = "the cuFile library " + l.path + " lacks an entry point ckpt needs";
      return l;
    }
    // The driver stays open until the process ends (closing it under live handles is unsafe).
    if (CuFileStatus s = l.DriverOpen(); s.err != 0)
      l.missing = "cuFileDriverOpen (" + l.path + "): " + status_text(s);
    return l;
  }();
  return lib;
}

class CuFile : public DirectFile {
 public:
  CuFile(void* handle, OnDevice on_device) : handle_(handle), on_device_(std::move(on_device)) {}
  ~CuFile() override { library().HandleDeregister(handle_); }
  void read(uint64_t offset, std::byte* dst, uint64_t n) override {
    on_device_([&] { read_on_device(offset, dst, n); });
  }

 private:
  void read_on_device(uint64_t offset, std::byte* dst, uint64_t n) {
    const Library& l = library();
    for (uint64_t done = 0; done < n;) {
      ssize_t r = l.Read(handle_, dst, n - done, static_cast<off_t>(offset + done),
                         static_cast<off_t>(done));
      if (r <= 0)
        throw Error(ErrorCode::kIo,
                    r < 0 ? "cuFileRead failed (" + std::to_string(r) + ")"
                          : std::string("cuFileRead: end of file"),
                    {}, {}, offset + done);
      done += static_cast<uint64_t>(r);
    }
  }

 private:
  void* handle_;
  OnDevice on_device_;
};

}  // namespace

std::string cufile_unavailable() { return library().missing; }

std::unique_ptr<DirectFile> open_cufile(int fd, OnDevice on_device, std::string& why) {
  why = cufile_unavailable();
  if (!why.empty()) return nullptr;
  CuFileDescr d{};
  d.type = kHandleTypeFd;
  d.handle.fd = fd;
  void* handle = nullptr;
  CuFileStatus s{};
  on_device([&] { s = library().HandleRegister(&handle, &d); });
  if (s.err != 0) {
    why = "cuFileHandleRegister: " + status_text(s);
    return nullptr;
  }
  return std::make_unique<CuFile>(handle, std::move(on_device));
}

}  // namespace ckpt::internal
