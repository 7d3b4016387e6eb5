// A device load's set-up overlapping its first reads, on the host copy engine: a per-storage
// allocator's memory is made in plan order in batches while the first storages are read (a copy
// waits only for its own destination), each reader makes its own staging buffer, a failure midway
// allocates nothing more and frees everything, and CKPT_DEVICE_OVERLAP=0 makes everything first.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "ckpt/ckpt.h"
#include "device/copy_engine.h"
#include "device_test_util.h"
#include "load/device_load.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::HostCopyEngine;
using internal::HostEngineOptions;
using test::UseEngine;

// `n` float32 tensors of `elems` + i elements (growing: the plan's order shows in the sizes).
struct Model {
  test::TempDir dir;
  std::string path = dir.file("m.safetensors");
  explicit Model(size_t n, size_t elems = 50000) {
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> v(elems + i);
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 7919 + k);
      char name[8];
      std::snprintf(name, sizeof name, "t%02zu", i);
      tensors.push_back(Tensor::copy_of(name, DType::kFloat32, {static_cast<int64_t>(v.size())},
                                        std::as_bytes(std::span<const float>(v))));
    }
    save_safetensors(path, tensors);
  }
};

void expect_same(internal::CopyEngine& e, const std::vector<Tensor>& dev,
                 const std::vector<Tensor>& host) {
  ASSERT_EQ(dev.size(), host.size());
  for (size_t i = 0; i < dev.size(); ++i) {
    std::vector<std::byte> got(dev[i].info().nbytes());
    e.to_host(got.data(), dev[i].data(), got.size());
    EXPECT_EQ(std::memcmp(got.data(), host[i].data(), got.size()), 0) << dev[i].name();
  }
}

// CKPT_DEVICE_OVERLAP=0 for a scope.
struct NoOverlap {
  NoOverlap() { ::setenv("CKPT_DEVICE_OVERLAP", "0", 1); }
  ~NoOverlap() { ::unsetenv("CKPT_DEVICE_OVERLAP"); }
};

// Waits up to `limit` for a copy beyond the engine's first `before`; whether there was one.
bool copied_within(HostCopyEngine& e, std::chrono::milliseconds limit, uint64_t before = 0) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (e.copies() == before && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return e.copies() > before;
}

// A slow per-storage allocator over the engine's memory that records its calls: each allocation
// sleeps; the last one (of `expect`) first waits a while for a copy, and notes whether one came;
// allocation number `fail_at` gives nothing (or throws, with `throws`).
struct SlowAllocator : DeviceAllocator {
  SlowAllocator(HostCopyEngine& e, size_t expect) : engine(e), expect(expect), before(e.copies()) {}
  void* allocate(uint64_t bytes, const Device&) override {
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu);
    const size_t number = sizes.size() + 1;
    sizes.push_back(bytes);
    copies_then.push_back(engine.copies());
    if (number == fail_at) {
      if (throws) throw std::runtime_error("out of memory (test)");
      return nullptr;
    }
    if (number == expect) last_waited = copied_within(engine, wait_last, before);
    auto p = engine.allocate(bytes);
    live[p.get()] = p;
    return p.get();
  }
  void allocate_all(std::span<const uint64_t> s, const Device& d, std::span<void*> out) override {
    ++calls;
    DeviceAllocator::allocate_all(s, d, out);
  }
  void free(void* p, uint64_t, const Device&) noexcept override {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(p);
    ++frees;
  }
  HostCopyEngine& engine;
  size_t expect;
  uint64_t before;  // the engine's copies before this allocator's load
  size_t fail_at = 0;
  bool throws = false;
  std::chrono::milliseconds delay{3}, wait_last{5000};
  std::mutex mu;
  std::vector<uint64_t> sizes, copies_then;
  std::map<void*, std::shared_ptr<std::byte>> live;
  bool last_waited = false;
  int calls = 0, frees = 0;
};

LoadOptions device_options(std::shared_ptr<DeviceAllocator> a, int threads = 2) {
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.threads = threads;
  lo.allocator = std::move(a);
  return lo;
}

TEST(DeviceOverlap, ReadsStartBeforeTheLastAllocation) {
  Model f(8);
  HostCopyEngine engine;
  UseEngine use(engine);
  Checkpoint c = Checkpoint::open(f.path);
  const std::vector<Tensor> host = c.load_all();
  {
    auto alloc = std::make_shared<SlowAllocator>(engine, 8);
    auto dev = c.load_all(device_options(alloc));
    expect_same(engine, dev, host);
    EXPECT_TRUE(alloc->last_waited);  // a copy was queued before the last allocation
    EXPECT_EQ(alloc->copies_then[0], alloc->before);
    ASSERT_EQ(alloc->sizes.size(), 8u);  // in plan order
    for (size_t i = 1; i < 8; ++i) EXPECT_LT(alloc->sizes[i - 1], alloc->sizes[i]);
    EXPECT_EQ(alloc->calls, 4);  // batches of 1, 2, 4 and the last 1
    dev.clear();
    EXPECT_EQ(alloc->frees, 8);
  }
  {  // Switched off: every allocation before the first read, in one call.
    NoOverlap off;
    auto alloc = std::make_shared<SlowAllocator>(engine, 8);
    alloc->wait_last = std::chrono::milliseconds(100);
    auto dev = c.load_all(device_options(alloc));
    expect_same(engine, dev, host);
    EXPECT_FALSE(alloc->last_waited);
    EXPECT_EQ(alloc->calls, 1);
  }
  EXPECT_EQ(engine.device_in_use(), 0u);
}

TEST(DeviceOverlap, AnAllocationFailingMidwayAllocatesNothingMoreAndFreesEverything) {
  Model f(12);
  for (bool throws : {false, true}) {
    SCOPED_TRACE(throws ? "throws" : "null");
    HostCopyEngine engine;
    UseEngine use(engine);
    auto alloc = std::make_shared<SlowAllocator>(engine, 0);
    alloc->fail_at = 6;
    alloc->throws = throws;
    Checkpoint c = Checkpoint::open(f.path);
    try {
      c.load_all(device_options(alloc, 3));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      ASSERT_FALSE(throws) << e.what();
      EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
      const std::string text = e.what();
      EXPECT_NE(text.find("bytes needed"), std::string::npos) << text;
      EXPECT_NE(text.find(" free"), std::string::npos) << text;
      EXPECT_EQ(e.record(), "t05");
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(throws) << e.what();  // the allocator's own error, as it threw it
    }
    EXPECT_EQ(alloc->sizes.size(), 6u);  // nothing after the failure
    EXPECT_TRUE(alloc->live.empty());
    EXPECT_EQ(alloc->frees, 5);
    EXPECT_EQ(engine.device_in_use(), 0u);
    // Copies went only to the five storages that had memory (a copy to a missing destination
    // would write through a null address here), and none is left running.
    EXPECT_LE(engine.copies(), 5u);
  }
}

TEST(DeviceOverlap, AFailedReadStopsTheAllocations) {
  Model f(16);
  HostCopyEngine engine(HostEngineOptions{.fail_at = 1});  // the first copy fails
  UseEngine use(engine);
  auto alloc = std::make_shared<SlowAllocator>(engine, 0);
  alloc->delay = std::chrono::milliseconds(20);
  Checkpoint c = Checkpoint::open(f.path);
  EXPECT_EQ(test::capture_error([&] { c.load_all(device_options(alloc)); }).code(), ErrorCode::kIo);
  EXPECT_LT(alloc->sizes.size(), 16u);
  EXPECT_TRUE(alloc->live.empty());
  EXPECT_EQ(engine.device_in_use(), 0u);
}

// Each reader makes its own staging buffer as it starts: the first reads do not wait for the
// whole ring (the last buffer is made after a copy was queued).
TEST(DeviceOverlap, EachReaderMakesItsOwnStagingBuffer) {
  Model f(8, 300000);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "CKPT_DEVICE_OVERLAP=0");
    std::unique_ptr<NoOverlap> off;
    if (!overlap) off = std::make_unique<NoOverlap>();
    HostCopyEngine* self = nullptr;
    bool copied_before_last = false;
    HostEngineOptions o;
    o.on_staging = [&](uint64_t call) {
      if (call == 4)
        copied_before_last = copied_within(*self, std::chrono::milliseconds(overlap ? 5000 : 100));
    };
    HostCopyEngine engine(o);
    self = &engine;
    UseEngine use(engine);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    lo.threads = 4;
    lo.staging_bytes = 16 << 20;
    Checkpoint c = Checkpoint::open(f.path);
    auto dev = c.load_all(lo);
    expect_same(engine, dev, c.load_all());
    EXPECT_EQ(engine.staging_calls(), 4u);  // one per reader
    EXPECT_LE(engine.staging_peak(), lo.staging_bytes);
    EXPECT_EQ(copied_before_last, overlap);
  }
}

}  // namespace
}  // namespace ckpt
