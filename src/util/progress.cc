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

namespace ckpt {

ProgressThrottle::ProgressThrottle(std::chrono::steady_clock::duration every,
                                   std::chrono::steady_clock::duration delay)
    : every_(every), delay_(delay), start_(std::chrono::steady_clock::now()) {}

std::unique_lock<std::mutex> ProgressThrottle::due(uint64_t done, uint64_t total, bool last) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (last)
    lock.lock();
  else if (!lock.try_lock())
    return lock;
  const auto now = std::chrono::steady_clock::now();
  const bool early = !shown_ && now - start_ < delay_;
  const bool show = last ? !early && !(last_shown_ && done == last_done_ && total == last_total_)
                         : !early && (!shown_ || now - shown_at_ >= every_);
  if (!show) {
    lock.unlock();
    return lock;
  }
  shown_ = true;
  shown_at_ = now;
  last_shown_ = last;
  last_done_ = done;
  last_total_ = total;
  return lock;
}

void ProgressThrottle::restart() {
  std::lock_guard<std::mutex> lock(mu_);
  last_shown_ = false;
}

}  // namespace ckpt
