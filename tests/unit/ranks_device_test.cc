// Rank loads into device memory, the host copy engine standing in for CUDA: a rank's boxes reach
// "device" memory in pieces through the staging ring (staging bounded by LoadOptions, one ring
// per load, a box's row runs packed into slots), for load_rank and for load_group, whose
// Replicate tensors are assembled in device memory; raw files and a DCP folder; a failed copy.

#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <thread>

#include "ckpt/ckpt.h"
#include "device_test_util.h"
#include "rank_exchange_util.h"
#include "test_util.h"
#include "util/box.h"

namespace ckpt {
namespace {

struct Model {
  test::TempDir dir;
  std::string path;
  std::vector<Tensor> tensors;
  uint64_t bytes = 0;
  Model() {
    path = dir.file("m.safetensors");
    add("big.weight", {1024, 2048});  // 8 MiB: a rank's half is 4 MiB, twice the staging
    add("a.weight", {10, 6});
    add("a.bias", {10});
    add("scalar", {});
    save_safetensors(path, tensors);
  }
  void add(std::string name, std::vector<int64_t> shape) {
    tensors.push_back(
        test::numbered_floats(std::move(name), std::move(shape), tensors.size() * 1000));
    bytes += tensors.back().info().nbytes();
  }
  const Tensor& operator[](const std::string& name) const {
    for (const Tensor& t : tensors)
      if (t.name() == name) return t;
    throw std::runtime_error("no " + name);
  }
};

// The box of a whole tensor, copied out of its bytes.
std::vector<std::byte> box_of(const Tensor& t, const RankTensor& rt) {
  std::vector<std::byte> out(rt.nbytes);
  std::vector<int64_t> zero(t.shape().size(), 0);
  internal::copy_box(zero, t.shape(), t.data(), rt.begin, rt.end, out.data(), 4);
  return out;
}

// A tensor loaded into the engine's "device" memory, its bytes copied back to the host.
std::vector<std::byte> device_bytes(internal::HostCopyEngine& e, const Tensor& t) {
  EXPECT_EQ(t.storage()->device, Device::cuda(0)) << t.name();
  std::vector<std::byte> out(t.info().nbytes());
  if (out.empty()) return out;
  EXPECT_TRUE(e.owns(t.data())) << t.name();
  e.to_host(out.data(), t.data(), out.size());
  return out;
}

LoadOptions on_device() {
  LoadOptions o;
  o.device = Device::cuda(0);
  o.staging_bytes = 2 << 20;  // one reader, two slots of 1 MiB
  o.threads = 2;
  return o;
}

TEST(RankDevice, ABoxGoesThroughStagingInPieces) {
  Model m;
  for (const char* json : {R"({"*.weight": "shard:0", "a.bias": "shard:0"})",
                           R"({"*.weight": "shard:1", "a.bias": "shard:0"})"}) {
    for (int rank = 0; rank < 2; ++rank) {
      internal::HostCopyEngine engine;
      test::UseEngine use(engine);
      Checkpoint c = Checkpoint::open(m.path);
      RankLoadPlan p = resolve(c, RankPlan::from_json(json), rank, 2);
      const uint64_t before = process_bytes_read();
      std::vector<Tensor> got = load_rank(c, p, on_device());
      EXPECT_EQ(process_bytes_read() - before, p.read_bytes()) << json;
      ASSERT_EQ(got.size(), m.tensors.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(device_bytes(engine, got[i]), box_of(m[got[i].name()], p.tensors[i]))
            << json << " " << got[i].name() << " rank " << rank;
      // One ring of 2 MiB for the load: the 4 MiB box never whole in host memory, its 1024 row
      // runs of 4 KiB (shard:1) packed into 1 MiB slots: four copies, and one for each small
      // tensor (not 1024 + 13).
      EXPECT_EQ(engine.staging_calls(), 1u) << json;
      EXPECT_LE(engine.staging_peak(), 2u << 20) << json;
      EXPECT_LE(engine.copies(), 7u) << json;
    }
  }
}

// An all-gather over threads of one process (gather_parts: its default, through all_gather).
using test::ThreadGroup;

TEST(RankDevice, AGroupAssemblesReplicatedTensorsInDeviceMemory) {
  Model m;
  const std::string dcp = m.dir.file("dcp");
  save_dcp(dcp, nullptr, m.tensors, {.files = 2, .fsync = false});
  RankPlan plan = RankPlan::from_json(R"({"a.weight": "shard:1"})");
  for (const std::string& path : {m.path, dcp}) {
    for (int world : {2, 3}) {
      internal::HostCopyEngine engine;
      test::UseEngine use(engine);
      ThreadGroup g(world);
      std::vector<std::vector<Tensor>> got(world);
      std::vector<RankLoadPlan> plans(world);
      Checkpoint c = Checkpoint::open(path);
      const uint64_t before = process_bytes_read();
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          ThreadGroup::Member ex(g, r);
          plans[r] = resolve(c, plan, r, world);
          got[r] = load_group(c, plans[r], ex, 3 << 20, on_device());  // several rounds
        });
      for (auto& t : threads) t.join();
      EXPECT_EQ(process_bytes_read() - before, m.bytes) << path << " " << world;
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < m.tensors.size(); ++i)
          EXPECT_EQ(device_bytes(engine, got[r][i]),
                    box_of(m[got[r][i].name()], plans[r].tensors[i]))
              << path << " " << r << "/" << world << " " << got[r][i].name();
    }
  }
}

TEST(RankDevice, AFailedCopyIsAnErrorAndFreesTheMemory) {
  Model m;
  internal::HostCopyEngine engine({.fail_at = 2});
  test::UseEngine use(engine);
  Checkpoint c = Checkpoint::open(m.path);
  RankLoadPlan p = resolve(c, RankPlan::from_json(R"({"*.weight": "shard:0"})"), 0, 2);
  auto e = test::capture_error([&] { load_rank(c, p, on_device()); });
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_EQ(engine.device_in_use(), 0u);
}

}  // namespace
}  // namespace ckpt
