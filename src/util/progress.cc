#include "util/progress.h"

#include <algorithm>

namespace ckpt::internal {
namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ProgressMeter::ProgressMeter(const ProgressFn& fn, uint64_t total, std::chrono::milliseconds every)
    : fn_(fn ? &fn : nullptr),
      total_(total),
      every_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(every).count()),
      next_ns_(now_ns() + every_ns_) {}

void ProgressMeter::add(uint64_t n) noexcept {
  if (!fn_) return;
  const uint64_t done = done_.fetch_add(n, std::memory_order_relaxed) + n;
  const int64_t t = now_ns();
  int64_t due = next_ns_.load(std::memory_order_relaxed);
  if (t < due) return;
  // One thread wins the slot; the others go on reading.
  if (!next_ns_.compare_exchange_strong(due, t + every_ns_, std::memory_order_relaxed)) return;
  report(std::min(done, total_));
}

void ProgressMeter::report(uint64_t done) noexcept {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_ || done <= reported_) return;
  reported_ = done;
  (*fn_)(done, total_);
}

void ProgressMeter::finish() noexcept {
  if (!fn_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  reported_ = total_;
  (*fn_)(total_, total_);
}

}  // namespace ckpt::internal
