// Unified memory and the page cache, without a GPU: the host copy engine posing as a device that
// shares the host's memory (HostEngineOptions::unified) gets its load read straight into place,
// with no staging buffer and one copy of the bytes; LoadOptions::drop_cache leaves the page
// cache as a load found it, on the host and the device paths.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/load_into.h"
#include "device/copy_engine.h"
#include "device_test_util.h"
#include "io/page_cache.h"
#include "load/device_load.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::HostCopyEngine;
using internal::HostEngineOptions;
using test::UseEngine;

// `n` float32 tensors of `elems` elements each, saved as safetensors.
struct Model {
  test::TempDir dir;
  std::string path;
  uint64_t bytes = 0;
  Model(size_t n, size_t elems, const std::string& name = "m.safetensors") {
    path = dir.file(name);
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> v(elems);
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 7919 + k);
      tensors.push_back(Tensor::copy_of("t" + std::to_string(i), DType::kFloat32,
                                        {static_cast<int64_t>(v.size())},
                                        std::as_bytes(std::span<const float>(v))));
      bytes += v.size() * sizeof(float);
    }
    save_safetensors(path, tensors);
  }
};

TEST(DeviceUnified, AUnifiedDeviceIsReadIntoPlaceWithoutStaging) {
  Model f(6, 250000);  // 6 MB
  HostCopyEngine engine(HostEngineOptions{.unified = true});
  UseEngine use(engine);
  for (bool verify : {false, true}) {
    LoadOptions lo;
    lo.device = Device::cuda(0);
    lo.threads = 2;
    lo.verify = verify;
    const uint64_t before = unified_bytes_loaded();
    Checkpoint c = Checkpoint::open(f.path);
    std::vector<Tensor> dev = c.load_all(lo);
    std::vector<Tensor> host = c.load_all();
    ASSERT_EQ(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i) {
      EXPECT_EQ(dev[i].storage()->device, Device::cuda(0));
      // The host reads it directly: it is memory the two share.
      EXPECT_TRUE(engine.host_accessible(dev[i].data()));
      EXPECT_EQ(std::memcmp(dev[i].data(), host[i].data(), host[i].info().nbytes()), 0);
    }
    // No staging buffer, no copy; one copy of the bytes (the load's allocation) at the peak.
    EXPECT_EQ(engine.staging_calls(), 0u);
    EXPECT_EQ(engine.staging_peak(), 0u);
    EXPECT_EQ(engine.copies(), 0u);
    EXPECT_GE(engine.device_in_use(), f.bytes);
    EXPECT_LE(engine.device_in_use(), f.bytes + 6 * 256);
    EXPECT_EQ(unified_bytes_loaded() - before, f.bytes);
  }
}

TEST(DeviceUnified, ADiscreteDeviceStagesAndACallersMemoryIsNeverAssumedShared) {
  Model f(3, 100000);
  {
    HostCopyEngine engine;  // discrete: staged
    UseEngine use(engine);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    auto dev = Checkpoint::open(f.path).load_all(lo);
    EXPECT_GT(engine.staging_calls(), 0u);
    EXPECT_GT(engine.copies(), 0u);
  }
  // A unified engine, but the memory is a caller's (an allocator's): not assumed shared.
  struct HostAllocator : DeviceAllocator {
    void* allocate(uint64_t bytes, const Device&) override {
      return ::operator new(bytes, std::align_val_t(256));
    }
    void free(void* p, uint64_t, const Device&) noexcept override {
      ::operator delete(p, std::align_val_t(256));
    }
  };
  HostCopyEngine engine(HostEngineOptions{.unified = true});
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.allocator = std::make_shared<HostAllocator>();
  Checkpoint c = Checkpoint::open(f.path);
  auto dev = c.load_all(lo);
  auto host = c.load_all();
  for (size_t i = 0; i < dev.size(); ++i)
    EXPECT_EQ(std::memcmp(dev[i].data(), host[i].data(), host[i].info().nbytes()), 0);
  EXPECT_GT(engine.staging_calls(), 0u);
  EXPECT_GT(engine.copies(), 0u);
}

// Threads of this process now.
int threads_now() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

TEST(DeviceStaging, StagingAndThreadsDoNotGrowWithTheNumberOfFiles) {
  test::TempDir dir;
  std::vector<std::string> paths;
  for (int f = 0; f < 12; ++f) {
    std::vector<float> v(300000, static_cast<float>(f));
    paths.push_back(dir.file("s" + std::to_string(f) + ".safetensors"));
    save_safetensors(paths.back(), {Tensor::copy_of("t" + std::to_string(f), DType::kFloat32,
                                                    {static_cast<int64_t>(v.size())},
                                                    std::as_bytes(std::span<const float>(v)))});
  }
  auto measure = [&](size_t files) {
    HostCopyEngine engine(HostEngineOptions{.delay_us = 2000});  // slow copies: loads overlap
    UseEngine use(engine);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    lo.threads = 3;
    lo.staging_bytes = 8 << 20;
    std::atomic<bool> done{false};
    std::atomic<int> most{0};
    const int base = threads_now();
    std::thread watch([&] {
      while (!done) {
        most = std::max(most.load(), threads_now() - base - 1);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    {
      Checkpoint c = Checkpoint::open_set(
          std::vector<std::string>(paths.begin(), paths.begin() + static_cast<long>(files)));
      auto dev = c.load_all(lo);
      EXPECT_EQ(dev.size(), files);
    }
    done = true;
    watch.join();
    return std::make_pair(engine.staging_peak(), most.load());
  };
  const auto two = measure(2), twelve = measure(12);
  EXPECT_LE(twelve.first, uint64_t{8} << 20);
  EXPECT_EQ(twelve.first, two.first);  // one ring at a time, whatever the files
  EXPECT_LE(twelve.second, two.second + 1);
  EXPECT_LE(twelve.second, 3 + 3 + 1);  // readers, copy lanes, and nothing per file
}

// Pages of `path` in the page cache now.
uint64_t resident(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const uint64_t size = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
  const uint64_t n = internal::resident_pages(fd, 0, size);
  ::close(fd);
  return n;
}
uint64_t pages(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const uint64_t size = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
  ::close(fd);
  return (size + 4095) / 4096;
}
// Pages the kernel reads ahead of a small read of `path` (read_ahead_kb of its block device,
// 128 KiB where unknown): what opening a file may bring in before a load begins.
uint64_t readahead_pages(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 32;
  const std::string dev =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  for (const char* q : {"/queue/read_ahead_kb", "/../queue/read_ahead_kb"}) {
    std::ifstream in(dev + q);
    uint64_t kb = 0;
    if (in >> kb) return kb / 4;
  }
  return 32;
}

// Drops the file from the page cache (written back first), as a cold load finds it.
bool make_cold(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return resident(path) == 0;
}
void make_warm(const std::string& path) {
  std::vector<std::byte> all(pages(path) * 4096);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ssize_t r = ::pread(fd, all.data(), all.size(), 0);
  (void)r;
  ::close(fd);
}

TEST(DropCache, AColdLoadLeavesNoPagesAndAWarmFileStaysCached) {
  Model f(8, 4 << 20);  // 128 MiB
  const uint64_t total = pages(f.path);
  // What the open reads (the header, and the read-ahead around it) is cached before the load.
  const uint64_t before = readahead_pages(f.path) + 64;
  // Pages a load keeps may still be reclaimed by the kernel when tests beside this one press on
  // memory (ctest -j): a few are allowed to go, while a wrong drop would take them all.
  const uint64_t slack = total / 128;
  HostCopyEngine engine;
  for (int where : {0, 1}) {  // host, device
    std::optional<UseEngine> use;
    LoadOptions lo;
    lo.threads = 2;
    if (where == 1) {
      use.emplace(engine);
      lo.device = Device::cuda(0);
    }
    for (bool drop : {false, true}) {
      if (!make_cold(f.path)) GTEST_SKIP() << "this filesystem keeps pages posix_fadvise drops";
      lo.drop_cache = drop;
      { LoadedCheckpoint l = Checkpoint::open_and_load(f.path, {}, lo); }
      const uint64_t left = resident(f.path);
      if (drop)  // at most what the open read before the load began, and its read-ahead
        EXPECT_LE(left, before) << "where " << where;
      else
        EXPECT_GE(left, total - slack) << "where " << where;
    }
    // Warm before the load: another process's cache, left alone.
    make_warm(f.path);
    const uint64_t warm = resident(f.path);
    ASSERT_GE(warm, total - slack);
    lo.drop_cache = true;
    { LoadedCheckpoint l = Checkpoint::open_and_load(f.path, {}, lo); }
    EXPECT_GE(resident(f.path), warm - slack) << "where " << where;
  }
}

TEST(DropCache, OnlyThePagesNotCachedBeforeAreDropped) {
  Model f(8, 4 << 20);
  const uint64_t total = pages(f.path);
  if (!make_cold(f.path)) GTEST_SKIP() << "this filesystem keeps pages posix_fadvise drops";
  // The second half warm (another reader's).
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<std::byte> half(total / 2 * 4096);
  ASSERT_GT(::pread(fd, half.data(), half.size(), static_cast<off_t>((total - total / 2) * 4096)),
            0);
  const uint64_t warm = internal::resident_pages(fd, 0, total * 4096);
  ::close(fd);
  LoadOptions lo;
  lo.drop_cache = true;
  { auto l = Checkpoint::open(f.path).load_all(lo); }
  const uint64_t left = resident(f.path);
  EXPECT_GE(left, warm);
  EXPECT_LE(left, warm + readahead_pages(f.path) + 64);
}

}  // namespace
}  // namespace ckpt
