// load_group's reader thread: a rank reads its parts of later rounds and its Shard boxes while a
// round's collective runs (shown without timing: round 0's gather_parts waits until the rank's
// source has seen those reads, which a sequential load makes only after it), host and device
// (the host copy engine), with the sequential load's bytes; and what each rank sees when a part
// read, a box read or the exchange fails (ThreadGroup's timeout standing in for
// torch.distributed's).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "ckpt/ckpt.h"
#include "device_test_util.h"
#include "rank_exchange_util.h"
#include "test_util.h"

namespace ckpt {
namespace {

using namespace std::chrono_literals;
using test::ThreadGroup;

// r (16 KiB) and t replicated, s sharded along rows. With rounds of kBudget over 2 ranks, r fills
// rounds 0-3 (rank k's part of round i: r's bytes [4096 i + 2048 k, + 2048)), t round 4.
constexpr uint64_t kBudget = 4096;
constexpr int kRounds = 5;
const char* const kPlan = R"({"s": "shard:0"})";

struct Model {
  test::TempDir dir;
  std::string path = dir.file("m.safetensors");
  std::vector<Tensor> tensors;
  Model() {
    add("r", {64, 64});
    add("s", {32, 16});
    add("t", {8});
    save_safetensors(path, tensors);
  }
  void add(std::string name, std::vector<int64_t> shape) {
    tensors.push_back(
        test::numbered_floats(std::move(name), std::move(shape), tensors.size() * 10000));
  }
};

const RankTensor& tensor_of(const Checkpoint& c, const RankLoadPlan& p, const std::string& name) {
  for (const RankTensor& rt : p.tensors)
    if (c.tensors()[rt.tensor].name == name) return rt;
  throw std::runtime_error("no " + name);
}

// The file bytes a rank reads that a test watches: its part of round `round` (of r) and its box
// of s.
struct Spots {
  FileRange part, box;
  Spots(const std::string& path, int rank, int round) {
    Checkpoint c = Checkpoint::open(path);
    RankLoadPlan p = resolve(c, RankPlan::from_json(kPlan), rank, 2);
    const uint64_t r0 = tensor_of(c, p, "r").ranges.at(0).offset;
    part = {0, r0 + kBudget * round + kBudget / 2 * rank, kBudget / 2};
    box = tensor_of(c, p, "s").ranges.at(0);
  }
};

bool meets(uint64_t off, uint64_t len, const FileRange& f) {
  return off < f.offset + f.length && f.offset < off + len;
}

// The reads one rank's source has seen, to wait on from another thread.
class Reads {
 public:
  void add(uint64_t off, uint64_t len) {
    std::lock_guard<std::mutex> l(m_);
    seen_.emplace_back(off, len);
    cv_.notify_all();
  }
  // True once a read has met f; false after a minute without one (the test then fails).
  bool wait_meet(const FileRange& f) {
    std::unique_lock<std::mutex> l(m_);
    return cv_.wait_for(l, 60s, [&] { return met_locked(f); });
  }
  bool met(const FileRange& f) {
    std::lock_guard<std::mutex> l(m_);
    return met_locked(f);
  }

 private:
  bool met_locked(const FileRange& f) const {
    for (auto [off, len] : seen_)
      if (meets(off, len, f)) return true;
    return false;
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, uint64_t>> seen_;
};

// A ThreadGroup member that calls before(i) ahead of round i's gather_parts (which it may fail).
class Watching final : public RankExchange {
 public:
  Watching(ThreadGroup& g, int rank, std::function<void(int)> before)
      : member(g, rank), before_(std::move(before)) {}
  int rank() const override { return member.rank(); }
  int world() const override { return member.world(); }
  void gather_parts(std::span<std::byte> round, std::span<const uint64_t> cuts,
                    const Device& device) override {
    if (before_) before_(rounds_++);
    member.gather_parts(round, cuts, device);
  }
  ThreadGroup::Member member;

 private:
  std::function<void(int)> before_;
  int rounds_ = 0;
};

// One load_group per rank of two on threads, rank k reading through a WatchedSource that calls
// on_read(k, offset, length), its exchange calling before(k, round); done(k) once its load_group
// has returned or thrown.
struct Group {
  std::vector<std::vector<Tensor>> got{2};
  std::vector<std::optional<Error>> errors{2};
  std::vector<int> calls = {0, 0};
  Group(const Model& m, ThreadGroup& g, const LoadOptions& o,
        std::function<void(int, uint64_t, uint64_t)> on_read,
        std::function<void(int, int)> before = nullptr, std::function<void(int)> done = nullptr) {
    std::vector<std::thread> threads;
    for (int k = 0; k < 2; ++k)
      threads.emplace_back([&, k] {
        auto src = std::make_shared<test::WatchedSource>(
            m.path, [&, k](uint64_t off, uint64_t len) { on_read(k, off, len); });
        Checkpoint c = Checkpoint::open(src);
        src->watch();
        Watching ex(g, k,
                    before ? std::function<void(int)>([&, k](int i) { before(k, i); }) : nullptr);
        try {
          got[k] = load_group(c, resolve(c, RankPlan::from_json(kPlan), k, 2), ex, kBudget, o);
        } catch (const Error& e) {
          errors[k] = e;
        }
        if (done) done(k);
        calls[k] = ex.member.calls;
      });
    for (auto& t : threads) t.join();
  }
};

// The tensors' bytes: host memory as it is, device memory copied back through the engine.
std::vector<std::byte> bytes_of(const Tensor& t, internal::CopyEngine* e) {
  if (!e) return t.contiguous_bytes();
  std::vector<std::byte> out(t.info().nbytes());
  if (!out.empty()) e->to_host(out.data(), t.data(), out.size());
  return out;
}

LoadOptions on_device() {
  LoadOptions o;
  o.device = Device::cuda(0);
  o.staging_bytes = 2 << 20;
  o.threads = 2;
  return o;
}

// Round 0's collective waits until the rank has read its part of round 1 and its box: a
// sequential load reads neither before round 0's collective returns (its wait fails the load).
void check_read_ahead(const LoadOptions& o, internal::CopyEngine* engine) {
  Model m;
  std::vector<Reads> reads(2);
  std::vector<Spots> spots = {Spots(m.path, 0, 1), Spots(m.path, 1, 1)};
  ThreadGroup g(2);
  Group run(
      m, g, o, [&](int k, uint64_t off, uint64_t len) { reads[k].add(off, len); },
      [&](int k, int round) {
        if (round != 0) return;
        if (!reads[k].wait_meet(spots[k].part))
          throw std::runtime_error("round 1's part not read during round 0's collective");
        if (!reads[k].wait_meet(spots[k].box))
          throw std::runtime_error("the Shard box not read during round 0's collective");
      });
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(run.errors[k]) << run.errors[k]->what();
    EXPECT_EQ(run.calls[k], kRounds);
    // Byte for byte what the sequential load (load_rank, host) gives.
    Checkpoint c = Checkpoint::open(m.path);
    std::vector<Tensor> want = load_rank(c, resolve(c, RankPlan::from_json(kPlan), k, 2));
    ASSERT_EQ(run.got[k].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(bytes_of(run.got[k][i], engine), want[i].contiguous_bytes())
          << k << " " << want[i].name();
  }
}

TEST(RankOverlap, LaterRoundsAndBoxesAreReadDuringACollective) { check_read_ahead({}, nullptr); }

TEST(RankOverlap, LaterRoundsAndBoxesAreReadDuringACollectiveOnADevice) {
  internal::HostCopyEngine engine;
  test::UseEngine use(engine);
  check_read_ahead(on_device(), &engine);
  EXPECT_LE(engine.staging_peak(), 2u << 20);  // one staging ring at a time
}

Error injected(const std::string& path) {
  return Error(ErrorCode::kIo, "injected read failure", path, "", 1234);
}

// Rank 1's read of its part of round 2 fails: it throws that error as it was thrown (as the
// sequential load_rank does), after rounds 0 and 1 and without round 2's collective, and reads
// nothing more; rank 0 is left alone in round 2 until the group's timeout.
TEST(RankOverlap, AFailedPartReadFailsItsRankBeforeThatRound) {
  Model m;
  const Spots bad(m.path, 1, 2);
  std::atomic<bool> box_read{false};
  auto on_read = [&](int k, uint64_t off, uint64_t len) {
    if (k != 1) return;
    if (meets(off, len, bad.box)) box_read = true;
    if (meets(off, len, bad.part)) throw injected(m.path);
  };
  ThreadGroup g(2, 2s);
  Group run(m, g, {}, on_read);
  ASSERT_TRUE(run.errors[1]);
  auto src = std::make_shared<test::WatchedSource>(
      m.path, [&](uint64_t off, uint64_t len) { on_read(1, off, len); });
  Checkpoint c = Checkpoint::open(src);
  src->watch();
  const Error seq =
      test::capture_error([&] { load_rank(c, resolve(c, RankPlan::from_json(kPlan), 1, 2)); });
  EXPECT_EQ(run.errors[1]->code(), seq.code());
  EXPECT_STREQ(run.errors[1]->what(), seq.what());
  EXPECT_EQ(run.calls[1], 2);
  EXPECT_FALSE(box_read);
  ASSERT_TRUE(run.errors[0]);
  EXPECT_EQ(run.errors[0]->code(), ErrorCode::kIo);
  EXPECT_NE(std::string(run.errors[0]->what()).find("rank 0 of 2"), std::string::npos);
  EXPECT_NE(std::string(run.errors[0]->what()).find("timed out"), std::string::npos);
  EXPECT_EQ(run.calls[0], 2);
}

// Rank 1's read of its Shard box fails: every round still completes (rank 0 loads everything),
// then rank 1 throws that error.
TEST(RankOverlap, AFailedBoxReadComesAfterTheGroupCompletes) {
  Model m;
  const Spots bad(m.path, 1, 0);
  ThreadGroup g(2, 30s);
  Group run(m, g, {}, [&](int k, uint64_t off, uint64_t len) {
    if (k == 1 && meets(off, len, bad.box)) throw injected(m.path);
  });
  ASSERT_FALSE(run.errors[0]) << run.errors[0]->what();
  EXPECT_EQ(run.got[0].size(), 3u);
  ASSERT_TRUE(run.errors[1]);
  EXPECT_EQ(run.errors[1]->code(), ErrorCode::kIo);
  EXPECT_NE(std::string(run.errors[1]->what()).find("injected read failure"), std::string::npos);
  EXPECT_EQ(run.calls[0], kRounds);
  EXPECT_EQ(run.calls[1], kRounds);
}

// Rank 1's exchange fails while its reader is inside a box read: the read finishes (the reader
// is joined) before load_group throws Error{kIo} naming the rank.
TEST(RankOverlap, AFailedExchangeJoinsTheReaderFirst) {
  Model m;
  const Spots box(m.path, 1, 0);
  std::mutex mu;
  std::condition_variable cv;
  bool in_box = false, failed = false, box_done = false, done_at_throw = false;
  auto on_read = [&](int k, uint64_t off, uint64_t len) {
    if (k != 1 || !meets(off, len, box.box)) return;
    std::unique_lock<std::mutex> l(mu);
    in_box = true;
    cv.notify_all();
    cv.wait_for(l, 60s, [&] { return failed; });
    box_done = true;
  };
  ThreadGroup g(2, 2s);
  auto before = [&](int k, int round) {
    if (k != 1 || round != 0) return;
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, 60s, [&] { return in_box; });
    failed = true;
    cv.notify_all();
    throw std::runtime_error("connection closed by peer");
  };
  Group run(m, g, {}, on_read, before, [&](int k) {
    std::lock_guard<std::mutex> l(mu);
    if (k == 1) done_at_throw = box_done;
  });
  ASSERT_TRUE(run.errors[1]);
  EXPECT_EQ(run.errors[1]->code(), ErrorCode::kIo);
  EXPECT_NE(std::string(run.errors[1]->what()).find("rank 1 of 2"), std::string::npos);
  EXPECT_NE(std::string(run.errors[1]->what()).find("connection closed"), std::string::npos);
  EXPECT_TRUE(in_box);
  EXPECT_TRUE(done_at_throw);
  ASSERT_TRUE(run.errors[0]);
  EXPECT_EQ(run.errors[0]->code(), ErrorCode::kIo);
}

}  // namespace
}  // namespace ckpt
