// Rank plans: the box runs, the torch.chunk split, plan rules, resolve's refusals, and the
// loads that read only a rank's bytes (load_rank) or every byte once across a group
// (load_group, with an exchange over threads).

#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <thread>

#include "api/checkpoint_kind.h"
#include "ckpt/ckpt.h"
#include "rank_exchange_util.h"
#include "test_util.h"
#include "util/box.h"

namespace ckpt {
namespace {

using internal::box_runs;

TEST(RankBox, RunsOfRowsAndColumns) {
  std::vector<int64_t> shape{4, 6};
  auto rows = box_runs(shape, std::vector<int64_t>{1, 0}, std::vector<int64_t>{3, 6}, 4);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].offset, 24u);
  EXPECT_EQ(rows[0].length, 48u);
  auto cols = box_runs(shape, std::vector<int64_t>{0, 2}, std::vector<int64_t>{4, 4}, 4);
  ASSERT_EQ(cols.size(), 4u);
  EXPECT_EQ(cols[1].offset, 24u + 8u);
  EXPECT_EQ(cols[1].length, 8u);
  auto all = box_runs(shape, std::vector<int64_t>{0, 0}, shape, 2);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].length, 48u);
  EXPECT_TRUE(box_runs(shape, std::vector<int64_t>{2, 0}, std::vector<int64_t>{2, 6}, 4).empty());
  EXPECT_EQ(box_runs({}, {}, {}, 8).size(), 1u);  // 0-d
  // A row of a 3-d tensor, part of its last dimension: one run per index of dim 1.
  std::vector<int64_t> s3{2, 3, 5};
  auto r3 = box_runs(s3, std::vector<int64_t>{1, 0, 1}, std::vector<int64_t>{2, 3, 4}, 1);
  ASSERT_EQ(r3.size(), 3u);
  EXPECT_EQ(r3[0].offset, 15u + 1u);
  EXPECT_EQ(r3[2].offset, 15u + 10u + 1u);
}

using Range = std::pair<int64_t, int64_t>;

TEST(RankBox, ShardRangeSplitsAsTorchChunk) {
  // torch.chunk(arange(10), 4): sizes 3, 3, 3, 1; arange(2) in 4: 1, 1, then empty parts.
  EXPECT_EQ(shard_range(10, 0, 4), Range(0, 3));
  EXPECT_EQ(shard_range(10, 3, 4), Range(9, 10));
  EXPECT_EQ(shard_range(2, 1, 4), Range(1, 2));
  EXPECT_EQ(shard_range(2, 3, 4), Range(2, 2));
  EXPECT_EQ(shard_range(8, 2, 4), Range(4, 6));
}

TEST(RankPlanRules, FirstMatchWinsInFileOrder) {
  RankPlan p = RankPlan::from_json(
      R"({"z.weight": "replicate", "*.weight": "shard:0", "re:.*bias": "shard:-1"})");
  EXPECT_EQ(p.placement_of("z.weight")->kind, Placement::Kind::kReplicate);
  EXPECT_EQ(p.placement_of("a.weight")->kind, Placement::Kind::kShard);
  EXPECT_EQ(p.placement_of("a.bias")->dim, -1);
  EXPECT_EQ(p.placement_of("other")->kind, Placement::Kind::kReplicate);  // the default
  RankPlan strict = RankPlan::from_json(R"({"tensors": {"a*": "shard:1"}, "default": null})");
  EXPECT_FALSE(strict.placement_of("b").has_value());
  for (const char* bad :
       {R"({"a": "shard:x"})", R"({"a": 3})", R"([1])", R"({"re:(": "replicate"})"})
    EXPECT_EQ(test::capture_error([&] { RankPlan::from_json(bad, "p.json"); }).code(),
              ErrorCode::kInvalidArgument)
        << bad;
}

struct Model {
  test::TempDir dir;
  std::string path;
  std::vector<Tensor> tensors;
  uint64_t bytes = 0;
  const Tensor& operator[](const std::string& name) const {
    for (const Tensor& t : tensors)
      if (t.name() == name) return t;
    throw std::runtime_error("no " + name);
  }
  Model() {
    path = dir.file("m.safetensors");
    auto add = [&](std::string name, std::vector<int64_t> shape) {
      tensors.push_back(
          test::numbered_floats(std::move(name), std::move(shape), tensors.size() * 1000));
      bytes += tensors.back().info().nbytes();
    };
    add("a.weight", {10, 6});
    add("a.bias", {10});
    add("b.weight", {3, 7});
    add("scalar", {});
    save_safetensors(path, tensors);
  }
};

// The box of a whole tensor, copied out of its bytes.
std::vector<std::byte> box_of(const Tensor& t, const RankTensor& rt) {
  std::vector<std::byte> out(rt.nbytes);
  std::vector<int64_t> zero(t.shape().size(), 0);
  internal::copy_box(zero, t.shape(), t.data(), rt.begin, rt.end, out.data(), 4);
  return out;
}

TEST(RankLoad, EachRankReadsOnlyItsBytes) {
  Model m;
  RankPlan plan = RankPlan::from_json(R"({"*.weight": "shard:1", "a.bias": "shard:0"})");
  for (int world : {1, 2, 4}) {
    uint64_t total = 0;
    for (int rank = 0; rank < world; ++rank) {
      Checkpoint c = Checkpoint::open(m.path);
      RankLoadPlan p = resolve(c, plan, rank, world);
      const uint64_t before = process_bytes_read();
      std::vector<Tensor> got = load_rank(c, p);
      const uint64_t read = process_bytes_read() - before;
      EXPECT_EQ(read, p.read_bytes()) << rank << "/" << world;
      ASSERT_EQ(got.size(), m.tensors.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].shape(), p.tensors[i].shape());
        auto want = box_of(m[got[i].name()], p.tensors[i]);
        auto have = got[i].contiguous_bytes();
        EXPECT_EQ(have, want) << got[i].name() << " rank " << rank << "/" << world;
      }
      total += read;
    }
    // Sharded tensors once across the group; the replicated scalar on every rank.
    EXPECT_EQ(total, m.bytes - 4 + 4 * static_cast<uint64_t>(world));
  }
}

TEST(RankLoad, RefusedBeforeAnyByteMoves) {
  Model m;
  Checkpoint c = Checkpoint::open(m.path);
  const uint64_t before = process_bytes_read();
  auto e = test::capture_error([&] { resolve(c, RankPlan().add("*", Placement::shard(0)), 0, 2); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.record(), "scalar");
  e = test::capture_error([&] {
    resolve(c, RankPlan().add("a.*", Placement::shard(1)).set_default(std::nullopt), 0, 2);
  });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.record(), "a.bias");
  e = test::capture_error([&] { resolve(c, RankPlan(), 2, 2); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  e = test::capture_error([&] {
    resolve(c, RankPlan().add("b.weight", Placement::box({0, 0}, {4, 7})), 0, 2);
  });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(process_bytes_read(), before);
}

using test::ThreadGroup;

TEST(RankLoad, GroupReadsEveryReplicatedByteOnce) {
  Model m;
  RankPlan plan = RankPlan::from_json(R"({"a.weight": "shard:0"})");
  for (int world : {2, 3}) {
    ThreadGroup g(world);
    std::vector<std::vector<Tensor>> got(world);
    std::vector<RankLoadPlan> plans(world);
    std::vector<int> calls(world);
    Checkpoint c = Checkpoint::open(m.path);
    const uint64_t before = process_bytes_read();
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup::Member ex(g, r);
        plans[r] = resolve(c, plan, r, world);
        got[r] = load_group(c, plans[r], ex, 64);  // small rounds: several all-gathers
        calls[r] = ex.calls;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(process_bytes_read() - before, m.bytes) << world;
    EXPECT_GT(calls[0], 1);
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < m.tensors.size(); ++i)
        EXPECT_EQ(got[r][i].contiguous_bytes(), box_of(m[got[r][i].name()], plans[r].tensors[i]))
            << r << " " << got[r][i].name();
  }
}

// A DCP folder of two data files (each tensor in two chunks along dim 0): a rank reads, of each
// chunk that meets its box, only the part that meets it; the replicated parts end at row
// boundaries; a byte read through the folder's data files is counted once.
TEST(RankLoad, GroupReadsEveryByteOfADcpFolderOnce) {
  Model m;
  const std::string dir = m.dir.file("dcp");
  save_dcp(dir, nullptr, m.tensors, {.files = 2, .fsync = false});
  RankPlan plan = RankPlan::from_json(R"({"a.weight": "shard:1", "b.weight": "shard:0"})");
  for (int world : {1, 2, 3}) {
    ThreadGroup g(world);
    std::vector<std::vector<Tensor>> got(world);
    std::vector<RankLoadPlan> plans(world);
    Checkpoint c = Checkpoint::open(dir);
    const uint64_t before = process_bytes_read();
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup::Member ex(g, r);
        plans[r] = resolve(c, plan, r, world);
        got[r] = load_group(c, plans[r], ex, 30);  // rounds that end inside rows
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(process_bytes_read() - before, m.bytes) << world;
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < m.tensors.size(); ++i)
        EXPECT_EQ(got[r][i].contiguous_bytes(), box_of(m[got[r][i].name()], plans[r].tensors[i]))
            << r << "/" << world << " " << got[r][i].name();
  }
}

// An exchange that only fills parts in place (as the Python module's broadcasts do): every rank
// gets the same cuts, and rank k's part is copied from rank k's round; no all_gather.
class InPlaceGroup {
 public:
  explicit InPlaceGroup(int n) : n_(n), rounds_(n), cuts_(n), sync_(n) {}
  class Member final : public RankExchange {
   public:
    Member(InPlaceGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int world() const override { return g_.n_; }
    void gather_parts(std::span<std::byte> round, std::span<const uint64_t> cuts,
                      const Device& device) override {
      EXPECT_TRUE(device.is_cpu());
      g_.rounds_[rank_] = round.data();
      g_.cuts_[rank_].assign(cuts.begin(), cuts.end());
      g_.sync_.arrive_and_wait();
      for (int k = 0; k < g_.n_; ++k) {
        EXPECT_EQ(g_.cuts_[k], g_.cuts_[rank_]) << k;
        const uint64_t at = cuts[k] - cuts[0], len = cuts[k + 1] - cuts[k];
        if (k != rank_ && len) std::memcpy(round.data() + at, g_.rounds_[k] + at, len);
      }
      ++rounds;
      g_.sync_.arrive_and_wait();
    }
    int rounds = 0;

   private:
    InPlaceGroup& g_;
    int rank_;
  };

 private:
  int n_;
  std::vector<std::byte*> rounds_;
  std::vector<std::vector<uint64_t>> cuts_;
  std::barrier<> sync_;
};

TEST(RankLoad, AnExchangeInPlaceFillsEachPartFromItsRank) {
  Model m;
  const std::string dcp = m.dir.file("dcp");
  save_dcp(dcp, nullptr, m.tensors, {.files = 2, .fsync = false});
  for (const std::string& path : {m.path, dcp}) {
    for (int world : {2, 3}) {
      InPlaceGroup g(world);
      std::vector<std::vector<Tensor>> got(world);
      std::vector<RankLoadPlan> plans(world);
      std::vector<int> rounds(world);
      Checkpoint c = Checkpoint::open(path);
      const uint64_t before = process_bytes_read();
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          InPlaceGroup::Member ex(g, r);
          plans[r] = resolve(c, RankPlan::from_json(R"({"a.weight": "shard:0"})"), r, world);
          got[r] = load_group(c, plans[r], ex, 100);  // rounds that end inside rows
          rounds[r] = ex.rounds;
        });
      for (auto& t : threads) t.join();
      EXPECT_EQ(process_bytes_read() - before, m.bytes) << path << " " << world;
      EXPECT_GT(rounds[0], 1);
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < m.tensors.size(); ++i)
          EXPECT_EQ(got[r][i].contiguous_bytes(), box_of(m[got[r][i].name()], plans[r].tensors[i]))
              << path << " " << r << "/" << world << " " << got[r][i].name();
    }
  }
}

TEST(RankLoad, AFailedExchangeNamesTheRankAndTheTensor) {
  Model m;
  ThreadGroup g(1);
  g.fail_rank = 0;
  Checkpoint c = Checkpoint::open(m.path);
  // A group of one exchanges nothing: a member that claims two ranks fails on its first round.
  class Lying final : public RankExchange {
   public:
    int rank() const override { return 1; }
    int world() const override { return 2; }
    void all_gather(std::span<const std::byte>, std::span<std::byte>) override {
      throw std::runtime_error("Timed out waiting 2000ms");
    }
  } ex;
  auto e = test::capture_error([&] { load_group(c, resolve(c, RankPlan(), 1, 2), ex); });
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_EQ(e.record(), c.tensors()[0].name);
  EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("Timed out"), std::string::npos) << e.what();
  ThreadGroup::Member other(g, 0);
  e = test::capture_error([&] { load_group(c, resolve(c, RankPlan(), 1, 2), other); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
