// The CUDA CopyEngine, through the CUDA runtime library loaded at run time (dlopen): no CUDA
// header or library is needed to build ckpt, and a machine without CUDA runs everything else.
//
// Only a handful of runtime entry points are used, declared here with the plain C types of their
// stable ABI (cudaError_t is an int, streams and events are pointers, the enum values below are
// the runtime's documented ones): cudaGetDeviceCount, cudaSetDevice, cudaMalloc/cudaFree,
// cudaHostAlloc/cudaFreeHost, cudaStreamCreateWithFlags/cudaStreamDestroy, cudaMemcpyAsync,
// cudaMemcpy, cudaEventCreateWithFlags/Record/Synchronize/Destroy, cudaMemGetInfo,
// cudaRuntimeGetVersion, cudaGetErrorString, and cudaGetDeviceProperties(_v2) for the name only.

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/device.h"
#include "ckpt/error.h"
#include "ckpt/tensor.h"
#include "device/copy_engine.h"
#include "device/cuda_runtime.h"
#include "device/cufile.h"

namespace ckpt::internal {
namespace {

using cuda::Event;
using cuda::Runtime;
using cuda::Stream;
using cudaError = cuda::Error;
using cuda::DeviceGuard;
using cuda::kEventDisableTiming;
using cuda::kHostAllocMapped;
using cuda::kHostAllocPortable;
using cuda::kMemcpyDeviceToHost;
using cuda::kMemcpyHostToDevice;
using cuda::kStreamNonBlocking;
// What GetDeviceCount answers without a driver (cudaErrorInsufficientDriver) and without a GPU
// (cudaErrorNoDevice).
constexpr cudaError kErrorInsufficientDriver = 35;
constexpr cudaError kErrorNoDevice = 100;

template <typename F>
bool bind(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(h, name));
  return f != nullptr;
}

const Runtime& runtime() {
  static const Runtime rt = [] {
    Runtime r;
    std::vector<std::string> names;
    if (const char* env = std::getenv("CKPT_CUDART"); env && *env)
      names.push_back(env);  // the user's choice, and only it
    else
      for (const char* n : {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                            "/usr/local/cuda/lib64/libcudart.so"})
        names.push_back(n);
    for (const std::string& n : names) {
      r.handle = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (r.handle) {
        r.path = n;
        break;
      }
    }
    if (!r.handle) {
      r.missing = "no CUDA runtime: none of";
      for (const std::string& n : names) r.missing += " " + n;
      r.missing += " could be loaded (set CKPT_CUDART to its path)";
      return r;
    }
    void* h = r.handle;
    bool ok =
        bind(h, "cudaGetDeviceCount", r.GetDeviceCount) && bind(h, "cudaSetDevice", r.SetDevice) &&
        bind(h, "cudaGetDevice", r.GetDevice) && bind(h, "cudaGetLastError", r.GetLastError) &&
        bind(h, "cudaStreamSynchronize", r.StreamSynchronize) && bind(h, "cudaMalloc", r.Malloc) &&
        bind(h, "cudaFree", r.Free) && bind(h, "cudaHostAlloc", r.HostAlloc) &&
        bind(h, "cudaFreeHost", r.FreeHost) &&
        bind(h, "cudaStreamCreateWithFlags", r.StreamCreateWithFlags) &&
        bind(h, "cudaStreamDestroy", r.StreamDestroy) &&
        bind(h, "cudaMemcpyAsync", r.MemcpyAsync) && bind(h, "cudaMemcpy", r.Memcpy) &&
        bind(h, "cudaEventCreateWithFlags", r.EventCreateWithFlags) &&
        bind(h, "cudaEventRecord", r.EventRecord) &&
        bind(h, "cudaEventSynchronize", r.EventSynchronize) &&
        bind(h, "cudaEventDestroy", r.EventDestroy) && bind(h, "cudaMemGetInfo", r.MemGetInfo) &&
        bind(h, "cudaRuntimeGetVersion", r.RuntimeGetVersion) &&
        bind(h, "cudaGetErrorString", r.GetErrorString);
    if (!ok) {
      r.missing = "the CUDA runtime " + r.path + " lacks an entry point ckpt needs";
      r.handle = nullptr;  // left loaded: unloading a runtime is never safe
      return r;
    }
    if (!bind(h, "cudaGetDeviceProperties_v2", r.GetDeviceProperties))
      bind(h, "cudaGetDeviceProperties", r.GetDeviceProperties);
    bind(h, "cudaDeviceGetAttribute", r.DeviceGetAttribute);
    bind(h, "cudaHostGetDevicePointer", r.HostGetDevicePointer);
    return r;
  }();
  return rt;
}

std::string cuda_text(const Runtime& rt, cudaError e) {
  const char* s = rt.GetErrorString ? rt.GetErrorString(e) : nullptr;
  return std::string(s ? s : "unknown CUDA error") + " (" + std::to_string(e) + ")";
}

// Throws Error{kIo} for a failed call, after clearing the error it left pending in the runtime
// (torch shares the runtime: a stale error would surface in its next unrelated call).
void check(const Runtime& rt, cudaError e, const char* what, int index) {
  if (e == 0) return;
  if (rt.GetLastError) rt.GetLastError();
  throw Error(ErrorCode::kIo,
              std::string(what) + " on cuda:" + std::to_string(index) + ": " + cuda_text(rt, e));
}

// A call whose failure is ignored (teardown): its error is cleared all the same.
void quiet(const Runtime& rt, cudaError e) {
  if (e != 0 && rt.GetLastError) rt.GetLastError();
}

// Why device `index` cannot be used, or "" (and the device count in `count`).
std::string unavailable(int index) {
  const Runtime& rt = runtime();
  if (!rt.handle) return rt.missing;
  int count = 0;
  if (cudaError e = rt.GetDeviceCount(&count); e != 0) {
    quiet(rt, e);
    // 35 (cudaErrorInsufficientDriver, "CUDA driver version is insufficient") is what the
    // runtime answers where no NVIDIA driver is installed at all (a machine without a GPU),
    // 100 (cudaErrorNoDevice) where the driver finds no GPU: both mean no device.
    if (e == kErrorInsufficientDriver)
      return "no CUDA device (" + rt.path + " finds no NVIDIA driver, or one older than it needs)";
    if (e == kErrorNoDevice) return "no CUDA device (" + rt.path + ": " + cuda_text(rt, e) + ")";
    return "no usable CUDA device (" + rt.path + ": " + cuda_text(rt, e) + ")";
  }
  if (index < 0 || index >= count)
    return "CUDA device " + std::to_string(index) + " does not exist (this machine has " +
           std::to_string(count) + ")";
  return {};
}

class CudaSession : public CopySession {
 public:
  CudaSession(const Runtime& rt, int index, int slots, int lanes) : rt_(rt), index_(index) {
    DeviceGuard on(rt_, index_);
    streams_.assign(static_cast<size_t>(lanes), nullptr);
    events_.assign(static_cast<size_t>(slots), nullptr);
    queued_.assign(static_cast<size_t>(slots), 0);
    try {
      for (auto& s : streams_)
        check(rt_, rt_.StreamCreateWithFlags(&s, kStreamNonBlocking), "cudaStreamCreate", index_);
      for (auto& e : events_)
        check(rt_, rt_.EventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreate", index_);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaSession() override {
    try {
      DeviceGuard on(rt_, index_);
      for (size_t k = 0; k < events_.size(); ++k)
        if (events_[k] && queued_[k]) quiet(rt_, rt_.EventSynchronize(events_[k]));
      for (Stream s : streams_)
        if (s) quiet(rt_, rt_.StreamSynchronize(s));  // copies whose event was never recorded
      destroy();
    } catch (...) {
      destroy();
    }
  }

  void copy(int slot, std::byte* dst, const std::byte* src, uint64_t n) override {
    DeviceGuard on(rt_, index_);
    const size_t k = static_cast<size_t>(slot);
    Stream s = streams_[k % streams_.size()];
    check(rt_, rt_.MemcpyAsync(dst, src, n, kMemcpyHostToDevice, s), "cudaMemcpyAsync", index_);
    if (cudaError e = rt_.EventRecord(events_.at(k), s); e != 0) {
      // The copy is queued but has no mark: wait for its stream before reporting, so that no
      // copy from the slot's staging memory is left running.
      quiet(rt_, e);
      quiet(rt_, rt_.StreamSynchronize(s));
      check(rt_, e, "cudaEventRecord", index_);
    }
    queued_[k] = 1;
  }

  void wait(int slot) override {
    const size_t k = static_cast<size_t>(slot);
    if (!queued_.at(k)) return;
    DeviceGuard on(rt_, index_);
    queued_[k] = 0;
    check(rt_, rt_.EventSynchronize(events_[k]), "copy to the device", index_);
  }

  void finish() override {
    for (size_t k = 0; k < events_.size(); ++k) wait(static_cast<int>(k));
  }

 private:
  void destroy() noexcept {
    for (Event& e : events_)
      if (e) quiet(rt_, rt_.EventDestroy(std::exchange(e, nullptr)));
    for (Stream& s : streams_)
      if (s) quiet(rt_, rt_.StreamDestroy(std::exchange(s, nullptr)));
  }
  const Runtime& rt_;
  int index_;
  std::vector<Stream> streams_;
  std::vector<Event> events_;
  std::vector<uint8_t> queued_;  // per slot: a copy was marked and not yet waited for
};

// A device attribute (cudaDeviceGetAttribute), 0 where it cannot be read.
int attribute(const Runtime& rt, int index, int attr) {
  int v = 0;
  if (!rt.DeviceGetAttribute) return 0;
  if (cudaError e = rt.DeviceGetAttribute(&v, attr, index); e != 0) {
    quiet(rt, e);
    return 0;
  }
  return v;
}

class CudaEngine : public CopyEngine {
 public:
  CudaEngine(const Runtime& rt, int index) : rt_(rt), index_(index) {
    // Unified memory: an integrated GPU uses the host's own memory. Its allocations are pinned
    // host memory mapped into the device (cudaHostAlloc, cudaHostAllocMapped): the host writes
    // them at any time (managed memory may not be touched by the host while a kernel runs on
    // a device without concurrent managed access, as integrated ones are), and the device reads
    // them in place. A discrete GPU that reads pageable host memory through the host's page
    // tables (ATS: Grace Hopper) keeps the staged path: its own memory is HBM, and tensors read
    // into host pages would live in the slower host memory; its link outruns any file read.
    integrated_ = attribute(rt_, index_, cuda::kDevAttrIntegrated) != 0 &&
                  attribute(rt_, index_, cuda::kDevAttrCanMapHostMemory) != 0 &&
                  rt_.HostGetDevicePointer != nullptr;
    ats_ = attribute(rt_, index_, cuda::kDevAttrPageableMemoryAccessUsesHostPageTables) != 0 &&
           attribute(rt_, index_, cuda::kDevAttrPageableMemoryAccess) != 0;
  }
  ~CudaEngine() override { release_staging(); }

  bool unified() const override { return integrated_; }
  bool host_accessible(const std::byte* p) const override {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = shared_.upper_bound(a);
    if (it == shared_.begin()) return false;
    --it;
    return a < it->first + std::max<uint64_t>(it->second, 1);
  }

  Device device() const override { return Device::cuda(index_); }

  std::string describe() const override {
    DeviceGuard on(rt_, index_);
    std::string name = "CUDA device";
    if (rt_.GetDeviceProperties) {
      // Only the first member (char name[256]) is read; the buffer is far larger than any
      // version's cudaDeviceProp.
      std::vector<char> prop(1 << 16, 0);
      if (cudaError e = rt_.GetDeviceProperties(prop.data(), index_); e == 0)
        name.assign(prop.data(), strnlen(prop.data(), 256));
      else
        quiet(rt_, e);
    }
    size_t free_b = 0, total_b = 0;
    quiet(rt_, rt_.MemGetInfo(&free_b, &total_b));
    int v = 0;
    quiet(rt_, rt_.RuntimeGetVersion(&v));
    return "cuda:" + std::to_string(index_) + " " + name + ", " + std::to_string(total_b >> 30) +
           " GiB, CUDA runtime " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) +
           " (" + rt_.path + ")" +
           (integrated_ ? ", unified memory (integrated)"
            : ats_      ? ", reads pageable host memory (ATS)"
                        : "");
  }

  uint64_t free_bytes() override {
    DeviceGuard on(rt_, index_);
    size_t free_b = 0, total_b = 0;
    check(rt_, rt_.MemGetInfo(&free_b, &total_b), "cudaMemGetInfo", index_);
    return free_b;
  }

  std::shared_ptr<std::byte> allocate(uint64_t bytes) override {
    DeviceGuard on(rt_, index_);
    if (integrated_)
      if (auto shared = allocate_shared(bytes)) return shared;
    void* p = nullptr;
    if (cudaError e = rt_.Malloc(&p, std::max<uint64_t>(bytes, 1)); e != 0) {
      quiet(rt_, e);
      size_t free_b = 0, total_b = 0;
      quiet(rt_, rt_.MemGetInfo(&free_b, &total_b));
      throw Error(ErrorCode::kLimitExceeded,
                  "cannot allocate " + std::to_string(bytes) +
                      " bytes on cuda:" + std::to_string(index_) + " (" + std::to_string(free_b) +
                      " of " + std::to_string(total_b) + " free): " + cuda_text(rt_, e));
    }
    const Runtime* rt = &rt_;
    int index = index_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [rt, index](std::byte* q) {
      try {
        DeviceGuard on(*rt, index);
        quiet(*rt, rt->Free(q));
      } catch (...) {
        quiet(*rt, rt->Free(q));
      }
    });
  }

  // Pinned host memory mapped into the device at the same address (unified()), or null where
  // the runtime gives none (the load then uses device memory and staging).
  std::shared_ptr<std::byte> allocate_shared(uint64_t bytes) {
    void* p = nullptr;
    if (cudaError e =
            rt_.HostAlloc(&p, std::max<uint64_t>(bytes, 1), kHostAllocPortable | kHostAllocMapped);
        e != 0) {
      quiet(rt_, e);
      return nullptr;
    }
    void* d = nullptr;
    if (cudaError e = rt_.HostGetDevicePointer(&d, p, 0); e != 0 || d != p) {
      quiet(rt_, e);
      quiet(rt_, rt_.FreeHost(p));
      return nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      shared_[reinterpret_cast<uintptr_t>(p)] = bytes;
    }
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [this](std::byte* q) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        shared_.erase(reinterpret_cast<uintptr_t>(q));
      }
      quiet(rt_, rt_.FreeHost(q));
    });
  }

  // A cached buffer that holds `bytes` (the smallest), else a new one; on a miss the cached ones
  // too small for it are freed (a load's readers ask for buffers of one size).
  std::shared_ptr<std::byte> staging(uint64_t bytes) override {
    void* p = nullptr;
    uint64_t size = 0;
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = cached_.end();
      for (auto it = cached_.begin(); it != cached_.end(); ++it)
        if (it->second >= bytes && (best == cached_.end() || it->second < best->second)) best = it;
      if (best != cached_.end()) {
        p = best->first;
        size = best->second;
        cached_.erase(best);
      } else {
        std::erase_if(cached_, [&](const std::pair<void*, uint64_t>& c) {
          if (c.second < bytes) drop.push_back(c.first);
          return c.second < bytes;
        });
      }
    }
    for (void* q : drop) quiet(rt_, rt_.FreeHost(q));
    if (!p) {
      DeviceGuard on(rt_, index_);
      if (cudaError e = rt_.HostAlloc(&p, std::max<uint64_t>(bytes, 1), kHostAllocPortable);
          e != 0) {
        quiet(rt_, e);
        throw Error(ErrorCode::kLimitExceeded,
                    "cannot allocate " + std::to_string(bytes) +
                        " bytes of pinned host memory: " + cuda_text(rt_, e));
      }
      size = bytes;
    }
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [this, size](std::byte* q) {
      std::lock_guard<std::mutex> lock(mu_);
      cached_.emplace_back(q, size);
    });
  }

  std::unique_ptr<CopySession> start(int slots, int lanes) override {
    return std::make_unique<CudaSession>(rt_, index_, slots, std::max(1, lanes));
  }

  void to_host(std::byte* dst, const std::byte* src, uint64_t n) override {
    DeviceGuard on(rt_, index_);
    check(rt_, rt_.Memcpy(dst, src, n, kMemcpyDeviceToHost), "cudaMemcpy", index_);
  }
  void to_device(std::byte* dst, const std::byte* src, uint64_t n) override {
    DeviceGuard on(rt_, index_);
    check(rt_, rt_.Memcpy(dst, src, n, kMemcpyHostToDevice), "cudaMemcpy", index_);
  }

  uint64_t cached_staging() const override {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t n = 0;
    for (const auto& c : cached_) n += c.second;
    return n;
  }
  uint64_t release_staging() override {
    std::vector<std::pair<void*, uint64_t>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(cached_);
    }
    uint64_t n = 0;
    for (const auto& [p, size] : all) {
      quiet(rt_, rt_.FreeHost(p));
      n += size;
    }
    return n;
  }

  std::unique_ptr<DirectFile> open_direct(int fd, std::string& why) override {
    const Runtime* rt = &rt_;
    int index = index_;
    return open_cufile(
        fd,
        [rt, index](const std::function<void()>& body) {
          DeviceGuard on(*rt, index);
          body();
        },
        why);
  }
  std::string direct_unavailable() override {
    DeviceGuard on(rt_, index_);  // cuFile's driver opens against a current context
    return cufile_unavailable();
  }

 private:
  const Runtime& rt_;
  int index_;
  mutable std::mutex mu_;
  // Pinned staging buffers kept for the next load (a load's readers take one each): (address,
  // size), under mu_.
  std::vector<std::pair<void*, uint64_t>> cached_;
  bool integrated_ = false, ats_ = false;
  std::map<uintptr_t, uint64_t> shared_;  // unified allocations -> size (under mu_)
};

}  // namespace

namespace cuda {

DeviceGuard::DeviceGuard(const Runtime& rt, int index) : rt_(rt) {
  int current = -1;
  if (cudaError e = rt_.GetDevice(&current); e != 0) {
    quiet(rt_, e);
    current = -1;
  }
  if (current == index) return;
  check(rt_, rt_.SetDevice(index), "cudaSetDevice", index);
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) quiet(rt_, rt_.SetDevice(previous_));
}

std::unique_ptr<CopyEngine> make_engine(const Runtime& rt, int index) {
  return std::make_unique<CudaEngine>(rt, index);
}

}  // namespace cuda

namespace {

std::mutex engines_mu;
std::map<int, CudaEngine*>& engines() {
  // Engines live until the process ends (their cached staging is pinned memory the runtime
  // frees at exit): never destroyed, so no static-destruction order issue with the runtime.
  static auto* m = new std::map<int, CudaEngine*>;
  return *m;
}

}  // namespace

CopyEngine& cuda_engine(int index) {
  std::lock_guard<std::mutex> lock(engines_mu);
  auto& m = engines();
  if (auto it = m.find(index); it != m.end()) return *it->second;
  if (std::string why = unavailable(index); !why.empty())
    throw Error(ErrorCode::kUnsupported,
                "cannot load into cuda:" + std::to_string(index) + ": " + why);
  auto* e = new CudaEngine(runtime(), index);
  m.emplace(index, e);
  return *e;
}

namespace {
std::atomic<CopyEngine*> override_engine{nullptr};
std::atomic<int64_t> override_delay_ms{0};  // until the first engine_for() of the override
}  // namespace

Device resolve_device(const Device& device) {
  if (!device.is_cuda() || device.index >= 0) return device;
  if (override_engine.load()) return Device::cuda(HostCopyEngine::current_device());
  const Runtime& rt = runtime();
  int current = 0;
  if (rt.handle) {
    if (cudaError e = rt.GetDevice(&current); e != 0) {
      quiet(rt, e);
      current = 0;
    }
  }
  return Device::cuda(current);
}

bool engine_ready(const Device& device) {
  if (override_engine.load()) return override_delay_ms.load() == 0;
  if (!device.is_cuda()) return true;  // engine_for throws at once
  const int index = resolve_device(device).index;
  std::lock_guard<std::mutex> lock(engines_mu);
  return engines().count(index) != 0;
}

CopyEngine& engine_for(const Device& device) {
  if (CopyEngine* e = override_engine.load()) {
    if (int64_t ms = override_delay_ms.exchange(0))
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return *e;
  }
  if (!device.is_cuda())
    throw Error(ErrorCode::kInvalidArgument, "no copy engine for device " + device.str());
  return cuda_engine(resolve_device(device).index);
}

void set_engine_override(CopyEngine* engine, std::chrono::milliseconds start_delay) {
  override_delay_ms.store(engine ? start_delay.count() : 0);
  override_engine.store(engine);
}

}  // namespace ckpt::internal

namespace ckpt {

std::string device_unavailable(const Device& device) {
  if (device.is_cpu()) return {};
  return internal::unavailable(internal::resolve_device(device).index);
}

std::string gds_unavailable(const Device& device) {
  if (device.is_cpu()) return "GPUDirect Storage reads into a CUDA device, not the cpu";
  try {
    return internal::engine_for(device).direct_unavailable();
  } catch (const Error& e) {
    return e.message();
  }
}

std::string describe_device(const Device& device) {
  if (device.is_cpu()) return "cpu";
  return internal::cuda_engine(internal::resolve_device(device).index).describe();
}

double time_pinned_copy(const Device& device, uint64_t bytes, int repeat) {
  internal::CopyEngine& e = internal::engine_for(device);
  auto host = e.staging(bytes);
  std::memset(host.get(), 1, bytes);
  auto dev = e.allocate(bytes);
  std::vector<double> t;
  for (int i = 0; i <= std::max(1, repeat); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto s = e.start(1, 1);
    s->copy(0, dev.get(), host.get(), bytes);
    s->finish();
    if (i)
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void copy_to_host(const Storage& storage, uint64_t offset, std::span<std::byte> dst) {
  if (offset > storage.info.nbytes || dst.size() > storage.info.nbytes - offset)
    throw Error(ErrorCode::kInvalidArgument,
                "copy_to_host: bytes [" + std::to_string(offset) + ", +" +
                    std::to_string(dst.size()) + ") are past the storage's " +
                    std::to_string(storage.info.nbytes),
                {}, storage.info.key);
  if (dst.empty()) return;
  if (storage.info.meta) {  // no bytes anywhere: zeros
    std::memset(dst.data(), 0, dst.size());
    return;
  }
  if (storage.on_host()) {
    std::memcpy(dst.data(), storage.data + offset, dst.size());
    return;
  }
  internal::engine_for(storage.device).to_host(dst.data(), storage.data + offset, dst.size());
}

uint64_t release_device_staging() {
  uint64_t n = 0;
  std::lock_guard<std::mutex> lock(internal::engines_mu);
  for (auto& [i, e] : internal::engines()) n += e->release_staging();
  return n;
}

}  // namespace ckpt
