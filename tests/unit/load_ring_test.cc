// internal::RingBuffer (src/load/ring_buffer.h): the slot allocator behind streaming loads.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "load/ring_buffer.h"

namespace ckpt::internal {
namespace {

using namespace std::chrono_literals;
using Slot = RingBuffer::Slot;

// Returns once `flag` is set, or fails the test after `limit`.
bool eventually(const std::atomic<bool>& flag, std::chrono::milliseconds limit = 10s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(RingBuffer, ArenaAndFootprints) {
  RingBuffer ring(1000);
  EXPECT_EQ(ring.capacity(), 1000u);
  ASSERT_NE(ring.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ring.data()) % 64, 0u);
  EXPECT_EQ(ring.arena().get(), ring.data());
  EXPECT_EQ(RingBuffer::footprint(0), 0u);
  EXPECT_EQ(RingBuffer::footprint(1), 64u);
  EXPECT_EQ(RingBuffer::footprint(64), 64u);
  EXPECT_EQ(RingBuffer::footprint(65), 128u);
  EXPECT_TRUE(ring.fits(960));
  EXPECT_FALSE(ring.fits(961));  // 1024 > 1000
  EXPECT_FALSE(ring.fits(UINT64_MAX));
  EXPECT_THROW(ring.acquire(961), Error);
  EXPECT_THROW({ RingBuffer huge(UINT64_MAX); }, Error);
  RingBuffer tiny(0);  // nothing but zero-length slots fits
  EXPECT_FALSE(tiny.fits(1));
  auto z = tiny.try_acquire(0);
  ASSERT_TRUE(z);
  EXPECT_EQ(z->offset, 0u);
}

TEST(RingBuffer, FifoOrderAndTags) {
  RingBuffer ring(4096);
  std::vector<Slot> got;
  for (uint64_t i = 0; i < 5; ++i) {
    auto s = ring.acquire(100 + i, 10 + i);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->size, 100 + i);
    EXPECT_EQ(s->tag, 10 + i);
    EXPECT_EQ(s->offset, i * 128);  // packed back to back, 64-byte aligned
    EXPECT_EQ(s->data, ring.data() + s->offset);
    got.push_back(*s);
  }
  EXPECT_EQ(ring.live_slots(), 5u);
  EXPECT_EQ(ring.live_bytes(), 5u * 128);
  // Commits mark the oldest uncommitted slot; the consumer sees them in acquisition order.
  ring.commit();
  ring.commit();
  for (int i = 0; i < 2; ++i) {
    auto r = ring.wait_ready();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->tag, got[i].tag);
    EXPECT_EQ(r->offset, got[i].offset);
    auto again = ring.wait_ready();  // same slot until released
    ASSERT_TRUE(again);
    EXPECT_EQ(again->tag, got[i].tag);
    ring.release();
  }
  EXPECT_THROW(ring.release(), std::logic_error);  // slot 2 is not committed
  ring.commit();
  ring.commit();
  ring.commit();
  EXPECT_THROW(ring.commit(), std::logic_error);  // nothing left to commit
  for (int i = 2; i < 5; ++i) {
    auto r = ring.wait_ready();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->tag, got[i].tag);
    ring.release();
  }
  EXPECT_EQ(ring.live_slots(), 0u);
  EXPECT_EQ(ring.live_bytes(), 0u);
  // Empty again: the next slot starts at 0.
  auto s = ring.acquire(1);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->offset, 0u);
}

TEST(RingBuffer, WrapAround) {
  RingBuffer ring(512);
  auto a = ring.try_acquire(128, 0), b = ring.try_acquire(128, 1), c = ring.try_acquire(128, 2);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(c->offset, 256u);
  for (int i = 0; i < 3; ++i) ring.commit();
  ASSERT_TRUE(ring.wait_ready());
  ring.release();  // a: [0, 128) is free; live [128, 384)
  // 192 bytes: not after the head (384 + 192 > 512), not before the oldest (128 < 192).
  EXPECT_FALSE(ring.try_acquire(192, 3));
  ASSERT_TRUE(ring.wait_ready());
  ring.release();  // b: live [256, 384)
  auto d = ring.try_acquire(192, 3);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->offset, 0u);  // wrapped
  // Wrapped: only the gap [192, 256) before the oldest slot is free; [384, 512) stays unused.
  EXPECT_FALSE(ring.try_acquire(65, 4));
  auto e = ring.try_acquire(64, 4);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 192u);
  EXPECT_FALSE(ring.try_acquire(64, 5));
  auto zero = ring.try_acquire(0, 5);  // a zero-length slot always fits, and never wraps
  ASSERT_TRUE(zero);
  EXPECT_EQ(zero->offset, 256u);
  for (int i = 0; i < 3; ++i) ring.commit();
  auto r = ring.wait_ready();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tag, 2u);
  ring.release();  // c: the run unwraps, live [0, 256)
  auto f = ring.try_acquire(256, 6);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 256u);
  EXPECT_EQ(ring.live_bytes(), 512u);
  EXPECT_FALSE(ring.try_acquire(1, 7));
}

TEST(RingBuffer, SlotOfExactlyTheCapacity) {
  RingBuffer ring(1024);
  auto a = ring.try_acquire(1024, 0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_FALSE(ring.try_acquire(1, 1));
  auto z = ring.try_acquire(0, 1);  // zero-length: at the end, one past the last byte
  ASSERT_TRUE(z);
  EXPECT_EQ(z->offset, 1024u);
  ring.commit();
  ring.commit();
  ASSERT_TRUE(ring.wait_ready());
  ring.release();
  // Live: only the zero-length slot at 1024; a full-size slot fits again, at 0.
  auto b = ring.try_acquire(1024, 2);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->offset, 0u);
  ring.commit();
  for (uint64_t tag : {1u, 2u}) {
    auto r = ring.wait_ready();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->tag, tag);
    ring.release();
  }
  // A capacity that is no multiple of 64: the last partial line is never used.
  RingBuffer odd(1000);
  auto c = odd.try_acquire(960);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->offset, 0u);
  EXPECT_FALSE(odd.try_acquire(1));
}

TEST(RingBuffer, BlockedProducerResumesWhenTheConsumerReleases) {
  RingBuffer ring(256);
  ASSERT_TRUE(ring.acquire(200, 0));
  ring.commit();
  std::atomic<bool> returned{false};
  std::optional<Slot> got;
  std::thread producer([&] {
    got = ring.acquire(100, 1);  // 256 - 256 bytes used: waits
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned.load());
  auto r = ring.wait_ready();
  ASSERT_TRUE(r);
  ring.release();
  EXPECT_TRUE(eventually(returned));
  producer.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->offset, 0u);
  EXPECT_EQ(got->tag, 1u);
}

TEST(RingBuffer, BlockedConsumerResumesOnCommit) {
  RingBuffer ring(256);
  std::atomic<bool> returned{false};
  std::optional<Slot> got;
  std::thread consumer([&] {
    got = ring.wait_ready();
    returned = true;
  });
  auto s = ring.acquire(10, 42);
  ASSERT_TRUE(s);
  std::memset(s->data, 0x5A, 10);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned.load());  // acquired is not ready
  ring.commit();
  EXPECT_TRUE(eventually(returned));
  consumer.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tag, 42u);
  EXPECT_EQ(got->data[9], std::byte{0x5A});
}

TEST(RingBuffer, StopUnblocksBothSides) {
  {
    RingBuffer ring(128);
    ASSERT_TRUE(ring.acquire(128));
    std::atomic<bool> returned{false};
    std::optional<Slot> got = Slot{};
    std::thread producer([&] {
      got = ring.acquire(64);
      returned = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(returned.load());
    ring.stop();
    EXPECT_TRUE(eventually(returned));
    producer.join();
    EXPECT_FALSE(got);
    EXPECT_TRUE(ring.stopped());
    EXPECT_FALSE(ring.failure());
    EXPECT_NO_THROW(ring.rethrow_if_failed());
  }
  {
    RingBuffer ring(128);
    std::atomic<bool> returned{false};
    std::optional<Slot> got = Slot{};
    std::thread consumer([&] {
      got = ring.wait_ready();
      returned = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(returned.load());
    ring.stop();
    EXPECT_TRUE(eventually(returned));
    consumer.join();
    EXPECT_FALSE(got);
  }
  {
    // After stop both sides end at once, ready slots or room notwithstanding.
    RingBuffer ring(1024);
    ASSERT_TRUE(ring.acquire(64));
    ring.commit();
    ring.stop();
    ring.stop();  // idempotent
    EXPECT_FALSE(ring.wait_ready());
    EXPECT_FALSE(ring.acquire(64));
    EXPECT_FALSE(ring.try_acquire(64));
    EXPECT_NO_THROW(ring.release());  // the committed slot can still be given back
  }
}

TEST(RingBuffer, CloseDrainsThenEnds) {
  RingBuffer ring(1024);
  std::vector<uint64_t> seen;
  std::thread consumer([&] {
    while (auto s = ring.wait_ready()) {
      seen.push_back(s->tag);
      ring.release();
    }
  });
  for (uint64_t i = 0; i < 100; ++i) {
    auto s = ring.acquire(300, i);
    ASSERT_TRUE(s);
    ring.commit();
  }
  ring.close();
  consumer.join();
  ASSERT_EQ(seen.size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_THROW(ring.acquire(1), std::logic_error);
  EXPECT_FALSE(ring.wait_ready());
}

TEST(RingBuffer, ProducerFailurePropagates) {
  RingBuffer ring(256);
  std::thread producer([&] {
    try {
      for (uint64_t i = 0;; ++i) {
        auto s = ring.acquire(64, i);
        if (!s) return;
        if (i == 3) throw Error(ErrorCode::kCorrupt, "storage 3 is bad");
        ring.commit();
      }
    } catch (...) {
      ring.fail(std::current_exception());
    }
  });
  std::vector<uint64_t> seen;
  while (auto s = ring.wait_ready()) {
    seen.push_back(s->tag);
    ring.release();
  }
  producer.join();
  EXPECT_LE(seen.size(), 3u);  // slots 0-2 may or may not have been consumed before the failure
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
  EXPECT_TRUE(ring.stopped());
  ASSERT_TRUE(ring.failure());
  try {
    ring.rethrow_if_failed();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("storage 3 is bad"), std::string::npos);
  }
  // The first failure wins.
  ring.fail(std::make_exception_ptr(std::runtime_error("later")));
  EXPECT_THROW(ring.rethrow_if_failed(), Error);
}

TEST(RingBuffer, ConsumerFailureStopsProducer) {
  RingBuffer ring(256);
  std::atomic<int> produced{0};
  std::thread producer([&] {
    while (auto s = ring.acquire(100)) {
      ++produced;
      ring.commit();
    }
  });
  try {
    auto s = ring.wait_ready();
    ASSERT_TRUE(s);
    throw std::runtime_error("callback failed");
  } catch (const std::runtime_error&) {
    ring.stop();  // what the consumer does with its own exception before rethrowing it
  }
  producer.join();                // would hang if the blocked producer were not woken
  EXPECT_LE(produced.load(), 2);  // two slots fit; none after the stop
  EXPECT_FALSE(ring.failure());
}

// Random sizes (zero, tiny, up to the whole capacity) through a producer and a consumer thread.
// Every slot is filled with a pattern of its tag; the consumer checks its bytes, the FIFO order,
// alignment and bounds, and a shadow map of live ranges (entered after acquire, left before
// release, so it covers every live slot) catches any two live slots that overlap.
TEST(RingBuffer, RandomizedStressNoLiveSlotsOverlap) {
  constexpr uint64_t kCapacity = 64 * 1024 + 450;  // no multiple of 64
  constexpr uint64_t kSlots = 20000;
  RingBuffer ring(kCapacity);
  std::mutex shadow_mu;
  std::map<uint64_t, uint64_t> shadow;  // offset -> end, non-empty live slots
  std::atomic<bool> overlap{false}, out_of_bounds{false};
  auto pattern = [](uint64_t tag) { return static_cast<std::byte>((tag * 131 + 7) & 0xFF); };

  std::thread producer([&] {
    std::mt19937_64 rng(12345);
    try {
      for (uint64_t tag = 0; tag < kSlots; ++tag) {
        uint64_t len;
        switch (rng() % 6) {
          case 0:
            len = 0;
            break;
          case 1:
            len = 1 + rng() % 64;
            break;
          case 2:
            len = kCapacity - rng() % 512;  // near or at the whole ring
            if (!ring.fits(len)) len = kCapacity / 64 * 64;
            break;
          default:
            len = rng() % (kCapacity / 3);
        }
        auto s = ring.acquire(len, tag);
        if (!s) return;
        if (s->offset % 64 != 0 || s->offset + len > kCapacity ||
            s->data != ring.data() + s->offset)
          out_of_bounds = true;
        if (len > 0) {
          std::lock_guard<std::mutex> lock(shadow_mu);
          uint64_t end = s->offset + RingBuffer::footprint(len);
          auto next = shadow.lower_bound(s->offset);
          if (next != shadow.end() && next->first < end) overlap = true;
          if (next != shadow.begin() && std::prev(next)->second > s->offset) overlap = true;
          shadow[s->offset] = end;
        }
        std::memset(s->data, static_cast<int>(pattern(tag)), len);
        if (rng() % 64 == 0) std::this_thread::yield();
        ring.commit();
      }
      ring.close();
    } catch (...) {
      ring.fail(std::current_exception());
    }
  });

  std::mt19937_64 rng(678);
  uint64_t expect = 0, bad_bytes = 0, max_live = 0;
  while (auto s = ring.wait_ready()) {
    EXPECT_EQ(s->tag, expect);
    ++expect;
    max_live = std::max(max_live, ring.live_bytes());
    const std::byte want = pattern(s->tag);
    for (uint64_t i = 0; i < s->size; ++i) bad_bytes += s->data[i] != want;
    if (s->size > 0) {
      std::lock_guard<std::mutex> lock(shadow_mu);
      shadow.erase(s->offset);
    }
    if (rng() % 64 == 0) std::this_thread::yield();
    ring.release();
  }
  producer.join();
  EXPECT_NO_THROW(ring.rethrow_if_failed());
  EXPECT_EQ(expect, kSlots);
  EXPECT_EQ(bad_bytes, 0u);
  EXPECT_FALSE(overlap.load());
  EXPECT_FALSE(out_of_bounds.load());
  EXPECT_LE(max_live, kCapacity);
  EXPECT_EQ(ring.live_slots(), 0u);
}

}  // namespace
}  // namespace ckpt::internal
