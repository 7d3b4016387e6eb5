#pragma once
// CopyEngine: what a device load needs from a device, and nothing more — device memory, host
// staging memory the device copies from asynchronously, and asynchronous host-to-device copies
// on a few lanes (CUDA streams) with a completion mark per staging slot.
//
// The load pipeline (src/load/device_load.cc) is written against this interface only, so its
// staging, ordering, overlap, memory bound, error and cancellation logic runs in the unit tests
// on a HostCopyEngine (memcpy on worker threads, with injected delays and failures). The CUDA
// engine (cuda_engine.cc) is the only part that needs a GPU.
//
// Threads: an engine is shared by every load into its device (thread-safe). A CopySession is one
// load's: its slots are used by that load's reader threads, each slot by one thread at a time
// (different slots from different threads at once is the normal case).
//
// Layer: base (src/device), beside io; it knows nothing of formats or plans.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ckpt/device.h"

namespace ckpt::internal {

class CopySession {
 public:
  virtual ~CopySession() = default;  // waits for every queued copy (errors dropped)
  // Queues a copy of `n` bytes from host `src` (inside staging memory of the same engine) to
  // device `dst`, on lane `slot % lanes`, after that lane's earlier copies, and marks `slot`:
  // wait(slot) returns once this copy is done. Returns at once. Throws Error on a failure the
  // engine reports at queueing time.
  virtual void copy(int slot, std::byte* dst, const std::byte* src, uint64_t n) = 0;
  // Blocks until the last copy marked with `slot` is done; no-op if none is queued. Throws Error
  // (kIo, naming the device) if it failed.
  virtual void wait(int slot) = 0;
  // Waits for every queued copy; throws the first failure.
  virtual void finish() = 0;
};

// Reads of one open file straight into device memory (GPUDirect Storage), from any thread.
class DirectFile {
 public:
  virtual ~DirectFile() = default;
  // Reads [offset, offset + n) of the file into device memory `dst`. Throws Error{kIo} naming
  // the offset.
  virtual void read(uint64_t offset, std::byte* dst, uint64_t n) = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  // Device memory of `bytes` (at least 256-byte aligned), freed when the last copy of the owner
  // dies. Throws Error{kLimitExceeded} when the device lacks it, naming the sizes.
  virtual std::shared_ptr<std::byte> allocate(uint64_t bytes) = 0;
  // Host memory the engine copies from asynchronously (pinned for CUDA), reused between loads:
  // the buffer returns to the engine's cache when the owner dies. Throws Error{kLimitExceeded}.
  virtual std::shared_ptr<std::byte> staging(uint64_t bytes) = 0;
  // A session of `slots` slots over `lanes` lanes (streams).
  virtual std::unique_ptr<CopySession> start(int slots, int lanes) = 0;
  // Synchronous copies, for checks and tests: device to host, and host to device (any host
  // memory).
  virtual void to_host(std::byte* dst, const std::byte* src, uint64_t n) = 0;
  virtual void to_device(std::byte* dst, const std::byte* src, uint64_t n) = 0;
  // Staging memory cached now, and releasing it (returns the bytes released).
  virtual uint64_t cached_staging() const = 0;
  virtual uint64_t release_staging() = 0;
  // Optional: direct reads of the open file `fd` (kept open by the caller while the result
  // lives) into this engine's device memory. Null with `why` set when the engine has none; the
  // load then reads through staging.
  virtual std::unique_ptr<DirectFile> open_direct(int fd, std::string& why) {
    (void)fd;
    why = "this engine reads through host memory only";
    return nullptr;
  }
  // The device's free memory now (cudaMemGetInfo), for budgets decided before a load allocates.
  virtual uint64_t free_bytes() = 0;
  // Whether allocate() returns memory the host reads and writes directly, that the device uses
  // where it lies (a device sharing the host's memory: CUDA's integrated GPUs): a load then
  // reads the file straight into it, with no staging and no copy. host_accessible(p): whether
  // device address `p` is such memory of this engine (a caller's allocation is not assumed to be).
  virtual bool unified() const { return false; }
  virtual bool host_accessible(const std::byte* p) const {
    (void)p;
    return false;
  }
  // Why open_direct() returns null whatever the file ("" when it may succeed).
  virtual std::string direct_unavailable() { return "this engine reads through host memory only"; }
};

// Adds to gds_bytes_read() and unified_bytes_loaded() (include/ckpt/device.h).
void count_direct_bytes(uint64_t n);
void count_unified_bytes(uint64_t n);

// The engine of a CUDA device, shared process-wide (created on first use). Throws
// Error{kUnsupported} naming what is missing (no runtime library, no such device).
CopyEngine& cuda_engine(int index);
// `device` with its index: "cuda" (Device::current_cuda()) is the device current on this thread
// (cudaGetDevice, at the time of the call; the host engine's current_device() under a test
// override; 0 without a CUDA runtime). Other devices as they are.
Device resolve_device(const Device& device);
// The engine loads into `device` use: the test override when one is set, else cuda_engine().
CopyEngine& engine_for(const Device& device);
// Whether engine_for(device) returns at once: its engine exists already (creating a CUDA engine
// creates the device's context, hundreds of milliseconds), or a test override is started.
bool engine_ready(const Device& device);
// Tests: every device load goes to `engine` (nullptr: back to CUDA). The first engine_for()
// after this takes `start_delay` (as creating a CUDA context does), and engine_ready() is false
// until it returns. Not for concurrent use with loads in flight.
void set_engine_override(CopyEngine* engine,
                         std::chrono::milliseconds start_delay = std::chrono::milliseconds(0));

// For tests: host memory posing as a device. Copies run on one worker thread per lane, each after
// `delay_us`; the copy number `fail_at` (counted from 1 over the engine's life; 0: never) fails
// with Error{kIo}. `staging_peak()` is the most staging memory held at once.
struct HostEngineOptions {
  uint32_t delay_us = 0;
  uint64_t fail_at = 0;
  uint64_t device_bytes = UINT64_MAX;  // allocate() beyond this throws kLimitExceeded
  uint64_t free_bytes = UINT64_MAX;    // what free_bytes() reports (less what is allocated)
  bool direct = false;                 // open_direct(): pread straight into "device" memory
  bool direct_fails = false;           // ... whose reads all fail with Error{kIo}
  // Pose as a device sharing the host's memory (CopyEngine::unified): allocate() returns plain
  // host memory the host may touch.
  bool unified = false;
  // Called by staging() first, with its number (counted from 1 over the engine's life), on the
  // calling thread: a test's hook to make staging slow or to watch its order.
  std::function<void(uint64_t)> on_staging = {};
};
class HostCopyEngine : public CopyEngine {
 public:
  explicit HostCopyEngine(HostEngineOptions options = {});
  ~HostCopyEngine() override;
  Device device() const override { return Device::cuda(0); }
  std::string describe() const override { return "host copy engine (test)"; }
  std::shared_ptr<std::byte> allocate(uint64_t bytes) override;
  std::shared_ptr<std::byte> staging(uint64_t bytes) override;
  std::unique_ptr<CopySession> start(int slots, int lanes) override;
  void to_host(std::byte* dst, const std::byte* src, uint64_t n) override;
  void to_device(std::byte* dst, const std::byte* src, uint64_t n) override;
  uint64_t cached_staging() const override;
  uint64_t release_staging() override;
  std::unique_ptr<DirectFile> open_direct(int fd, std::string& why) override;
  std::string direct_unavailable() override;
  uint64_t free_bytes() override;
  bool unified() const override;
  bool host_accessible(const std::byte* p) const override;
  // The fake's current device of this thread (cudaGetDevice/cudaSetDevice), 0 until set.
  static int current_device();
  static void set_current_device(int index);
  // Whether `p` lies in memory this engine allocated (device memory the host must not touch).
  bool owns(const std::byte* p) const;

  uint64_t staging_peak() const;
  uint64_t staging_calls() const;  // staging() calls so far
  uint64_t direct_bytes() const;   // read by open_direct()'s files
  uint64_t device_in_use() const;
  uint64_t copies() const;     // copies queued so far
  int max_lanes_busy() const;  // the most lanes copying at one moment (overlap)

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ckpt::internal
