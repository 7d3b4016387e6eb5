// Device loads without a GPU: the pipeline (staging ring, ordering, overlap, memory bound,
// errors, cancellation) driven by the host copy engine, and the CUDA engine's refusal where no
// CUDA device is usable.

#include "ckpt/device.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "device/copy_engine.h"
#include "device_test_util.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::HostCopyEngine;
using internal::HostEngineOptions;

using test::UseEngine;

struct Model {
  test::TempDir dir;
  std::string path;
  std::vector<Tensor> tensors;
  // `n` float32 tensors of `elems` + i elements, and a view sharing t0.
  Model(size_t n, size_t elems, bool safetensors = false) {
    path = dir.file(safetensors ? "m.safetensors" : "m.pt");
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> v(elems + i);
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 1000003 + k);
      tensors.push_back(Tensor::copy_of("t" + std::to_string(i), DType::kFloat32,
                                        {static_cast<int64_t>(v.size())},
                                        std::as_bytes(std::span<const float>(v))));
    }
    SaveOptions so;
    so.fsync = false;
    if (safetensors) {
      save_safetensors(path, tensors);
      return;
    }
    TensorInfo view = tensors[0].info();
    view.name = "t0_tail";
    view.shape = {10};
    view.storage_offset = 5;
    tensors.emplace_back(view, tensors[0].storage());
    save_torch(path, state_dict_value(tensors), tensors, so);
  }
};

// The device bytes of every tensor equal a host load's.
void expect_same(internal::CopyEngine& engine, const std::vector<Tensor>& dev,
                 const std::vector<Tensor>& host) {
  ASSERT_EQ(dev.size(), host.size());
  for (size_t i = 0; i < dev.size(); ++i) {
    ASSERT_EQ(dev[i].name(), host[i].name());
    EXPECT_TRUE(dev[i].storage()->device.is_cuda());
    EXPECT_FALSE(dev[i].storage()->writable);
    std::vector<std::byte> got(host[i].info().nbytes());
    engine.to_host(got.data(), dev[i].data(), got.size());
    EXPECT_EQ(std::memcmp(got.data(), host[i].data(), got.size()), 0) << dev[i].name();
  }
}

TEST(Device, Parse) {
  EXPECT_TRUE(Device::parse("cpu").is_cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::current_cuda());  // torch's "cuda": the current device
  EXPECT_EQ(Device::parse("cuda").str(), "cuda");
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda:3").str(), "cuda:3");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "CUDA"})
    EXPECT_EQ(test::capture_error([&] { Device::parse(bad); }).code(), ErrorCode::kInvalidArgument)
        << bad;
  for (const char* other : {"meta", "mps", "xpu:0"})
    EXPECT_EQ(test::capture_error([&] { Device::parse(other); }).code(), ErrorCode::kUnsupported)
        << other;
}

TEST(Device, LoadAllEqualsHostLoadForEveryReaderCountAndBudget) {
  Model f(30, 70000);  // 280 KB tensors
  for (bool mmap : {true, false})
    for (int threads : {1, 3, 8})
      for (uint64_t staging : {uint64_t{2} << 20, uint64_t{64} << 20}) {
        HostCopyEngine engine(HostEngineOptions{.delay_us = 50});
        UseEngine use(engine);
        OpenOptions o;
        o.mmap = mmap;
        Checkpoint c = Checkpoint::open(f.path, o);
        LoadOptions lo;
        lo.threads = threads;
        lo.verify = threads == 3;
        lo.device = Device::cuda(0);
        lo.staging_bytes = staging;
        auto dev = c.load_all(lo);
        expect_same(engine, dev, c.load_all());
        EXPECT_EQ(dev[0].storage().get(), dev.back().storage().get());  // the view shares
        EXPECT_LE(engine.staging_peak(), staging);
      }
}

TEST(Device, AStartingEngineOverlapsReadingALocalFileOnly) {
  // The engine takes 300 ms to start, as creating a CUDA context does: meanwhile the readers
  // read the file's first chunks (into the page cache), and the load reads them again.
  Model f(6, 3 << 20);  // 72 MiB
  uint64_t tensor_bytes = 0;
  for (const auto& t : f.tensors) tensor_bytes += t.info().nbytes();
  {
    HostCopyEngine engine;
    UseEngine use(engine);
    internal::set_engine_override(&engine, std::chrono::milliseconds(300));
    EXPECT_FALSE(internal::engine_ready(Device::cuda(0)));
    OpenOptions o;
    o.mmap = false;
    Checkpoint c = Checkpoint::open(f.path, o);
    const uint64_t before = c.source().stats().bytes.load();
    LoadOptions lo;
    lo.threads = 2;
    lo.device = Device::cuda(0);
    auto dev = c.load_all(lo);
    EXPECT_TRUE(internal::engine_ready(Device::cuda(0)));
    EXPECT_GT(c.source().stats().bytes.load() - before, tensor_bytes);  // read twice, in part
    expect_same(engine, dev, c.load_all());
  }
  {
    // A source that is not a local file is read once: no warm-up.
    HostCopyEngine engine;
    UseEngine use(engine);
    internal::set_engine_override(&engine, std::chrono::milliseconds(100));
    Checkpoint c = Checkpoint::open(memory_source(test::read_file(f.path), "m.pt"));
    const uint64_t before = c.source().stats().bytes.load();
    LoadOptions lo;
    lo.threads = 2;
    lo.device = Device::cuda(0);
    auto dev = c.load_all(lo);
    EXPECT_LE(c.source().stats().bytes.load() - before, tensor_bytes);
    expect_same(engine, dev, c.load_all());
  }
}

TEST(Device, DirectReadsWhereTheEngineHasThemAndNothingNeedsTheHost) {
  Model st(8, 300000, true), pt(8, 300000);
  uint64_t bytes = 0;
  for (const auto& t : st.tensors) bytes += t.info().nbytes();
  for (bool mmap : {false, true}) {
    HostCopyEngine engine(HostEngineOptions{.delay_us = 20, .direct = true});
    UseEngine use(engine);
    OpenOptions o;
    o.mmap = mmap;
    LoadOptions lo;
    lo.threads = 3;
    lo.device = Device::cuda(0);
    lo.gds = true;
    // safetensors (no CRCs): every byte read straight into "device" memory, none staged.
    Checkpoint c = Checkpoint::open(st.path, o);
    auto dev = c.load_all(lo);
    expect_same(engine, dev, c.load_all());
    EXPECT_EQ(engine.direct_bytes(), bytes);
    EXPECT_EQ(engine.copies(), 0u);
    // A torch zip verified: its CRCs need the host bytes, so it goes through staging.
    const uint64_t before = engine.direct_bytes();
    lo.verify = true;
    Checkpoint p = Checkpoint::open(pt.path, o);
    auto dev2 = p.load_all(lo);
    expect_same(engine, dev2, p.load_all());
    EXPECT_EQ(engine.direct_bytes(), before);
    EXPECT_GT(engine.copies(), 0u);
  }
  // An engine without direct reads: the same result through staging, and gds_unavailable says why.
  HostCopyEngine plain;
  UseEngine use(plain);
  EXPECT_NE(gds_unavailable(Device::cuda(0)), "");
  EXPECT_NE(gds_unavailable(Device{}), "");
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.gds = true;
  Checkpoint c = Checkpoint::open(st.path);
  expect_same(plain, c.load_all(lo), c.load_all());
  EXPECT_EQ(plain.direct_bytes(), 0u);
}

TEST(Device, StagingStaysWithinItsBudgetWhateverTheModelSize) {
  Model f(6, 3 << 20);  // 12 MiB tensors, 72 MiB in all, through 4 MiB of staging
  HostCopyEngine engine(HostEngineOptions{.delay_us = 200});
  UseEngine use(engine);
  LoadOptions lo;
  lo.threads = 4;
  lo.device = Device::cuda(0);
  lo.staging_bytes = 4 << 20;
  Checkpoint c = Checkpoint::open(f.path);
  auto dev = c.load_all(lo);
  expect_same(engine, dev, c.load_all());
  EXPECT_LE(engine.staging_peak(), lo.staging_bytes);
  EXPECT_GT(engine.copies(), 72u / 1);    // 1 MiB slots: every tensor in many chunks
  EXPECT_GE(engine.max_lanes_busy(), 2);  // copies ran on several lanes at once
  dev.clear();
  EXPECT_EQ(engine.device_in_use(), 0u);  // the device memory went with the last tensor
}

TEST(Device, OpenAndLoadSetsAndSingleStorages) {
  Model a(5, 1000, true), b(5, 2000, true);
  HostCopyEngine engine;
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  LoadedCheckpoint l = Checkpoint::open_and_load(a.path, {}, lo);
  expect_same(engine, l.tensors, Checkpoint::open(a.path).load_all());

  // A set of files: each shard into the device.
  std::string p2 = a.dir.file("other.safetensors");
  std::vector<Tensor> renamed;
  for (const Tensor& t : b.tensors) {
    TensorInfo info = t.info();
    info.name = "u" + info.name;
    renamed.emplace_back(info, t.storage());
  }
  save_safetensors(p2, renamed);
  Checkpoint set = Checkpoint::open_set({a.path, p2});
  expect_same(engine, set.load_all(lo), set.load_all());

  Checkpoint c = Checkpoint::open(a.path);
  Tensor t = c.tensor("t3", lo);
  EXPECT_TRUE(t.storage()->device.is_cuda());
  std::vector<std::byte> got(t.info().nbytes());
  engine.to_host(got.data(), t.data(), got.size());
  EXPECT_EQ(std::memcmp(got.data(), c.tensor("t3").data(), got.size()), 0);
  EXPECT_EQ(test::capture_error([&] { (void)t.bytes(); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::capture_error([&] {
              c.stream(
                  1 << 20, [](const Tensor&) {}, lo);
            }).code(),
            ErrorCode::kUnsupported);
}

TEST(Device, ACopyFailureStopsTheLoadAndFreesEverything) {
  Model f(20, 300000);
  for (uint64_t fail_at : {1, 7, 19}) {
    HostCopyEngine engine(HostEngineOptions{.delay_us = 100, .fail_at = fail_at});
    UseEngine use(engine);
    LoadOptions lo;
    lo.threads = 4;
    lo.device = Device::cuda(0);
    lo.staging_bytes = 8 << 20;
    Error e = test::capture_error([&] { Checkpoint::open(f.path).load_all(lo); });
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos);
    EXPECT_EQ(engine.device_in_use(), 0u);
    EXPECT_LT(engine.copies(), 20u * 2);  // the readers stopped early
  }
}

TEST(Device, CrcMismatchAndOutOfDeviceMemory) {
  Model f(8, 300000);
  auto bytes = test::read_file(f.path);
  const StorageInfo st = Checkpoint::open(f.path).storages()[5];
  bytes[st.offset + st.nbytes - 3] ^= std::byte{0x40};
  test::write_file(f.path, bytes);
  HostCopyEngine engine;
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.verify = true;
  lo.staging_bytes = 2 << 20;  // CRCs over several chunks, combined
  Error e = test::capture_error([&] { Checkpoint::open(f.path).load_all(lo); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
  EXPECT_EQ(e.record(), st.record);
  EXPECT_EQ(engine.device_in_use(), 0u);

  HostCopyEngine small(HostEngineOptions{.device_bytes = 1 << 20});
  UseEngine use_small(small);
  e = test::capture_error([&] { Checkpoint::open(f.path).load_all(lo); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded) << e.what();
}

// Without a usable CUDA device (this machine, CI): unsupported, naming what is missing.
TEST(Device, CudaUnavailableIsUnsupportedAndNamesWhy) {
  if (device_unavailable(Device::cuda(0)).empty()) GTEST_SKIP() << "a CUDA device is usable here";
  Model f(2, 100, true);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  Error e = test::capture_error([&] { Checkpoint::open(f.path).load_all(lo); });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  EXPECT_EQ(test::capture_error([&] { describe_device(Device::cuda(0)); }).code(),
            ErrorCode::kUnsupported);

  EXPECT_EQ(device_unavailable(Device{}), "");
  EXPECT_NE(device_unavailable(Device::cuda(99)), "");
}

}  // namespace
}  // namespace ckpt
