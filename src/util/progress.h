#pragma once
// ProgressMeter: counts bytes done for a ProgressFn (include/ckpt/options.h) from any number of
// threads, and calls it at most once per interval, never from two threads at once, with `done`
// never going back; finish() makes the last call with done == total.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "ckpt/options.h"

namespace ckpt::internal {

class ProgressMeter {
 public:
  ProgressMeter(const ProgressFn& fn, uint64_t total,
                std::chrono::milliseconds every = std::chrono::milliseconds(100));
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  bool active() const { return fn_ != nullptr; }
  uint64_t total() const { return total_; }
  // `n` more bytes are done. Cheap when no call is due (one atomic add and a clock read).
  void add(uint64_t n) noexcept;
  // The last call: done == total. Once; later calls do nothing.
  void finish() noexcept;

 private:
  void report(uint64_t done) noexcept;

  const ProgressFn* fn_;
  const uint64_t total_;
  const int64_t every_ns_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_ns_;
  std::mutex mu_;
  uint64_t reported_ = 0;  // under mu_
  bool finished_ = false;  // under mu_
};

// A meter that counts into `meter` when it is non-null (a helper for optional progress).
inline void progress_add(ProgressMeter* meter, uint64_t n) noexcept {
  if (meter) meter->add(n);
}

}  // namespace ckpt::internal
