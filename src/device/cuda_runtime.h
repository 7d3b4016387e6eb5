#pragma once
// The CUDA runtime entry points the CUDA engine uses, as function pointers bound at run time
// (dlopen of libcudart; cuda_engine.cc), with the plain C types of their stable ABI: cudaError_t
// is an int, streams and events are pointers, the enum values below are the runtime's documented
// ones. A table of its own lets the unit tests drive the real engine code (current-device
// handling, error clearing, memory checks) over a fake runtime with no GPU.

#include <cstddef>
#include <memory>
#include <string>

namespace ckpt::internal {

class CopyEngine;

namespace cuda {

using Error = int;
using Stream = void*;
using Event = void*;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;
constexpr unsigned kHostAllocPortable = 1;
constexpr unsigned kHostAllocMapped = 2;
constexpr int kDevAttrIntegrated = 18;
constexpr int kDevAttrCanMapHostMemory = 19;
constexpr int kDevAttrPageableMemoryAccess = 88;
constexpr int kDevAttrPageableMemoryAccessUsesHostPageTables = 100;
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;

struct Runtime {
  void* handle = nullptr;
  std::string path, missing;  // the file loaded, or why none could be
  Error (*GetDeviceCount)(int*) = nullptr;
  Error (*GetDevice)(int*) = nullptr;
  Error (*SetDevice)(int) = nullptr;
  Error (*GetLastError)() = nullptr;
  Error (*Malloc)(void**, size_t) = nullptr;
  Error (*Free)(void*) = nullptr;
  Error (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  Error (*FreeHost)(void*) = nullptr;
  Error (*StreamCreateWithFlags)(Stream*, unsigned) = nullptr;
  Error (*StreamDestroy)(Stream) = nullptr;
  Error (*StreamSynchronize)(Stream) = nullptr;
  Error (*MemcpyAsync)(void*, const void*, size_t, int, Stream) = nullptr;
  Error (*Memcpy)(void*, const void*, size_t, int) = nullptr;
  Error (*EventCreateWithFlags)(Event*, unsigned) = nullptr;
  Error (*EventRecord)(Event, Stream) = nullptr;
  Error (*EventSynchronize)(Event) = nullptr;
  Error (*EventDestroy)(Event) = nullptr;
  Error (*MemGetInfo)(size_t*, size_t*) = nullptr;
  Error (*RuntimeGetVersion)(int*) = nullptr;
  const char* (*GetErrorString)(Error) = nullptr;
  Error (*GetDeviceProperties)(void*, int) = nullptr;                // optional
  Error (*DeviceGetAttribute)(int*, int, int) = nullptr;             // optional
  Error (*HostGetDevicePointer)(void**, void*, unsigned) = nullptr;  // optional
};

// Makes device `index` current on this thread for the guard's life and restores the device that
// was current before (the caller's, torch's) when it ends: ckpt never leaves its device behind.
// Throws ckpt::Error{kIo} if the device cannot be made current (the runtime's error cleared).
class DeviceGuard {
 public:
  DeviceGuard(const Runtime& rt, int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const Runtime& rt_;
  int previous_ = -1;  // -1: nothing to restore
};

// The engine of device `index` over `rt` (which must outlive it). For tests: cuda_engine() is
// this over the runtime library.
std::unique_ptr<CopyEngine> make_engine(const Runtime& rt, int index);

}  // namespace cuda
}  // namespace ckpt::internal
