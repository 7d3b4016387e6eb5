// Load paths: eager (coalesced plan, threads), streaming under a budget, reads into caller
// buffers, prefetch; every path bit-exact against the bytes that were saved.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "test_util.h"

namespace ckpt {
namespace {

struct Fixture {
  test::TempDir dir;
  std::string path;
  std::vector<std::vector<float>> data;
  std::vector<Tensor> tensors;
  explicit Fixture(size_t n = 40, size_t elems = 50000) {
    path = dir.file("f.pt");
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> v(elems + i);
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 1000003 + k);
      data.push_back(v);
      tensors.push_back(Tensor::copy_of("t" + std::to_string(i), DType::kFloat32,
                                        {static_cast<int64_t>(v.size())},
                                        std::as_bytes(std::span<const float>(v))));
    }
    // A view sharing t0's storage.
    TensorInfo view = tensors[0].info();
    view.name = "t0_tail";
    view.shape = {10};
    view.storage_offset = 5;
    tensors.emplace_back(view, tensors[0].storage());
    SaveOptions so;
    so.fsync = false;
    save_torch(path, state_dict_value(tensors), tensors, so);
  }
  bool same(const Tensor& t) const {
    size_t i = std::stoul(t.name().substr(1));
    if (t.name() == "t0_tail") return std::memcmp(t.data(), data[0].data() + 5, 40) == 0;
    return t.info().nbytes() == data[i].size() * 4 &&
           std::memcmp(t.data(), data[i].data(), data[i].size() * 4) == 0;
  }
};

TEST(Load, EagerEveryThreadCountAndFilter) {
  Fixture f;
  for (bool mmap : {true, false})
    for (int threads : {1, 2, 5}) {
      OpenOptions o;
      o.mmap = mmap;
      Checkpoint c = Checkpoint::open(f.path, o);
      LoadOptions lo;
      lo.threads = threads;
      lo.verify = threads == 2;
      auto all = c.load_all(lo);
      ASSERT_EQ(all.size(), f.tensors.size());
      for (auto& t : all) EXPECT_TRUE(f.same(t)) << t.name();
      EXPECT_EQ(all[0].storage().get(), all.back().storage().get());  // view shares
      // A sparse subset is packed rather than mirrored; still exact.
      auto some =
          c.load_all(lo, [](const TensorInfo& t) { return t.name == "t3" || t.name == "t31"; });
      ASSERT_EQ(some.size(), 2u);
      for (auto& t : some) EXPECT_TRUE(f.same(t));
    }
}

// open_and_load overlaps reading the data records with parsing data.pkl; the result must be
// what open + load_all gives, for every thread count, source kind and with verification.
TEST(Load, OpenAndLoadEqualsOpenThenLoadAll) {
  Fixture f;
  for (bool mmap : {true, false})
    for (int threads : {1, 2, 5}) {
      OpenOptions o;
      o.mmap = mmap;
      LoadOptions lo;
      lo.threads = threads;
      lo.verify = threads != 1;
      LoadedCheckpoint l = Checkpoint::open_and_load(f.path, o, lo);
      Checkpoint c = Checkpoint::open(f.path, o);
      ASSERT_EQ(l.tensors.size(), c.tensors().size());
      for (size_t i = 0; i < l.tensors.size(); ++i) {
        EXPECT_EQ(l.tensors[i].name(), c.tensors()[i].name);
        EXPECT_TRUE(f.same(l.tensors[i])) << l.tensors[i].name();
      }
      EXPECT_EQ(l.tensors[0].storage().get(), l.tensors.back().storage().get());  // view shares
      EXPECT_EQ(l.checkpoint.tensors().size(), c.tensors().size());
    }
}

// ckpt/memory.h: the memory of a freed eager load (at least 64 MiB) is kept, lazily freed, for
// the next load of a similar size, which gets the same memory and the right bytes; a load of
// another size releases it first (never two at once); limit 0 turns keeping off.
TEST(Load, FreedLoadMemoryIsKeptForTheNextLoad) {
  const uint64_t limit = kept_memory_limit();
  set_kept_memory_limit(uint64_t{1} << 40);
  Fixture big(2, 9u << 20);    // 2 x 36 MiB
  Fixture other(1, 1u << 20);  // 4 MiB: an arena of its own, below the 64 MiB floor
  release_kept_memory();
  const std::byte* first = nullptr;
  {
    LoadedCheckpoint l = Checkpoint::open_and_load(big.path);
    first = l.tensors[0].data();
    EXPECT_EQ(kept_memory(), 0u);
  }
  const uint64_t kept = kept_memory();
  EXPECT_GE(kept, uint64_t{72} << 20);
  for (int round = 0; round < 2; ++round) {
    Checkpoint c = Checkpoint::open(big.path);
    auto all = c.load_all();
    EXPECT_EQ(kept_memory(), 0u);  // taken by this load
    EXPECT_EQ(all[0].data(), first);
    for (auto& t : all) EXPECT_TRUE(big.same(t)) << t.name();
  }
  EXPECT_EQ(kept_memory(), kept);
  {
    LoadedCheckpoint l = Checkpoint::open_and_load(other.path);  // too small to take it
    EXPECT_EQ(kept_memory(), 0u);                                // and it was released
    for (auto& t : l.tensors) EXPECT_TRUE(other.same(t));
  }
  EXPECT_EQ(kept_memory(), 0u);  // below the floor: not kept
  { LoadedCheckpoint l = Checkpoint::open_and_load(big.path); }
  EXPECT_EQ(release_kept_memory(), kept);
  EXPECT_EQ(kept_memory(), 0u);
  set_kept_memory_limit(0);
  { LoadedCheckpoint l = Checkpoint::open_and_load(big.path); }
  EXPECT_EQ(kept_memory(), 0u);
  set_kept_memory_limit(limit);
}

// LoadOptions::on_placed: called once, on the calling thread, with the tensors the load then
// returns (same storages, same addresses), for open_and_load and load_all of every format; an
// exception it throws fails the load (and stops it) and reaches the caller.
TEST(Load, OnPlacedSeesTheTensorsBeforeTheLoadReturns) {
  Fixture f(6, 200000);
  std::string st = f.dir.file("p.safetensors");
  save_safetensors(st, std::vector<Tensor>(f.tensors.begin(), f.tensors.begin() + 6));
  for (const std::string& path : {f.path, st})
    for (int threads : {1, 2, 4})
      for (bool both : {true, false}) {
        int calls = 0;
        std::vector<const std::byte*> seen;
        size_t seen_tensors = 0;
        const std::thread::id me = std::this_thread::get_id();
        LoadOptions lo;
        lo.threads = threads;
        lo.on_placed = [&](const Checkpoint& c, const std::vector<Tensor>& ts) {
          ++calls;
          EXPECT_EQ(std::this_thread::get_id(), me);
          seen_tensors = c.tensors().size();
          for (const Tensor& t : ts) seen.push_back(t.storage()->data);
        };
        std::vector<Tensor> got;
        if (both) {
          got = Checkpoint::open_and_load(path, {}, lo).tensors;
        } else {
          got = Checkpoint::open(path).load_all(lo);
        }
        ASSERT_EQ(calls, 1) << path;
        ASSERT_EQ(seen.size(), got.size());
        EXPECT_EQ(seen_tensors, got.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(seen[i], got[i].storage()->data) << got[i].name();
          EXPECT_TRUE(f.same(got[i])) << got[i].name();
        }
      }
  LoadOptions lo;
  lo.on_placed = [](const Checkpoint&, const std::vector<Tensor>&) {
    throw Error(ErrorCode::kInvalidArgument, "refused by the hook");
  };
  Error e = test::capture_error([&] { Checkpoint::open_and_load(f.path, {}, lo); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("refused by the hook"), std::string::npos);
  e = test::capture_error([&] { Checkpoint::open(st).load_all(lo); });
  EXPECT_NE(std::string(e.what()).find("refused by the hook"), std::string::npos);
}

TEST(Load, OpenAndLoadVerifiesEveryRecordAndNamesTheBadOne) {
  Fixture f(8, 300000);  // 1.2 MB records: CRCs span several 1 MiB slices
  auto bytes = test::read_file(f.path);
  const StorageInfo st = Checkpoint::open(f.path).storages()[5];
  bytes[st.offset + st.nbytes - 3] ^= std::byte{0x40};
  test::write_file(f.path, bytes);
  LoadOptions lo;
  lo.verify = true;
  Error e = test::capture_error([&] { Checkpoint::open_and_load(f.path, {}, lo); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), st.record);
  EXPECT_NE(e.message().find("t5"), std::string::npos) << e.what();
  EXPECT_NO_THROW(Checkpoint::open_and_load(f.path));  // without verify: loads as stored
}

TEST(Load, OpenAndLoadOfOtherFormatsAndBadFiles) {
  Fixture f(4, 1000);
  // safetensors: opened, then loaded (no overlap to gain).
  std::string st = f.dir.file("f.safetensors");
  save_safetensors(st, std::vector<Tensor>(f.tensors.begin(), f.tensors.begin() + 4));
  LoadedCheckpoint l = Checkpoint::open_and_load(st);
  ASSERT_EQ(l.tensors.size(), 4u);
  for (auto& t : l.tensors) EXPECT_TRUE(f.same(t)) << t.name();
  // A torch file cut short: the preload's reads and the open both fail cleanly; the error names
  // the file.
  auto bytes = test::read_file(f.path);
  for (size_t keep : {bytes.size() - 30, bytes.size() / 2, size_t{100}}) {
    std::string cut = f.dir.file("cut.pt");
    test::write_file(cut, std::span<const std::byte>(bytes.data(), keep));
    Error e = test::capture_error([&] { Checkpoint::open_and_load(cut); });
    EXPECT_TRUE(e.code() == ErrorCode::kTruncated || e.code() == ErrorCode::kCorrupt) << e.what();
    EXPECT_EQ(e.source(), cut);
  }
}

TEST(Load, StreamingKeepsToTheBudget) {
  Fixture f;
  Checkpoint c = Checkpoint::open(f.path);
  const uint64_t budget = 600 << 10;  // ~3 storages of ~200 KB
  size_t seen = 0;
  std::vector<std::string> names;
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;
  c.stream(budget, [&](const Tensor& t) {
    EXPECT_TRUE(f.same(t)) << t.name();
    names.push_back(t.name());
    // Every tensor lies inside one ring of `budget` bytes.
    const std::byte* s = t.storage()->data;
    if (!lo || s < lo) lo = s;
    if (!hi || s + t.storage()->info.nbytes > hi) hi = s + t.storage()->info.nbytes;
    ++seen;
  });
  EXPECT_EQ(seen, f.tensors.size());
  EXPECT_LE(static_cast<uint64_t>(hi - lo), budget);
  EXPECT_EQ(names[0], "t0");
  EXPECT_EQ(names[1], "t0_tail");  // views of a storage come while it is loaded
  LoadOptions v;
  v.verify = true;
  size_t n = 0;
  c.stream(
      budget, [&](const Tensor&) { ++n; }, v, [](const TensorInfo& t) { return t.name != "t7"; });
  EXPECT_EQ(n, f.tensors.size() - 1);
}

// Several readers fill the ring ahead of the consumer (large storages in pieces); the consumer
// still sees every storage whole, in file order, within the budget, for every reader count.
TEST(Load, StreamingWithSeveralReaders) {
  Fixture f(6, 3 << 20);  // 12 MiB storages: read in 8 MiB pieces by several threads
  for (bool mmap : {true, false})
    for (int threads : {1, 2, 7}) {
      OpenOptions o;
      o.mmap = mmap;
      Checkpoint c = Checkpoint::open(f.path, o);
      LoadOptions lo;
      lo.threads = threads;
      const uint64_t budget = 40 << 20;  // three storages at most
      std::vector<std::string> names;
      c.stream(
          budget,
          [&](const Tensor& t) {
            EXPECT_TRUE(f.same(t)) << t.name() << " threads " << threads;
            names.push_back(t.name());
          },
          lo);
      ASSERT_EQ(names.size(), f.tensors.size());
      EXPECT_EQ(names[0], "t0");
      EXPECT_EQ(names[1], "t0_tail");
      EXPECT_EQ(names.back(), "t5");
      // A consumer that stops early: the readers stop too, and the error propagates.
      int calls = 0;
      EXPECT_THROW(c.stream(
                       budget,
                       [&](const Tensor&) {
                         if (++calls == 3) throw std::runtime_error("stop");
                       },
                       lo),
                   std::runtime_error);
    }
}

TEST(Load, StreamingErrors) {
  Fixture f(4);
  Checkpoint c = Checkpoint::open(f.path);
  EXPECT_CKPT_ERROR(c.stream(1000, [](const Tensor&) {}), ErrorCode::kInvalidArgument);
  // An exception from the callback stops the reader and propagates.
  int calls = 0;
  EXPECT_THROW(c.stream(1 << 20,
                        [&](const Tensor&) {
                          if (++calls == 2) throw std::runtime_error("stop");
                        }),
               std::runtime_error);
  EXPECT_EQ(calls, 2);
  // A corrupted storage is reported through the stream with verify.
  auto bytes = test::read_file(f.path);
  bytes[c.storages()[2].offset + 3] ^= std::byte{0x40};
  test::write_file(f.path, bytes);
  Checkpoint bad = Checkpoint::open(f.path);
  LoadOptions v;
  v.verify = true;
  EXPECT_CKPT_ERROR(bad.stream(
                        1 << 20, [](const Tensor&) {}, v),
                    ErrorCode::kCorrupt);
}

TEST(Load, ReadIntoCallerBuffers) {
  Fixture f(5);
  Checkpoint c = Checkpoint::open(f.path);
  for (size_t i = 0; i < c.tensors().size(); ++i) {
    std::vector<std::byte> buf(c.tensors()[i].nbytes());
    c.read_into(i, buf);
    Tensor t = Tensor::from_bytes(c.tensors()[i].name, DType::kFloat32, c.tensors()[i].shape, buf);
    EXPECT_TRUE(f.same(t)) << t.name();
  }
  std::vector<std::byte> small(8);
  EXPECT_CKPT_ERROR(c.read_into(0, small), ErrorCode::kInvalidArgument);
  c.prefetch();
  c.prefetch(std::vector<size_t>{1, 2}, true);
}

TEST(Load, ConcurrentReadersSeeTheSameBytes) {
  Fixture f(16);
  Checkpoint c = Checkpoint::open(f.path, {.mmap = false});
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = k % 3; i < c.tensors().size(); i += 2)
        if (!f.same(c.tensor(i))) ++bad;
      for (auto& t : c.load_all({.threads = 2}))
        if (!f.same(t)) ++bad;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// Bytes a mapped file's view points at are read-only; every other load owns writable memory.
TEST(Load, MappedViewsAreReadOnlyLoadsAreWritable) {
  Fixture f(3, 1000);
  Checkpoint c = Checkpoint::open(f.path);
  StoragePtr view = c.storage(0);
  EXPECT_FALSE(view->writable);
  EXPECT_EQ(test::capture_error([&] { view->mutable_bytes(); }).code(),
            ErrorCode::kInvalidArgument);
  LoadOptions copy;
  copy.copy = true;
  Checkpoint c2 = Checkpoint::open(f.path);  // a fresh cache: storage 0 is not shared yet
  StoragePtr owned = c2.storage(0, copy);
  ASSERT_TRUE(owned->writable);
  owned->mutable_bytes()[0] = std::byte{0x7f};
  EXPECT_NE(std::memcmp(owned->data, view->data, 4), 0);  // the file's mapping is untouched
  for (const Tensor& t : c.load_all()) EXPECT_TRUE(t.storage()->writable);
  c.stream(1 << 20, [](const Tensor& t) { EXPECT_TRUE(t.storage()->writable); });
  EXPECT_TRUE(f.same(c.tensor(size_t{0})));
  // view(): storage()'s view bytes without a Storage; nullptr where storage() would read.
  for (size_t i = 0; i < c.storages().size(); ++i) EXPECT_EQ(c.view(i), c.storage(i)->data);
  OpenOptions no_map;
  no_map.mmap = false;
  Checkpoint unmapped = Checkpoint::open(f.path, no_map);
  EXPECT_EQ(unmapped.view(0), nullptr);
  EXPECT_EQ(test::capture_error([&] { (void)c.view(c.storages().size()); }).code(),
            ErrorCode::kInvalidArgument);
}

// A mapping opened with writable views: storages over it may be written, copy-on-write, and the
// file never changes (a fresh open reads the old bytes).
TEST(Load, WritableMappedViewsAreCopyOnWrite) {
  Fixture f(3, 1000);
  SourcePtr src = open_mmap_source(f.path, true);
  EXPECT_TRUE(src->memory_writable());
  EXPECT_FALSE(open_mmap_source(f.path)->memory_writable());
  EXPECT_FALSE(open_file_source(f.path)->memory_writable());
  Checkpoint c = Checkpoint::open(src);
  StoragePtr view = c.storage(0);
  ASSERT_TRUE(view->writable);
  EXPECT_EQ(view->data, c.view(0));  // a view, not a copy
  std::vector<std::byte> before(view->data, view->data + 4);
  for (auto& b : view->mutable_bytes().first(4)) b = ~b;
  EXPECT_NE(std::memcmp(view->data, before.data(), 4), 0);
  Checkpoint fresh = Checkpoint::open(f.path);
  EXPECT_EQ(std::memcmp(fresh.storage(0)->data, before.data(), 4), 0);  // the file is unchanged
}

// Every path builds the same plan: one storage loaded by storage(), load_all, stream and
// read_into gives the same bytes, with and without verification, mapped or read.
TEST(Load, EveryPathAgreesOnEveryStorage) {
  Fixture f(6, 3000);
  for (bool mmap : {true, false}) {
    OpenOptions o;
    o.mmap = mmap;
    Checkpoint c = Checkpoint::open(f.path, o);
    LoadOptions lo;
    lo.verify = true;
    auto all = c.load_all(lo);
    std::vector<std::vector<std::byte>> streamed(c.tensors().size());
    c.stream(
        1 << 20, [&](const Tensor& t) { streamed[*c.find(t.name())] = t.contiguous_bytes(); }, lo);
    for (size_t i = 0; i < c.tensors().size(); ++i) {
      std::vector<std::byte> into(c.tensors()[i].nbytes());
      c.read_into(i, into, lo);
      EXPECT_EQ(into, all[i].contiguous_bytes()) << i;
      EXPECT_EQ(streamed[i], into) << i;
      EXPECT_EQ(c.tensor(i, lo).contiguous_bytes(), into) << i;
      EXPECT_TRUE(f.same(all[i]));
    }
  }
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// LoadOptions::progress and verify(progress): calls never overlap, `done` never goes back and
// never passes `total`, and the last call is done == total == the bytes of what was loaded or
// checked. With an interval of 0 ms every piece may report (the meter still throttles to one
// caller at a time).
struct ProgressLog {
  std::mutex mu;
  std::atomic<int> inside{0};
  bool overlapped = false, went_back = false, past_total = false;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  ProgressFn fn() {
    return [this](uint64_t done, uint64_t total) {
      if (inside.fetch_add(1) != 0) overlapped = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!calls.empty() && done < calls.back().first) went_back = true;
        if (done > total) past_total = true;
        calls.emplace_back(done, total);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      inside.fetch_sub(1);
    };
  }
  void check(uint64_t want_total) {
    ASSERT_FALSE(calls.empty());
    EXPECT_FALSE(overlapped);
    EXPECT_FALSE(went_back);
    EXPECT_FALSE(past_total);
    EXPECT_EQ(calls.back().first, want_total);
    EXPECT_EQ(calls.back().second, want_total);
  }
};

TEST(Load, ProgressReportsEveryPathToTheEnd) {
  Fixture f(40, 200000);
  uint64_t storage_bytes = 0;
  for (bool mmap : {true, false}) {
    OpenOptions o;
    o.mmap = mmap;
    Checkpoint c = Checkpoint::open(f.path, o);
    storage_bytes = 0;
    for (const auto& s : c.storages()) storage_bytes += s.nbytes;
    for (int threads : {1, 3}) {
      ProgressLog log;
      LoadOptions lo;
      lo.threads = threads;
      lo.progress = log.fn();
      auto all = c.load_all(lo);
      for (auto& t : all) EXPECT_TRUE(f.same(t)) << t.name();
      log.check(storage_bytes);
    }
    {
      ProgressLog log;
      LoadOptions lo;
      lo.progress = log.fn();
      c.stream(
          8 << 20, [&](const Tensor& t) { EXPECT_TRUE(f.same(t)); }, lo);
      log.check(storage_bytes);
    }
    {
      ProgressLog log;
      LoadOptions lo;
      lo.progress = log.fn();
      LoadedCheckpoint l = Checkpoint::open_and_load(f.path, o, lo);
      log.check(storage_bytes);
    }
  }
  // verify counts the bytes of every record it checks (data.pkl and the rest included).
  Checkpoint c = Checkpoint::open(f.path);
  ProgressLog log;
  EXPECT_EQ(c.verify(log.fn()), c.records().size());
  uint64_t record_bytes = 0;
  for (const auto& r : c.records()) record_bytes += r.size;
  log.check(record_bytes);
  // An empty callback changes nothing.
  EXPECT_EQ(c.verify(), c.records().size());
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// A source of one's own implements three methods (size, name, read_into): every load path works
// over it, with no mapping (in_memory() is null) and no hints.
class ThreeMethods final : public ByteSource {
 public:
  explicit ThreeMethods(std::vector<std::byte> b) : bytes_(std::move(b)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }

 private:
  std::vector<std::byte> bytes_;
  std::string name_ = "three-methods";
};

TEST(Load, ASourceOfThreeMethodsLoadsThroughEveryPath) {
  Fixture f(6, 3000);
  auto src = std::make_shared<ThreeMethods>(test::read_file(f.path));
  EXPECT_EQ(src->in_memory(), nullptr);
  EXPECT_EQ(src->memory(), nullptr);
  EXPECT_EQ(src->pread_twin(), nullptr);
  src->release(0, 100);  // a no-op without a mapping
  Checkpoint c = Checkpoint::open(src);
  for (const Tensor& t : c.load_all()) EXPECT_TRUE(f.same(t)) << t.name();
  size_t n = 0;
  c.stream(1 << 20, [&](const Tensor& t) { n += f.same(t); });
  EXPECT_EQ(n, f.tensors.size());
  EXPECT_TRUE(f.same(c.tensor("t3")));
  EXPECT_EQ(c.view(0), nullptr);
  std::vector<std::byte> dst(c.tensors()[2].nbytes());
  c.read_into(2, dst);
  EXPECT_TRUE(f.same(Tensor::from_bytes("t2", DType::kFloat32, c.tensors()[2].shape, dst)));
  EXPECT_GT(c.verify(), 0u);
}

}  // namespace
}  // namespace ckpt
