// Device memory without a GPU: the CUDA engine's own code over a fake runtime (the caller's
// current device kept, failed calls' errors cleared, a queued copy never left unwaited), and,
// over the host copy engine (whose device memory faults on host access), budgets decided before
// any byte moves, per-storage allocators, caller-owned destinations, writers that refuse device
// tensors, and direct reads that fall back.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/load_into.h"
#include "device/copy_engine.h"
#include "device/cuda_runtime.h"
#include "device_test_util.h"
#include "load/device_load.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::HostCopyEngine;
using internal::HostEngineOptions;

using test::UseEngine;

// `n` float32 tensors of `elems` + i elements, saved as safetensors.
struct Model {
  test::TempDir dir;
  std::string path;
  std::vector<Tensor> tensors;
  Model(size_t n, size_t elems) {
    path = dir.file("m.safetensors");
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> v(elems + i);
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 7919 + k);
      tensors.push_back(Tensor::copy_of("t" + std::to_string(i), DType::kFloat32,
                                        {static_cast<int64_t>(v.size())},
                                        std::as_bytes(std::span<const float>(v))));
    }
    save_safetensors(path, tensors);
  }
};

std::vector<std::byte> device_bytes(internal::CopyEngine& e, const Tensor& t) {
  std::vector<std::byte> out(t.info().nbytes());
  e.to_host(out.data(), t.data(), out.size());
  return out;
}

void expect_same(internal::CopyEngine& e, const std::vector<Tensor>& dev,
                 const std::vector<Tensor>& host) {
  ASSERT_EQ(dev.size(), host.size());
  for (size_t i = 0; i < dev.size(); ++i) {
    auto got = device_bytes(e, dev[i]);
    EXPECT_EQ(std::memcmp(got.data(), host[i].data(), got.size()), 0) << dev[i].name();
  }
}

// ---- A fake CUDA runtime: per-thread current device and pending error, host memory. ----
namespace fake {
thread_local int current = 0;
thread_local int pending = 0;  // the runtime's sticky-until-read last error
std::atomic<int> fail_malloc{0}, fail_event_record{0}, stream_syncs{0}, set_calls{0},
    host_allocs{0};
constexpr int kErr = 2;  // cudaErrorMemoryAllocation
int fail(int e) { return pending = e; }
int GetDeviceCount(int* n) {
  *n = 4;
  return 0;
}
int GetDevice(int* d) {
  *d = current;
  return 0;
}
int SetDevice(int d) {
  if (d < 0 || d >= 4) return fail(101);
  ++set_calls;
  current = d;
  return 0;
}
int GetLastError() { return std::exchange(pending, 0); }
int Malloc(void** p, size_t n) {
  if (fail_malloc) return fail(kErr);
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  return 0;
}
int Free(void* p) {
  std::free(p);
  return 0;
}
int HostAlloc(void** p, size_t n, unsigned) {
  ++host_allocs;
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return 0;
}
int StreamCreate(void** s, unsigned) {
  *s = new int(0);
  return 0;
}
int StreamDestroy(void* s) {
  delete static_cast<int*>(s);
  return 0;
}
int StreamSynchronize(void*) {
  ++stream_syncs;
  return 0;
}
int MemcpyAsync(void* d, const void* s, size_t n, int, void*) {
  std::memcpy(d, s, n);
  return 0;
}
int Memcpy(void* d, const void* s, size_t n, int) {
  std::memcpy(d, s, n);
  return 0;
}
int EventCreate(void** e, unsigned) {
  *e = new int(0);
  return 0;
}
int EventRecord(void*, void*) { return fail_event_record ? fail(700) : 0; }
int EventSynchronize(void*) { return 0; }
int EventDestroy(void* e) {
  delete static_cast<int*>(e);
  return 0;
}
int MemGetInfo(size_t* f, size_t* t) {
  *f = 3u << 30;
  *t = 4u << 30;
  return 0;
}
int RuntimeGetVersion(int* v) {
  *v = 12040;
  return 0;
}
const char* GetErrorString(int) { return "fake error"; }

internal::cuda::Runtime runtime() {
  internal::cuda::Runtime r;
  r.handle = &r;  // non-null: "loaded"
  r.path = "fake";
  r.GetDeviceCount = GetDeviceCount;
  r.GetDevice = GetDevice;
  r.SetDevice = SetDevice;
  r.GetLastError = GetLastError;
  r.Malloc = Malloc;
  r.Free = Free;
  r.HostAlloc = HostAlloc;
  r.FreeHost = Free;
  r.StreamCreateWithFlags = StreamCreate;
  r.StreamDestroy = StreamDestroy;
  r.StreamSynchronize = StreamSynchronize;
  r.MemcpyAsync = MemcpyAsync;
  r.Memcpy = Memcpy;
  r.EventCreateWithFlags = EventCreate;
  r.EventRecord = EventRecord;
  r.EventSynchronize = EventSynchronize;
  r.EventDestroy = EventDestroy;
  r.MemGetInfo = MemGetInfo;
  r.RuntimeGetVersion = RuntimeGetVersion;
  r.GetErrorString = GetErrorString;
  return r;
}
}  // namespace fake

TEST(DeviceMemory, TheCudaEngineRestoresTheCallersDeviceOnEveryThread) {
  Model f(6, 200000);
  const internal::cuda::Runtime rt = fake::runtime();
  auto engine = internal::cuda::make_engine(rt, 2);
  UseEngine use(*engine);
  fake::current = 1;  // the caller's device (torch.cuda.set_device(1))
  LoadOptions lo;
  lo.device = Device::cuda(2);
  lo.threads = 3;
  lo.staging_bytes = 2 << 20;
  Checkpoint c = Checkpoint::open(f.path);
  auto dev = c.load_all(lo);
  EXPECT_EQ(fake::current, 1);  // not left on cuda:2
  EXPECT_GT(fake::set_calls.load(), 0);
  expect_same(*engine, dev, c.load_all());
  EXPECT_EQ(fake::current, 1);
  dev.clear();  // frees on cuda:2, and back
  EXPECT_EQ(fake::current, 1);
  // A reader thread of the load leaves its own device as it found it too.
  std::thread([&] {
    fake::current = 3;
    engine->free_bytes();
    EXPECT_EQ(fake::current, 3);
  }).join();
  EXPECT_EQ(engine->free_bytes(), 3u << 30);
}

// Each reader takes its own pinned buffer; the engine keeps them all for the next load.
TEST(DeviceMemory, TheCudaEngineKeepsEveryReadersStagingForTheNextLoad) {
  Model f(6, 200000);
  const internal::cuda::Runtime rt = fake::runtime();
  auto engine = internal::cuda::make_engine(rt, 0);
  UseEngine use(*engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.threads = 3;
  lo.staging_bytes = 6 << 20;  // 3 readers x 2 slots of 1 MiB
  Checkpoint c = Checkpoint::open(f.path);
  const int before = fake::host_allocs;
  c.load_all(lo);
  EXPECT_EQ(fake::host_allocs - before, 3);
  EXPECT_EQ(engine->cached_staging(), uint64_t{6} << 20);
  auto dev = c.load_all(lo);
  expect_same(*engine, dev, c.load_all());
  EXPECT_EQ(fake::host_allocs - before, 3);  // all three reused
  lo.staging_bytes = 12 << 20;               // larger slots: the small buffers go
  c.load_all(lo);
  EXPECT_EQ(fake::host_allocs - before, 6);
  EXPECT_EQ(engine->cached_staging(), uint64_t{12} << 20);
  EXPECT_EQ(engine->release_staging(), uint64_t{12} << 20);
  EXPECT_EQ(engine->cached_staging(), 0u);
}

TEST(DeviceMemory, AFailedCudaCallLeavesNoPendingError) {
  const internal::cuda::Runtime rt = fake::runtime();
  auto engine = internal::cuda::make_engine(rt, 0);
  fake::fail_malloc = 1;
  Error e = test::capture_error([&] { engine->allocate(1 << 20); });
  fake::fail_malloc = 0;
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded) << e.what();
  EXPECT_EQ(fake::pending, 0);  // cleared, as torch's allocator does: torch's next call is clean
  // cudaEventRecord failing after a queued copy: the copy's stream is waited for, then the
  // error (cleared) is reported.
  auto host = engine->staging(4096);
  auto dev = engine->allocate(4096);
  auto session = engine->start(2, 2);
  const int syncs = fake::stream_syncs;
  fake::fail_event_record = 1;
  e = test::capture_error([&] { session->copy(1, dev.get(), host.get(), 4096); });
  fake::fail_event_record = 0;
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_GT(fake::stream_syncs.load(), syncs);
  EXPECT_EQ(fake::pending, 0);
  // An absent device: the error of cudaSetDevice is cleared as well.
  auto absent = internal::cuda::make_engine(rt, 9);
  EXPECT_EQ(test::capture_error([&] { absent->allocate(16); }).code(), ErrorCode::kIo);
  EXPECT_EQ(fake::pending, 0);
}

TEST(DeviceMemory, CudaWithoutIndexIsTheCurrentDevice) {
  HostCopyEngine engine;
  UseEngine use(engine);
  HostCopyEngine::set_current_device(3);
  EXPECT_EQ(internal::resolve_device(Device::parse("cuda")), Device::cuda(3));
  EXPECT_EQ(internal::resolve_device(Device::parse("cuda:1")), Device::cuda(1));
  std::thread([] {
    EXPECT_EQ(internal::resolve_device(Device::current_cuda()), Device::cuda(0));
  }).join();
  HostCopyEngine::set_current_device(0);
}

TEST(DeviceMemory, DeviceMemoryIsOutOfTheHostsReach) {
  Model f(2, 1000);
  HostCopyEngine engine;
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  auto dev = Checkpoint::open(f.path).load_all(lo);
  EXPECT_TRUE(engine.owns(dev[0].data()));
  EXPECT_DEATH(
      {
        volatile std::byte b = *dev[0].data();
        (void)b;
      },
      "");
}

TEST(DeviceMemory, WritersRefuseDeviceTensorsNamingThemAndWriteNothing) {
  Model f(3, 1000);
  HostCopyEngine engine;
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  auto dev = Checkpoint::open(f.path).load_all(lo);
  std::string out = f.dir.file("out");
  struct stat sb;
  auto refused = [&](const std::function<void()>& fn) {
    Error e = test::capture_error(fn);
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_EQ(e.record(), "t0") << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    EXPECT_NE(::stat(out.c_str(), &sb), 0);
  };
  refused([&] { save_safetensors(out, dev); });
  refused([&] { save_torch(out, state_dict_value(dev), dev); });
  refused([&] { save_tensorizer(out, dev); });
}

TEST(DeviceMemory, ALoadThatCannotFitIsRefusedBeforeAnyByteMoves) {
  Model f(4, 300000);  // 4.8 MB
  for (int which : {0, 1}) {
    HostCopyEngine engine(
        HostEngineOptions{.free_bytes = which == 0 ? uint64_t{1} << 20 : UINT64_MAX});
    UseEngine use(engine);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    if (which == 1) lo.max_device_bytes = 2 << 20;
    Error e = test::capture_error([&] { Checkpoint::open(f.path).load_all(lo); });
    EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded) << e.what();
    const std::string text = e.what();
    EXPECT_NE(text.find(which == 0 ? "1048576 free" : "2097152 allowed"), std::string::npos)
        << text;
    EXPECT_NE(text.find("bytes needed"), std::string::npos) << text;
    EXPECT_EQ(engine.copies(), 0u);
    EXPECT_EQ(engine.staging_peak(), 0u);
    EXPECT_EQ(engine.device_in_use(), 0u);
  }
  EXPECT_GE(internal::host_staging_budget(1ull << 40), uint64_t{2} << 20);
}

// Device memory from the engine, one allocation per call, counted.
struct CountingAllocator : DeviceAllocator {
  explicit CountingAllocator(internal::CopyEngine& e) : engine(e) {}
  void* allocate(uint64_t bytes, const Device&) override {
    auto p = engine.allocate(bytes);
    std::lock_guard<std::mutex> lock(mu);
    live[p.get()] = p;
    ++allocations;
    return p.get();
  }
  void free(void* p, uint64_t, const Device&) noexcept override {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(p);
    ++frees;
  }
  internal::CopyEngine& engine;
  std::mutex mu;
  std::map<void*, std::shared_ptr<std::byte>> live;
  int allocations = 0, frees = 0;
};

TEST(DeviceMemory, AnAllocatorGivesEveryStorageItsOwnMemoryFreedOneByOne) {
  Model f(5, 100000);
  HostCopyEngine engine;
  UseEngine use(engine);
  auto alloc = std::make_shared<CountingAllocator>(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.threads = 2;
  lo.allocator = alloc;
  Checkpoint c = Checkpoint::open(f.path);
  auto dev = c.load_all(lo);
  expect_same(engine, dev, c.load_all());
  EXPECT_EQ(alloc->allocations, 5);
  dev.erase(dev.begin() + 2);
  EXPECT_EQ(alloc->frees, 1);
  dev.clear();
  EXPECT_EQ(alloc->frees, 5);
  EXPECT_EQ(engine.device_in_use(), 0u);
}

TEST(DeviceMemory, LoadIntoCallerMemoryChecksEverythingFirst) {
  Model f(4, 5000);
  Checkpoint c = Checkpoint::open(f.path);
  // Host destinations.
  std::vector<std::vector<float>> bufs(4);
  std::map<std::string, Destination> into;
  for (size_t i = 0; i < 4; ++i) {
    bufs[i].assign(5000 + i, -1.f);
    into["t" + std::to_string(i)] = {bufs[i].data(), bufs[i].size() * 4, Device{}, DType::kFloat32};
  }
  LoadOptions lo;
  lo.threads = 3;
  load_into(c, into, lo);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(std::memcmp(bufs[i].data(), f.tensors[i].data(), bufs[i].size() * 4), 0);
  // Wrong size, dtype, device, name: refused before any read (the buffers keep their bytes).
  for (auto& b : bufs) std::fill(b.begin(), b.end(), -1.f);
  auto bad = into;
  bad["t3"].bytes -= 4;
  EXPECT_EQ(test::capture_error([&] { load_into(c, bad, lo); }).record(), "t3");
  bad = into;
  bad["t2"].dtype = DType::kInt32;
  EXPECT_EQ(test::capture_error([&] { load_into(c, bad, lo); }).code(),
            ErrorCode::kInvalidArgument);
  bad = into;
  bad["t1"].device = Device::cuda(0);
  EXPECT_EQ(test::capture_error([&] { load_into(c, bad, lo); }).code(),
            ErrorCode::kInvalidArgument);
  bad = into;
  bad["nope"] = into["t0"];
  EXPECT_EQ(test::capture_error([&] { load_into(c, bad, lo); }).code(), ErrorCode::kNotFound);
  for (auto& b : bufs) EXPECT_EQ(b[0], -1.f);

  // Device destinations: the caller's device memory, filled through the staging ring.
  HostCopyEngine engine;
  UseEngine use(engine);
  std::vector<std::shared_ptr<std::byte>> mem;
  std::map<std::string, Destination> dev;
  for (size_t i = 0; i < 4; ++i) {
    mem.push_back(engine.allocate(bufs[i].size() * 4));
    dev["t" + std::to_string(i)] = {mem[i].get(), bufs[i].size() * 4, Device::cuda(0),
                                    DType::kFloat32};
  }
  lo.device = Device::parse("cuda");  // the current device: 0
  load_into(c, dev, lo);
  for (size_t i = 0; i < 4; ++i) {
    std::vector<std::byte> got(bufs[i].size() * 4);
    engine.to_host(got.data(), mem[i].get(), got.size());
    EXPECT_EQ(std::memcmp(got.data(), f.tensors[i].data(), got.size()), 0);
  }
  EXPECT_EQ(engine.device_in_use(), 4 * 5000 * 4u + 6 * 4u);  // nothing allocated by the load
}

TEST(DeviceMemory, AFailedDirectReadFallsBackAndOnlyRealDirectBytesCount) {
  Model f(4, 300000);
  HostCopyEngine engine(HostEngineOptions{.direct = true, .direct_fails = true});
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  lo.gds = true;
  const uint64_t before = gds_bytes_read();
  Checkpoint c = Checkpoint::open(f.path);
  auto dev = c.load_all(lo);
  expect_same(engine, dev, c.load_all());
  EXPECT_EQ(gds_bytes_read(), before);  // nothing went direct
  EXPECT_GT(engine.copies(), 0u);
}

// A 1 GiB meta tensor (shape and dtype only, as torch's device="meta"): no memory and no work,
// on the host (zeros all the same) and on a device (a null address; nothing through the link).
TEST(DeviceMemory, MetaTensorsGetNoBytes) {
  test::TempDir dir;
  const std::string path = dir.file("meta.tensors");
  StorageInfo si;
  si.key = "big";
  si.dtype = DType::kFloat32;
  si.nbytes = 1ull << 30;
  si.meta = true;
  auto storage = std::make_shared<Storage>();
  storage->info = si;
  TensorInfo ti;
  ti.name = "big";
  ti.dtype = DType::kFloat32;
  ti.shape = {1 << 28};
  ti.strides = {1};
  std::vector<TensorizerEntry> es(2);
  es[0].tensor = Tensor(ti, storage);
  es[0].meta = true;
  std::vector<float> small(1000, 2.f);
  es[1].tensor = Tensor::copy_of("small", DType::kFloat32, {1000},
                                 std::as_bytes(std::span<const float>(small)));
  save_tensorizer(path, es);
  Checkpoint c = Checkpoint::open(path);
  auto t0 = std::chrono::steady_clock::now();
  auto host = c.load_all();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(host.size(), 2u);
  EXPECT_LT(s, 0.5);  // memset of 1 GiB with its page faults takes seconds
  EXPECT_EQ(host[0].info().nbytes(), 1ull << 30);
  EXPECT_EQ(std::to_integer<int>(host[0].data()[(1 << 30) - 1]), 0);  // zeros, read back free
  EXPECT_FALSE(host[0].storage()->writable);

  HostCopyEngine engine;
  UseEngine use(engine);
  LoadOptions lo;
  lo.device = Device::cuda(0);
  auto dev = c.load_all(lo);
  EXPECT_EQ(dev[0].storage()->data, nullptr);
  EXPECT_LT(engine.device_in_use(), 1u << 20);  // only the small tensor
  std::vector<std::byte> tail(16, std::byte{1});
  copy_to_host(*dev[0].storage(), (1ull << 30) - 16, tail);
  EXPECT_EQ(std::to_integer<int>(tail[3]), 0);
  expect_same(engine, {dev[1]}, {host[1]});
}

}  // namespace
}  // namespace ckpt
