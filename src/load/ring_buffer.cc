#include "load/ring_buffer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ckpt/error.h"
#include "util/arena.h"

namespace ckpt::internal {

namespace {
constexpr uint64_t kMaxCapacity = uint64_t{1} << 62;
}

RingBuffer::RingBuffer(uint64_t capacity) : capacity_(capacity) {
  if (capacity > kMaxCapacity)
    throw Error(ErrorCode::kInvalidArgument,
                "ring buffer of " + std::to_string(capacity) + " bytes is too large");
  arena_ = allocate_arena(static_cast<size_t>(std::max<uint64_t>(capacity, kAlign)));
}

std::optional<uint64_t> RingBuffer::place(uint64_t need) const {
  if (fifo_.empty()) return 0;
  const uint64_t tail = fifo_.front().slot.offset;
  const uint64_t head = fifo_.back().slot.offset + fifo_.back().footprint;
  if (wrapped_) {
    // Live: [tail, end of the older lap) + [0, head); only the gap [head, tail) is free.
    if (head + need <= tail) return head;
    return std::nullopt;
  }
  // Live: [tail, head); free: [head, capacity) and [0, tail).
  if (head + need <= capacity_) return head;
  if (need <= tail) return 0;
  return std::nullopt;
}

std::optional<RingBuffer::Slot> RingBuffer::acquire(uint64_t len, uint64_t tag) {
  return acquire_impl(len, tag, true);
}

std::optional<RingBuffer::Slot> RingBuffer::try_acquire(uint64_t len, uint64_t tag) {
  return acquire_impl(len, tag, false);
}

std::optional<RingBuffer::Slot> RingBuffer::acquire_impl(uint64_t len, uint64_t tag, bool wait) {
  if (!fits(len))
    throw Error(ErrorCode::kInvalidArgument, "a slot of " + std::to_string(len) +
                                                 " bytes does not fit a ring buffer of " +
                                                 std::to_string(capacity_) + " bytes");
  const uint64_t need = footprint(len);
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) throw std::logic_error("RingBuffer::acquire after close");
  std::optional<uint64_t> off;
  auto done = [&] {
    if (stopped_) return true;
    off = place(need);
    return off.has_value();
  };
  if (wait)
    room_.wait(lock, done);
  else if (!done())
    return std::nullopt;
  if (stopped_) return std::nullopt;
  // A slot at 0 behind live slots further on starts a new lap (a zero-length slot never wraps:
  // it always fits at the head).
  const bool starts_lap = !fifo_.empty() && !wrapped_ && *off == 0;
  if (starts_lap) wrapped_ = true;
  Slot slot{*off, len, arena_.get() + *off, tag};
  fifo_.push_back({slot, need, starts_lap});
  live_bytes_ += need;
  return slot;
}

void RingBuffer::commit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (committed_ >= fifo_.size()) throw std::logic_error("RingBuffer::commit without a slot");
  ++committed_;
  ready_.notify_all();
}

void RingBuffer::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  ready_.notify_all();
}

std::optional<RingBuffer::Slot> RingBuffer::wait_ready() {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [&] { return stopped_ || committed_ > 0 || closed_; });
  if (stopped_ || committed_ == 0) return std::nullopt;
  return fifo_.front().slot;
}

void RingBuffer::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (committed_ == 0) throw std::logic_error("RingBuffer::release without a ready slot");
  live_bytes_ -= fifo_.front().footprint;
  fifo_.pop_front();
  --committed_;
  if (fifo_.empty() || fifo_.front().starts_lap) {
    // The older lap is gone: the run no longer wraps.
    if (!fifo_.empty()) fifo_.front().starts_lap = false;
    wrapped_ = false;
  }
  room_.notify_all();
}

void RingBuffer::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  room_.notify_all();
  ready_.notify_all();
}

void RingBuffer::fail(std::exception_ptr failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) failure_ = std::move(failure);
  stopped_ = true;
  room_.notify_all();
  ready_.notify_all();
}

void RingBuffer::rethrow_if_failed() const {
  std::exception_ptr f = failure();
  if (f) std::rethrow_exception(f);
}

bool RingBuffer::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

std::exception_ptr RingBuffer::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

size_t RingBuffer::live_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fifo_.size();
}

uint64_t RingBuffer::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

}  // namespace ckpt::internal
