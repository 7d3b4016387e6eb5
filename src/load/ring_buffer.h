#pragma once
// A bounded FIFO of byte slots carved out of one arena: the memory behind a streaming load. A
// producer thread acquires a slot, fills it and commits it; a consumer thread takes the slots in
// the order they were acquired and releases each when done with it. The arena never grows, so
// the bytes in flight never exceed the capacity.
//
// Allocation: a slot takes footprint(len) = align_up(len, 64) bytes (so every slot starts on a
// 64-byte boundary of the arena) right after the newest slot, or at offset 0 when the rest of
// the arena is too short (wrapping) and the oldest slot starts at least that far in. Space is
// reclaimed only from the oldest slot (release() frees the front of the FIFO), so the live slots
// always form one run, possibly wrapped: [oldest, ...) + [0, ..., newest); the bytes between the
// last slot before a wrap and the end of the arena stay unused until the run unwraps. A slot
// never wraps: it is contiguous. A zero-length slot occupies nothing (its data may point one past
// the arena's last slot) and never causes a wrap.
//
// Invariants (checked by tests/unit/ckpt_ring_test.cc):
//   - no two live slots (acquired and not yet released) overlap; each lies inside [0, capacity);
//   - slots are committed, handed out by wait_ready() and released in acquisition order;
//   - a slot whose footprint is at most the capacity is always granted eventually, provided the
//     consumer keeps releasing: with no slot live, any such slot fits at offset 0.
//
// Thread safety: every member function may be called from any thread (one mutex guards the
// state), but the protocol assumes ONE producer (acquire, then commit, in that order, for each
// slot) and ONE consumer (wait_ready, then release). stop(), fail() and close() may come from
// either side or from a third thread. The RingBuffer must outlive both threads' use of it: join
// the producer before destroying it. Slot bytes are written by the producer before commit() and
// read by the consumer after wait_ready(): the mutex orders the two, nothing else is needed.
//
// Ending:
//   - close(): the producer has nothing more; the consumer drains the committed slots, then
//     wait_ready() returns nullopt.
//   - stop(): either side gives up now; acquire() and wait_ready() return nullopt at once (also
//     when they are already blocked), even if committed slots remain.
//   - fail(e): stop() that also records `e` (the first failure wins); rethrow_if_failed()
//     throws it.
// A typical streaming loop:
//
//   RingBuffer ring(budget);
//   std::thread producer([&] {
//     try {
//       for (auto& item : items) {
//         auto slot = ring.acquire(item.size, item.id);
//         if (!slot) return;                        // the consumer stopped
//         fill(item, slot->data);
//         ring.commit();
//       }
//       ring.close();
//     } catch (...) { ring.fail(std::current_exception()); }
//   });
//   try {
//     while (auto slot = ring.wait_ready()) { use(*slot); ring.release(); }
//   } catch (...) { ring.stop(); producer.join(); throw; }
//   producer.join();
//   ring.rethrow_if_failed();

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

#include "util/bytes.h"

namespace ckpt::internal {

class RingBuffer {
 public:
  static constexpr uint64_t kAlign = kStorageAlign;  // 64

  struct Slot {
    uint64_t offset = 0;        // in the arena; a multiple of kAlign
    uint64_t size = 0;          // the length asked for (the slot occupies footprint(size) bytes)
    std::byte* data = nullptr;  // arena() + offset
    uint64_t tag = 0;           // the caller's, from acquire()
  };

  // Bytes a slot of `len` bytes occupies: len rounded up to kAlign.
  static constexpr uint64_t footprint(uint64_t len) noexcept { return align_up(len, kAlign); }

  // Allocates the arena (util/arena.h: huge pages when large, 64-byte aligned, not touched):
  // max(capacity, 64) bytes. Throws Error{kIo} when out of memory, Error{kInvalidArgument} when
  // `capacity` is above 2^62.
  explicit RingBuffer(uint64_t capacity);
  RingBuffer(const RingBuffer&) = delete;
  RingBuffer& operator=(const RingBuffer&) = delete;

  uint64_t capacity() const noexcept { return capacity_; }
  // True when a slot of `len` bytes can ever be granted (footprint(len) <= capacity()).
  bool fits(uint64_t len) const noexcept { return len <= capacity_ && footprint(len) <= capacity_; }
  std::byte* data() const noexcept { return arena_.get(); }
  // The arena's owner: a Storage made over a slot keeps it alive with this (its bytes are reused
  // once the slot is released, but the memory stays valid).
  const std::shared_ptr<std::byte>& arena() const noexcept { return arena_; }

  // Producer. Blocks until footprint(len) bytes are free, appends the slot to the FIFO (not ready
  // yet) and returns it. Returns nullopt once stopped (or when stopped while waiting).
  // Throws Error{kInvalidArgument} if !fits(len) (it would wait forever) and std::logic_error
  // after close().
  std::optional<Slot> acquire(uint64_t len, uint64_t tag = 0);
  // Producer. acquire() that does not wait: nullopt when there is no room now or once stopped.
  std::optional<Slot> try_acquire(uint64_t len, uint64_t tag = 0);
  // Producer. Marks the oldest acquired, not yet committed slot ready and wakes the consumer.
  // Allowed after stop() (it then changes nothing the consumer sees). std::logic_error if every
  // acquired slot is already committed.
  void commit();
  // Producer. No slot follows: wait_ready() returns nullopt once the committed slots are
  // consumed. Slots acquired and never committed are dropped from the consumer's view.
  void close();

  // Consumer. Blocks until the oldest slot is committed and returns it (the same slot again if
  // called twice without release()). Returns nullopt when stopped or failed (at once, even with
  // ready slots left), or when closed and no committed slot is left.
  std::optional<Slot> wait_ready();
  // Consumer. Frees the oldest slot (the one wait_ready() returned) and wakes the producer.
  // std::logic_error if the oldest slot is not committed (or there is none).
  void release();

  // Either side: wake and end both sides (see above). Idempotent.
  void stop();
  // Either side: record `failure` (only the first one is kept) and stop().
  void fail(std::exception_ptr failure);
  // Rethrows the recorded failure, if any.
  void rethrow_if_failed() const;
  bool stopped() const;
  std::exception_ptr failure() const;

  // Slots live (acquired, not released) and bytes they occupy (footprints), for tests and stats.
  size_t live_slots() const;
  uint64_t live_bytes() const;

 private:
  std::optional<Slot> acquire_impl(uint64_t len, uint64_t tag, bool wait);
  // Offset where a slot of `need` bytes (a footprint) fits now, or nullopt. Holds mu_.
  std::optional<uint64_t> place(uint64_t need) const;

  uint64_t capacity_;
  std::shared_ptr<std::byte> arena_;

  mutable std::mutex mu_;
  std::condition_variable room_;   // producer waits: a release freed space, or stopped
  std::condition_variable ready_;  // consumer waits: a commit, close, or stopped
  struct Entry {
    Slot slot;
    uint64_t footprint;
    bool starts_lap;  // placed at 0 by wrapping while older slots were live
  };
  std::deque<Entry> fifo_;  // live slots, oldest first
  size_t committed_ = 0;    // slots at the front of fifo_ that are committed
  uint64_t live_bytes_ = 0;
  // The live run wraps: fifo_ holds a starts_lap slot behind older ones. There is at most one lap
  // boundary, since a wrapped run only grows up to the oldest slot's offset.
  bool wrapped_ = false;
  bool stopped_ = false;
  bool closed_ = false;
  std::exception_ptr failure_;
};

}  // namespace ckpt::internal
