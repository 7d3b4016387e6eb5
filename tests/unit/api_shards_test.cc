// Sharded checkpoints (include/ckpt/checkpoint.h: open of an index, open_set; convert.h:
// max_shard_size): a set of files is one checkpoint, errors name the shard, convert writes the
// Hugging Face layout. The same against torch-written shards is tests/interop/test_sharded.py.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/convert.h"
#include "ckpt/safetensors.h"
#include "test_util.h"

namespace ckpt {
namespace {

using test::TempDir;

using test::make_tensor;

std::vector<Tensor> part(int k) {
  // In the order a safetensors file stores them (wider dtypes first).
  if (k == 0)
    return {make_tensor("a.bias", DType::kInt64, {8}, 2),
            make_tensor("a.weight", DType::kFloat32, {16, 8}, 1)};
  if (k == 1) return {make_tensor("b.weight", DType::kFloat16, {32, 4}, 3)};
  return {make_tensor("c.step", DType::kInt64, {}, 5),
          make_tensor("c.weight", DType::kBFloat16, {5, 5}, 4)};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Three shards (safetensors, pt, safetensors) and an index over them.
struct Set {
  TempDir dir;
  std::vector<std::string> files;
  std::string index;
  Set() {
    const char* names[] = {"m-00001-of-00003.safetensors", "m-00002-of-00003.bin",
                           "m-00003-of-00003.safetensors"};
    nlohmann::json wm;
    for (int k = 0; k < 3; ++k) {
      files.push_back(dir.file(names[k]));
      auto ts = part(k);
      if (k == 1) {
        SaveOptions o;
        o.fsync = false;
        save_torch(files.back(), state_dict_value(ts), ts, o);
      } else {
        save_safetensors(files.back(), ts);
      }
      for (const auto& t : ts) wm[t.name()] = names[k];
    }
    index = dir.file("m.index.json");
    write_text(index, nlohmann::json{{"metadata", {{"total_size", 1}}}, {"weight_map", wm}}.dump());
  }
};

std::vector<Tensor> all_parts() {
  std::vector<Tensor> v;
  for (int k = 0; k < 3; ++k)
    for (auto& t : part(k)) v.push_back(t);
  return v;
}

void expect_same(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.contiguous_bytes(), b.contiguous_bytes()) << a.name();
}

TEST(Shards, IndexOpensAsOneCheckpoint) {
  Set s;
  for (bool mmap : {true, false}) {
    OpenOptions oo;
    oo.mmap = mmap;
    Checkpoint c = Checkpoint::open(s.index, oo);
    ASSERT_EQ(c.shards().size(), 3u);
    auto want = all_parts();
    ASSERT_EQ(c.tensors().size(), want.size());
    EXPECT_EQ(c.properties().at("shards"), "3");
    EXPECT_EQ(c.source().name(), s.index);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(c.tensors()[i].name, want[i].name());
      expect_same(c.tensor(i), want[i]);
      expect_same(c.tensor(want[i].name()), want[i]);
      std::vector<std::byte> buf(want[i].info().nbytes());
      c.read_into(i, buf);
      EXPECT_EQ(buf, want[i].contiguous_bytes());
      EXPECT_EQ(c.root()->get(want[i].name())->tensor_index(), i);
    }
    EXPECT_EQ(c.shard_of(0), 0u);
    EXPECT_EQ(c.shard_of(2), 1u);
    EXPECT_EQ(c.shard_of(4), 2u);
    EXPECT_EQ(c.root()->module(), "collections");
    // Storage offsets are in their shard.
    const TensorInfo& b = c.tensors()[2];
    EXPECT_EQ(c.storages()[b.storage].offset, c.shards()[1].storages()[0].offset);

    uint64_t last_done = 0, last_total = 0;
    LoadOptions lo;
    lo.progress = [&](uint64_t d, uint64_t t) {
      EXPECT_GE(d, last_done);
      last_done = d;
      last_total = t;
    };
    auto loaded = c.load_all(lo);
    ASSERT_EQ(loaded.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      expect_same(loaded[i], want[i]);
      EXPECT_EQ(loaded[i].info().storage, c.tensors()[i].storage);
    }
    uint64_t total = 0;
    for (const auto& st : c.storages()) total += st.nbytes;
    EXPECT_EQ(last_done, total);
    EXPECT_EQ(last_total, total);

    auto filtered = c.load_all({}, [](const TensorInfo& t) { return t.name.ends_with("weight"); });
    ASSERT_EQ(filtered.size(), 3u);
    EXPECT_EQ(filtered[1].name(), "b.weight");
    expect_same(filtered[2], want[4]);

    std::vector<std::string> streamed;
    c.stream(1 << 20, [&](const Tensor& t) {
      streamed.push_back(t.name());
      expect_same(t, want[*c.find(t.name())]);
    });
    EXPECT_EQ(streamed.size(), want.size());
    c.prefetch();
  }
  LoadedCheckpoint l = Checkpoint::open_and_load(s.index);
  ASSERT_EQ(l.tensors.size(), 5u);
  expect_same(l.tensors[4], all_parts()[4]);
}

TEST(Shards, OpenSetOfFiles) {
  Set s;
  Checkpoint c = Checkpoint::open_set(s.files);
  ASSERT_EQ(c.shards().size(), 3u);
  auto want = all_parts();
  for (size_t i = 0; i < want.size(); ++i) expect_same(c.tensor(i), want[i]);
  EXPECT_EQ(c.format(), Format::kSafetensors);
  // One path: the file itself.
  Checkpoint one = Checkpoint::open_set({s.files[1]});
  EXPECT_TRUE(one.shards().empty());
  EXPECT_EQ(one.format(), Format::kTorchZip);
  // verify: each shard (only the torch shard has CRCs: its records).
  EXPECT_EQ(c.verify(), one.verify());
  EXPECT_FALSE(c.records().empty());
  EXPECT_EQ(c.records()[0].name.rfind("m-00002-of-00003.bin:", 0), 0u);
}

// files() and files_of() mean the same for every kind: a single file is one file, a set its
// shards; shard_of(t) is files_of(t)[0].
TEST(Shards, FilesOfEveryKind) {
  Set s;
  Checkpoint c = Checkpoint::open(s.index);
  EXPECT_EQ(c.files(), s.files);
  for (size_t i = 0; i < c.tensors().size(); ++i) {
    std::span<const uint32_t> f = c.files_of(i);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0], c.shard_of(i));
    EXPECT_EQ(c.files()[f[0]], c.shards()[f[0]].source().name());
  }
  Checkpoint one = Checkpoint::open(s.files[1]);
  EXPECT_EQ(one.files(), std::vector<std::string>{s.files[1]});
  ASSERT_EQ(one.files_of(0).size(), 1u);
  EXPECT_EQ(one.files_of(0)[0], 0u);
  EXPECT_EQ(test::capture_error([&] { (void)c.files_of(c.tensors().size()); }).code(),
            ErrorCode::kNotFound);
}

// view() of a set: the bytes in the mapping of the shard that holds the storage, kept alive by
// view_owner() after the set is gone; nullptr where the shard would read.
TEST(Shards, ViewOfASetIsTheShardsMapping) {
  Set s;
  auto want = all_parts();
  std::vector<std::shared_ptr<const void>> owners;
  std::vector<const std::byte*> views;
  {
    Checkpoint c = Checkpoint::open(s.index);
    for (size_t st = 0; st < c.storages().size(); ++st) {
      const std::byte* v = c.view(st);
      ASSERT_NE(v, nullptr) << st;
      EXPECT_EQ(v, c.storage(st)->data);
      owners.push_back(c.view_owner(st));
      ASSERT_NE(owners.back(), nullptr);
    }
    for (const TensorInfo& t : c.tensors()) views.push_back(c.view(t.storage));
    EXPECT_EQ(c.view_owner(0), c.shards()[0].source().memory_owner());
    EXPECT_EQ(test::capture_error([&] { (void)c.view(c.storages().size()); }).code(),
              ErrorCode::kInvalidArgument);
  }
  for (size_t i = 0; i < want.size(); ++i)  // contiguous, whole storages, native order
    EXPECT_EQ(std::memcmp(views[i], want[i].contiguous_bytes().data(), want[i].info().nbytes()), 0)
        << want[i].name();
  OpenOptions no_map;
  no_map.mmap = false;
  Checkpoint unmapped = Checkpoint::open(s.index, no_map);
  EXPECT_EQ(unmapped.view(0), nullptr);
  EXPECT_EQ(unmapped.view_owner(0), nullptr);
}

// LoadOptions::on_placed holds for a set: called once, on the calling thread, with the set and
// exactly the tensors the load returns (same addresses), filtered or not, and through
// open_and_load of an index; an exception it throws fails the load.
TEST(Shards, OnPlacedIsCalledOnceForASet) {
  Set s;
  auto want = all_parts();
  const TensorFilter weights = [](const TensorInfo& t) { return t.name.ends_with("weight"); };
  const TensorFilter none = [](const TensorInfo&) { return false; };
  for (int how = 0; how < 4; ++how) {
    int calls = 0;
    std::vector<const std::byte*> seen;
    std::vector<std::string> names;
    size_t seen_tensors = 0;
    const std::thread::id me = std::this_thread::get_id();
    LoadOptions lo;
    lo.on_placed = [&](const Checkpoint& c, const std::vector<Tensor>& ts) {
      ++calls;
      EXPECT_EQ(std::this_thread::get_id(), me);
      seen_tensors = c.tensors().size();
      for (const Tensor& t : ts) {
        seen.push_back(t.storage()->data);
        names.push_back(t.name());
      }
    };
    std::vector<Tensor> got;
    if (how == 0) got = Checkpoint::open(s.index).load_all(lo);
    if (how == 1) got = Checkpoint::open_set(s.files).load_all(lo, weights);
    if (how == 2) got = Checkpoint::open_and_load(s.index, {}, lo).tensors;
    if (how == 3) got = Checkpoint::open(s.index).load_all(lo, none);
    ASSERT_EQ(calls, 1) << how;
    EXPECT_EQ(seen_tensors, want.size());
    ASSERT_EQ(seen.size(), got.size());
    EXPECT_EQ(got.size(), how == 1 ? 3u : how == 3 ? 0u : want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(seen[i], got[i].storage()->data) << got[i].name();
      EXPECT_EQ(names[i], got[i].name());
      expect_same(got[i], want[*Checkpoint::open(s.index).find(got[i].name())]);
    }
  }
  LoadOptions lo;
  lo.on_placed = [](const Checkpoint&, const std::vector<Tensor>&) {
    throw Error(ErrorCode::kInvalidArgument, "refused by the hook");
  };
  Error e = test::capture_error([&] { Checkpoint::open(s.index).load_all(lo); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("refused by the hook"), std::string::npos);
}

// Progress of a set is one count: its last total is the sum of its files' own totals, for
// load_all, stream and verify, and `done` never goes back.
TEST(Shards, ProgressOfASetIsTheSumOfItsFiles) {
  Set s;
  struct Seen {
    uint64_t done = 0, total = 0;
    int back = 0;
    ProgressFn fn() {
      return [this](uint64_t d, uint64_t t) {
        if (d < done) ++back;
        done = d;
        total = t;
      };
    }
  };
  enum Op { kLoad, kStream, kVerify };
  auto run = [](const Checkpoint& c, Op op, Seen& seen) {
    LoadOptions lo;
    lo.progress = seen.fn();
    if (op == kLoad) (void)c.load_all(lo);
    if (op == kStream)
      c.stream(
          1 << 20, [](const Tensor&) {}, lo);
    if (op == kVerify) (void)c.verify(seen.fn());
  };
  Checkpoint c = Checkpoint::open(s.index);
  for (Op op : {kLoad, kStream, kVerify}) {
    Seen set;
    run(c, op, set);
    uint64_t sum = 0;
    for (const Checkpoint& shard : c.shards()) {
      Seen one;
      run(shard, op, one);
      EXPECT_EQ(one.done, one.total);
      sum += one.total;
    }
    EXPECT_GT(sum, 0u) << op;
    EXPECT_EQ(set.total, sum) << op;
    EXPECT_EQ(set.done, sum) << op;
    EXPECT_EQ(set.back, 0) << op;
  }
}

TEST(Shards, DuplicateNameNamesBothShards) {
  TempDir d;
  save_safetensors(d.file("x.safetensors"), {make_tensor("w", DType::kFloat32, {2}, 1)});
  save_safetensors(d.file("y.safetensors"), {make_tensor("w", DType::kFloat32, {2}, 2)});
  Error e = test::capture_error([&] {
    Checkpoint::open_set({d.file("x.safetensors"), d.file("y.safetensors")});
  });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(e.message().find("x.safetensors"), std::string::npos) << e.what();
  EXPECT_NE(e.message().find("y.safetensors"), std::string::npos) << e.what();
  EXPECT_EQ(e.record(), "w");
}

TEST(Shards, IndexErrorsNameTheShard) {
  Set s;
  // An entry its shard lacks.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(s.index));
  j["weight_map"]["ghost"] = "m-00002-of-00003.bin";
  write_text(s.index, j.dump());
  Error e = test::capture_error([&] { Checkpoint::open(s.index); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.source(), s.files[1]);
  EXPECT_EQ(e.record(), "ghost");
  // A missing shard.
  j["weight_map"].erase("ghost");
  j["weight_map"]["gone"] = "m-00004-of-00004.safetensors";
  write_text(s.index, j.dump());
  e = test::capture_error([&] { Checkpoint::open(s.index); });
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_NE(std::string(e.what()).find("m-00004-of-00004.safetensors"), std::string::npos);
  // A shard outside the index's folder.
  j["weight_map"]["gone"] = "/etc/passwd";
  write_text(s.index, j.dump());
  e = test::capture_error([&] { Checkpoint::open(s.index); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  // JSON that is no index.
  write_text(s.index, "{\"hidden\": 1}");
  e = test::capture_error([&] { Checkpoint::open(s.index); });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
}

TEST(Shards, IndexNamesOnlyFilesInItsFolder) {
  Set s;
  auto j = nlohmann::json::parse(std::ifstream(s.index));
  // URLs (no request is made: an unreachable port would be an io error) and escapes.
  for (const char* bad : {"http://127.0.0.1:1/m.safetensors", "s3://bucket/m.safetensors",
                          "HTTPS://h/m", "x://y", "../m-00002-of-00003.bin", "/etc/passwd"}) {
    j["weight_map"]["b.weight"] = bad;
    write_text(s.index, j.dump());
    Error e = test::capture_error([&] { Checkpoint::open(s.index); });
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << bad << ": " << e.what();
    EXPECT_EQ(e.record(), "b.weight") << bad;
  }
  // A shard that is a symbolic link out of the folder, and one under a linked folder.
  TempDir outside;
  std::filesystem::copy_file(s.files[1], outside.file("b.bin"));
  std::filesystem::create_symlink(outside.file("b.bin"), s.dir.file("link.bin"));
  std::filesystem::create_directory_symlink(outside.file(""), s.dir.file("sub"));
  for (const char* bad : {"link.bin", "sub/b.bin"}) {
    j["weight_map"]["b.weight"] = bad;
    write_text(s.index, j.dump());
    Error e = test::capture_error([&] { Checkpoint::open(s.index); });
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << bad << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("resolves outside the index's folder"), std::string::npos)
        << e.what();
  }
  // A link that stays inside is followed.
  std::filesystem::create_symlink("m-00002-of-00003.bin", s.dir.file("inside.bin"));
  j["weight_map"]["b.weight"] = "inside.bin";
  write_text(s.index, j.dump());
  EXPECT_EQ(Checkpoint::open(s.index).tensors().size(), 5u);
}

TEST(Shards, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("10GiB"), 10ull << 30);
  EXPECT_EQ(parse_byte_size("2048"), 2048u);
  EXPECT_EQ(parse_byte_size("1.5kb"), 1500u);
  EXPECT_EQ(parse_byte_size("7 MiB"), 7u << 20);
  for (const char* bad : {"", "0", "GB", "5XB", "1.2.3MB", "-5"})
    EXPECT_EQ(test::capture_error([&] { parse_byte_size(bad); }).code(),
              ErrorCode::kInvalidArgument)
        << bad;
}

TEST(Shards, ConvertWritesShardsAndIndex) {
  TempDir d;
  std::vector<Tensor> ts = {make_tensor("t0", DType::kFloat32, {10}, 1),    // 40 B
                            make_tensor("big", DType::kFloat32, {100}, 2),  // 400 B: alone
                            make_tensor("t1", DType::kFloat32, {5}, 3),     // 20 B
                            make_tensor("t2", DType::kFloat32, {5}, 4)};    // 20 B
  SaveOptions so;
  so.fsync = false;
  save_torch(d.file("in.pt"), state_dict_value(ts), ts, so);
  Checkpoint in = Checkpoint::open(d.file("in.pt"));
  for (const char* out : {"model.safetensors", "pytorch_model.bin"}) {
    ConvertOptions o;
    o.fsync = false;
    o.max_shard_size = 100;
    ConvertReport r = convert(in, d.file(out), o);
    ASSERT_EQ(r.files.size(), 3u);
    EXPECT_EQ(r.index, d.file(std::string(out) + ".index.json"));
    EXPECT_FALSE(std::filesystem::exists(d.file(out)));
    nlohmann::json j = nlohmann::json::parse(std::ifstream(r.index));
    EXPECT_EQ(j["metadata"]["total_size"], 480);
    const std::string ext = std::filesystem::path(out).extension().string();
    const std::string stem = std::filesystem::path(out).stem().string();
    EXPECT_EQ(j["weight_map"]["big"], stem + "-00002-of-00003" + ext);
    EXPECT_EQ(j["weight_map"]["t1"], stem + "-00003-of-00003" + ext);
    EXPECT_EQ(j["weight_map"]["t2"], stem + "-00003-of-00003" + ext);
    Checkpoint back = Checkpoint::open(r.index);
    ASSERT_EQ(back.tensors().size(), 4u);
    for (const auto& t : ts) expect_same(back.tensor(t.name()), t);
    // Sharded back to one file.
    ConvertOptions one;
    one.fsync = false;
    convert(back, d.file("one.pt"), one);
    Checkpoint c1 = Checkpoint::open(d.file("one.pt"));
    for (size_t i = 0; i < ts.size(); ++i) expect_same(c1.tensor(i), ts[i]);
  }
  // Everything fits: the one file, no index.
  ConvertOptions o;
  o.fsync = false;
  o.max_shard_size = 1 << 20;
  ConvertReport r = convert(in, d.file("whole.safetensors"), o);
  EXPECT_TRUE(r.index.empty());
  EXPECT_TRUE(std::filesystem::exists(d.file("whole.safetensors")));
  // Refused: tensorizer, a sink.
  o.max_shard_size = 100;
  EXPECT_EQ(test::capture_error([&] { convert(in, d.file("x.tensors"), o); }).code(),
            ErrorCode::kInvalidArgument);
}

// Replacing a set: the new index names the new shards under their own names, the old set's
// shards it does not name are gone, and nothing else is left in the folder.
TEST(Shards, ConvertOverAnOldSetLeavesOnlyTheNewSet) {
  TempDir d;
  auto write_set = [&](uint64_t seed, const char* name) {
    std::vector<Tensor> ts;
    for (int i = 0; i < 4; ++i)
      ts.push_back(test::make_tensor("t" + std::to_string(i), DType::kFloat32, {25},
                                     static_cast<uint32_t>(seed + i)));  // 100 B
    SaveOptions so;
    so.fsync = false;
    save_torch(d.file(name), state_dict_value(ts), ts, so);
    return ts;
  };
  std::vector<Tensor> a = write_set(1, "a.pt"), b = write_set(10, "b.pt");
  const std::string out = d.file("set/model.safetensors");
  auto convert_to = [&](const char* in, uint64_t size) {
    ConvertOptions o;
    o.fsync = false;
    o.max_shard_size = size;
    return convert(Checkpoint::open(d.file(in)), out, o);
  };
  ConvertReport ra = convert_to("a.pt", 200);  // 2 shards; the folder "set" is made
  ASSERT_EQ(ra.files.size(), 2u);
  ConvertReport rb = convert_to("b.pt", 200);  // the same names
  ASSERT_EQ(rb.files, ra.files);
  auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(d.file("set")))
      names.insert(e.path().filename().string());
    return names;
  };
  EXPECT_EQ(listing(), (std::set<std::string>{"model-00001-of-00002.safetensors",
                                              "model-00002-of-00002.safetensors",
                                              "model.safetensors.index.json"}));
  Checkpoint back = Checkpoint::open(rb.index);
  for (const auto& t : b) expect_same(back.tensor(t.name()), t);
  // Another count: the old names go.
  ConvertReport ra4 = convert_to("a.pt", 100);
  ASSERT_EQ(ra4.files.size(), 4u);
  EXPECT_EQ(listing().size(), 5u);
  EXPECT_FALSE(std::filesystem::exists(ra.files[0]));
  Checkpoint back4 = Checkpoint::open(ra4.index);
  for (const auto& t : a) expect_same(back4.tensor(t.name()), t);
  // A shard that cannot be put in place: the conversion fails, the old set stays whole, and no
  // new shard is left.
  std::filesystem::create_directories(d.file("set/model-00002-of-00002.safetensors/x"));
  EXPECT_ANY_THROW(convert_to("b.pt", 200));
  EXPECT_FALSE(std::filesystem::exists(d.file("set/model-00001-of-00002.safetensors")));
  Checkpoint still = Checkpoint::open(ra4.index);
  for (const auto& t : a) expect_same(still.tensor(t.name()), t);
  // A conversion that fails before the commit leaves no folder it made.
  ConvertOptions o;
  o.fsync = false;
  o.max_shard_size = 100;
  o.progress = [](uint64_t, uint64_t) { throw std::runtime_error("stop"); };
  o.progress_interval = std::chrono::milliseconds(0);
  EXPECT_ANY_THROW(
      convert(Checkpoint::open(d.file("a.pt")), d.file("new/deeper/m.safetensors"), o));
  EXPECT_FALSE(std::filesystem::exists(d.file("new")));
  // Refused before anything: an output that is one of the input's own files.
  EXPECT_CKPT_ERROR(convert(Checkpoint::open(ra4.index), ra4.files[1], ConvertOptions{}),
                    ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
