#pragma once
// Where loaded bytes live: host memory, or the memory of a CUDA device.
//
// CUDA is reached through its runtime library, loaded when first asked for (dlopen of
// libcudart.so.13, .12 or .so, then /usr/local/cuda/lib64; the environment variable CKPT_CUDART
// names the one file to load instead). Nothing
// in the library links against CUDA: a machine without it runs everything else, and a device load
// there fails with Error{kUnsupported} naming what is missing.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ckpt {

struct Device {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA device ordinal (0 for the CPU); -1: the current CUDA device

  // "cpu", "cuda" (the current device: current_cuda()) or "cuda:N". Throws Error{kInvalidArgument}
  // for anything else, Error{kUnsupported} for a known kind ckpt does not load into ("mps", "xpu",
  // "meta", ...).
  static Device parse(std::string_view text);
  static Device cuda(int index = 0) { return {Kind::kCuda, index}; }
  // The CUDA device current on the loading thread when a load starts (cudaGetDevice), as torch
  // reads "cuda": a load resolves it once, and its storages name the resolved device.
  static Device current_cuda() { return {Kind::kCuda, -1}; }
  bool is_cpu() const noexcept { return kind == Kind::kCpu; }
  bool is_cuda() const noexcept { return kind == Kind::kCuda; }
  std::string str() const;  // "cpu", "cuda" (current), "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

// Whether loads into `device` can run here: an empty string when they can, else what is missing
// ("no CUDA runtime: libcudart.so.13, libcudart.so.12, libcudart.so not found", "CUDA device 3
// of 1 does not exist", ...). Never throws. Thread-safe (the runtime is loaded once).
std::string device_unavailable(const Device& device);

// A description of a usable device ("cuda:0 NVIDIA H200, 139 GiB, CUDA runtime 13.0"); throws
// Error{kUnsupported} with device_unavailable()'s reason otherwise.
std::string describe_device(const Device& device);

// Seconds one copy of `bytes` from pinned host memory into `device` memory takes (the link's
// speed, what no load into the device can beat): the median of `repeat` copies after one
// warm-up. For benchmarks (`ckpt bench --device`). Throws like describe_device().
double time_pinned_copy(const Device& device, uint64_t bytes, int repeat = 5);

// Device memory from the caller (LoadOptions::allocator): one allocation per storage of a device
// load, each freed when its last tensor dies. Called from the loading thread (allocate) and from
// whichever thread drops the last tensor (free): both must be thread-safe.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // At least `bytes` bytes (256-byte aligned) on `device`; throws (or returns null) when it has
  // none. The load then frees what it took and throws Error{kLimitExceeded}.
  virtual void* allocate(uint64_t bytes, const Device& device) = 0;
  virtual void free(void* p, uint64_t bytes, const Device& device) noexcept = 0;
  // Several storages of a load at once: out[i] gets sizes[i] bytes (null or a throw where there
  // are none; the load then allocates nothing more, frees every non-null out[i] and every
  // earlier allocation, and throws: Error{kLimitExceeded} naming the bytes needed and free for a
  // null, the allocator's own exception for a throw). A load asks for its storages in plan order
  // in a few such calls (1, 2, 4, ... storages each) on the loading thread, reading the first
  // storages while it makes the rest: an allocator behind a lock or an interpreter's lock (the
  // Python module's, over torch's caching allocator) takes it a few times per load instead of
  // once per storage. The default calls allocate() for each in turn, up to the first null.
  virtual void allocate_all(std::span<const uint64_t> sizes, const Device& device,
                            std::span<void*> out) {
    for (size_t i = 0; i < sizes.size(); ++i)
      if (!(out[i] = allocate(sizes[i], device))) return;
  }
};

// Bytes read straight into device memory by GPUDirect Storage in this process so far (what
// LoadOptions::gds really did: 0 when every byte went through host staging).
uint64_t gds_bytes_read();
// Bytes loaded in this process so far straight into device memory that the host shares (a CUDA
// device whose `integrated` attribute is set: no staging buffer, no copy; describe_device() says
// "unified memory"). 0 when every device load went through staging or GDS.
uint64_t unified_bytes_loaded();

struct Storage;
// Copies `dst.size()` bytes of a storage's memory from byte `offset` into host memory, wherever
// the storage is (a device storage through its device's runtime; a host one by memcpy). Throws
// Error{kInvalidArgument} past the storage's end, Error{kIo} naming the device on a failed copy.
void copy_to_host(const Storage& storage, uint64_t offset, std::span<std::byte> dst);

// Pinned host memory kept for the next device load (the staging ring): registering or faulting
// fresh pinned memory costs about as much as the copy, so a load returns its staging buffers to
// a per-device cache instead of freeing them. Returns the bytes released now (0 if none).
// Thread-safe.
uint64_t release_device_staging();

// Why LoadOptions::gds cannot read into `device` on this machine ("" when it can): no CUDA
// device (device_unavailable), no cuFile library (libcufile.so.0, or CKPT_CUFILE), or its driver
// does not open. Opens the driver once per process. Thread-safe.
std::string gds_unavailable(const Device& device);

}  // namespace ckpt
