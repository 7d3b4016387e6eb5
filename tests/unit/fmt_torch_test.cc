// torch.save zip checkpoints: round trips through ckpt's writer and reader, read counts, and one
// test per validation rule of the torch layer. Interop with real torch is in tests/interop.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "ckpt/ckpt.h"
#include "pickle/pickler.h"
#include "test_util.h"
#include "util/crc32.h"
#include "zip/zip_reader.h"
#include "zip/zip_writer.h"

namespace ckpt {
namespace {

using test::TempDir;

std::vector<float> iota(size_t n, float start = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

Tensor float_tensor(const std::string& name, std::vector<int64_t> shape, float start = 0) {
  size_t n = 1;
  for (auto d : shape) n *= d;
  auto v = iota(n, start);
  return Tensor::copy_of(name, DType::kFloat32, std::move(shape),
                         std::as_bytes(std::span<const float>(v)));
}

OpenOptions no_mmap() {
  OpenOptions o;
  o.mmap = false;
  return o;
}

TEST(TorchZip, RoundTripValuesSharingAndViews) {
  TempDir dir;
  std::vector<Tensor> ts;
  ts.push_back(float_tensor("a", {2, 3}));
  // A transposed view of a's storage, with an offset view too.
  TensorInfo tr = ts[0].info();
  tr.name = "a_t";
  tr.shape = {3, 2};
  tr.strides = {1, 3};
  ts.emplace_back(tr, ts[0].storage());
  TensorInfo tail = ts[0].info();
  tail.name = "tail";
  tail.shape = {2};
  tail.strides = {1};
  tail.storage_offset = 4;
  ts.emplace_back(tail, ts[0].storage());
  ts.push_back(float_tensor("b", {}, 7));
  ts.back().info().is_parameter = true;
  ts.back().info().requires_grad = true;
  auto root = Value::dict();
  root->set("a", Value::tensor(0));
  root->set("views", Value::list({Value::tensor(1), Value::tensor(2)}));
  root->set("b", Value::tensor(3));
  root->set("tied", Value::tensor(0));
  root->set(Value::integer(3), Value::tuple({Value::string("x"), Value::real(1.5), Value::none()}));
  std::string path = dir.file("m.pt");
  save_torch(path, root, ts);

  for (bool mmap : {true, false}) {
    OpenOptions o;
    o.mmap = mmap;
    Checkpoint c = Checkpoint::open(path, o);
    EXPECT_EQ(c.format(), Format::kTorchZip);
    ASSERT_EQ(c.tensors().size(), 4u);
    EXPECT_EQ(c.storages().size(), 2u);  // a's storage shared by three views, b's own
    EXPECT_EQ(c.tensors()[0].name, "a");
    EXPECT_EQ(c.tensors()[1].name, "views.0");
    EXPECT_EQ(c.tensors()[2].name, "views.1");
    EXPECT_EQ(c.tensors()[3].name, "b");
    EXPECT_TRUE(c.tensors()[3].is_parameter);
    EXPECT_TRUE(c.tensors()[3].requires_grad);
    EXPECT_EQ(c.tensors()[1].strides, (std::vector<int64_t>{1, 3}));
    EXPECT_EQ(c.tensors()[2].storage_offset, 4);
    Tensor t = c.tensor("views.0");
    Tensor a = c.tensor("a");
    EXPECT_EQ(t.storage().get(), a.storage().get());  // sharing kept
    auto tb = t.contiguous_bytes();
    const float* f = reinterpret_cast<const float*>(tb.data());
    EXPECT_EQ(f[1], 3.0f);  // a_t[0][1] == a[1][0]
    Tensor tl = c.tensor("views.1");
    EXPECT_EQ(reinterpret_cast<const float*>(tl.data())[0], 4.0f);
    auto all = c.load_all();
    EXPECT_EQ(all[0].storage().get(), all[1].storage().get());
    EXPECT_EQ(std::memcmp(all[0].data(), a.data(), 24), 0);
    auto key = c.root()->get(3);
    ASSERT_TRUE(key);
    EXPECT_EQ(key->items()[1]->as_float(), 1.5);
    EXPECT_EQ(c.root()->get("tied")->as_int(), c.root()->get("a")->as_int());
    EXPECT_EQ(c.verify(), c.records().size());
  }
}

TEST(TorchZip, DeterministicAndAligned) {
  TempDir dir;
  std::vector<Tensor> ts = {float_tensor("w", {5, 7}), float_tensor("v", {3})};
  for (uint32_t align : {64u, 4096u}) {
    SaveOptions so;
    so.alignment = align;
    save_torch(dir.file("x.pt"), state_dict_value(ts), ts, so);
    auto first = test::read_file(dir.file("x.pt"));
    save_torch(dir.file("x.pt"), state_dict_value(ts), ts, so);
    EXPECT_EQ(test::read_file(dir.file("x.pt")), first);
    Checkpoint c = Checkpoint::open(dir.file("x.pt"));
    EXPECT_EQ(c.properties().at("alignment"), std::to_string(align));
    for (const auto& s : c.storages()) EXPECT_EQ(s.offset % align, 0u);
  }
}

// Opening reads metadata only: at most 3 reads of the file, whatever the number of records.
TEST(TorchZip, OpenReadsAtMostThreeTimes) {
  TempDir dir;
  for (size_t n : {3u, 256u, 20000u}) {
    std::vector<Tensor> ts;
    for (size_t i = 0; i < n; ++i)
      ts.push_back(float_tensor("layer." + std::to_string(i) + ".w", {4}));
    std::string path = dir.file("n" + std::to_string(n) + ".pt");
    SaveOptions so;
    so.fsync = false;
    save_torch(path, state_dict_value(ts), ts, so);
    auto src = open_file_source(path);
    Checkpoint c = Checkpoint::open(src, no_mmap());
    EXPECT_EQ(c.tensors().size(), n);
    EXPECT_LE(src->stats().reads.load(), 3u) << n << " tensors";
    // Every storage's offset was computed: reading one tensor is one read.
    uint64_t before = src->stats().reads.load();
    Tensor t = c.tensor(n - 1);
    EXPECT_EQ(src->stats().reads.load(), before + 1);
    EXPECT_EQ(reinterpret_cast<const float*>(t.data())[3], 3.0f);
    // The record table (built on first use) and name lookups need no read either.
    const auto& records = c.records();
    ASSERT_GE(records.size(), n + 2);
    EXPECT_EQ(&c.records(), &records);
    for (const StorageInfo& s : c.storages()) {
      auto r = std::find_if(records.begin(), records.end(),
                            [&](const RecordInfo& x) { return x.name == s.record; });
      ASSERT_NE(r, records.end()) << s.record;
      EXPECT_EQ(r->data_offset, s.offset);
      EXPECT_EQ(r->size, s.nbytes);
      EXPECT_EQ(r->crc32, s.crc32);
      if (n > 256) break;
    }
    EXPECT_EQ(c.find("layer." + std::to_string(n - 1) + ".w"), n - 1);
    EXPECT_FALSE(c.find("layer." + std::to_string(n) + ".w"));
    EXPECT_EQ(src->stats().reads.load(), before + 1);
  }
}

TEST(TorchZip, VerifyAndLoadCatchAFlippedByte) {
  TempDir dir;
  std::vector<Tensor> ts = {float_tensor("a", {64}), float_tensor("b", {64})};
  std::string path = dir.file("c.pt");
  save_torch(path, state_dict_value(ts), ts);
  auto bytes = test::read_file(path);
  uint64_t off = Checkpoint::open(path).storages()[1].offset;
  bytes[off + 10] ^= std::byte{1};
  test::write_file(path, bytes);
  Checkpoint c = Checkpoint::open(path);
  auto e = test::capture_error([&] { c.verify(); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "c/data/1");
  LoadOptions lo;
  lo.verify = true;
  auto e2 = test::capture_error([&] { c.load_all(lo); });
  EXPECT_EQ(e2.code(), ErrorCode::kCorrupt);
  EXPECT_NE(std::string(e2.what()).find("b"), std::string::npos);
  Checkpoint c2 = Checkpoint::open(path, no_mmap());
  EXPECT_CKPT_ERROR(c2.tensor("b", lo), ErrorCode::kCorrupt);
  EXPECT_NO_THROW(c2.tensor("a", lo));
  EXPECT_NO_THROW(c2.load_all());  // without verify the bytes load as they are
}

// Builds a torch-like zip from a hand-made pickle and records.
std::vector<std::byte> make_zip(const std::string& pkl,
                                const std::vector<std::pair<std::string, std::string>>& records,
                                bool with_version = true) {
  MemorySink sink;
  internal::ZipWriter z(sink, "archive/", 64);
  z.add("data.pkl", pkl);
  for (auto& [n, d] : records) z.add(n, d);
  if (with_version) z.add("version", std::string_view("3\n"));
  z.finish();
  return sink.take();
}

// A pickle of {'t': _rebuild_tensor_v2(storage(FloatStorage, '0', numel), offset, size, stride)}.
std::string tensor_pickle(int64_t numel, std::vector<int64_t> size, std::vector<int64_t> stride,
                          int64_t offset = 0, const std::string& cls = "FloatStorage",
                          const std::string& fn = "_rebuild_tensor_v2") {
  auto ints = [](const std::vector<int64_t>& v) {
    std::vector<ValuePtr> items;
    for (auto x : v) items.push_back(Value::integer(x));
    return Value::tuple(items);
  };
  auto marker = Value::object("test", "storage");
  auto t = Value::object("torch._utils", fn,
                         {marker, Value::integer(offset), ints(size), ints(stride),
                          Value::boolean(false), Value::ordered_dict()});
  auto root = Value::dict();
  root->set("t", t);
  std::string out;
  internal::PicklerHooks hooks;
  hooks.persistent_id = [&](const Value& v) -> ValuePtr {
    if (v.kind() == Value::Kind::kObject && v.module() == "test")
      return Value::tuple({Value::string("storage"), Value::global("torch", cls),
                           Value::string("0"), Value::string("cpu"), Value::integer(numel)});
    return nullptr;
  };
  internal::pickle(root, out, hooks);
  return out;
}

Error open_error(const std::vector<std::byte>& bytes, const OpenOptions& o = {}) {
  return test::capture_error([&] { Checkpoint::open(memory_source(bytes, "bad.pt"), o); });
}

TEST(TorchZipValidation, ViewLargerThanStorage) {
  auto z = make_zip(tensor_pickle(4, {5}, {1}), {{"data/0", std::string(16, '\0')}});
  auto e = open_error(z);
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "t");
  EXPECT_EQ(e.source(), "bad.pt");
}

TEST(TorchZipValidation, OffsetPastStorage) {
  auto z = make_zip(tensor_pickle(4, {2}, {1}, 3), {{"data/0", std::string(16, '\0')}});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, StrideOverflow) {
  auto z =
      make_zip(tensor_pickle(4, {2, 2}, {INT64_MAX / 2, 1}), {{"data/0", std::string(16, '\0')}});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, NegativeSize) {
  auto z = make_zip(tensor_pickle(4, {-1}, {1}), {{"data/0", std::string(16, '\0')}});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, RecordSizeDisagreesWithStorage) {
  auto z = make_zip(tensor_pickle(4, {4}, {1}), {{"data/0", std::string(12, '\0')}});
  auto e = open_error(z);
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data/0");
}

TEST(TorchZipValidation, MissingStorageRecord) {
  auto z = make_zip(tensor_pickle(4, {4}, {1}), {});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, UnknownStorageClass) {
  auto z =
      make_zip(tensor_pickle(4, {4}, {1}, 0, "EvilStorage"), {{"data/0", std::string(16, '\0')}});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kUnsupported);
}

TEST(TorchZipValidation, DisallowedGlobalIsNamed) {
  auto root = Value::object("os", "system", {Value::string("echo pwned")});
  std::string pkl;
  internal::pickle(root, pkl);
  OpenOptions strict;  // torch's weights_only: refused by name (by default an opaque node)
  strict.strict = true;
  auto e = open_error(make_zip(pkl, {}), strict);
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("os.system"), std::string::npos);
  EXPECT_EQ(e.record(), "archive/data.pkl");
}

TEST(TorchZipValidation, DisallowedRebuildFunction) {
  auto z = make_zip(tensor_pickle(4, {4}, {1}, 0, "FloatStorage", "_rebuild_sparse_tensor"),
                    {{"data/0", std::string(16, '\0')}});
  EXPECT_EQ(open_error(z).code(), ErrorCode::kUnsupported);
}

TEST(TorchZipValidation, VersionOutOfRange) {
  std::string pkl;
  internal::pickle(Value::dict(), pkl);
  auto z = make_zip(pkl, {{"version", "11\n"}}, false);
  EXPECT_EQ(open_error(z).code(), ErrorCode::kUnsupported);
  auto z2 = make_zip(pkl, {{"version", "three"}}, false);
  EXPECT_EQ(open_error(z2).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, BadByteorder) {
  std::string pkl;
  internal::pickle(Value::dict(), pkl);
  EXPECT_EQ(open_error(make_zip(pkl, {{"byteorder", "middle"}})).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, NoDataPkl) {
  MemorySink sink;
  internal::ZipWriter z(sink, "archive/", 64);
  z.add("other", std::string_view("x"));
  z.finish();
  EXPECT_EQ(open_error(sink.take()).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, PersistentIdNotAStorage) {
  std::string pkl;
  internal::PicklerHooks hooks;
  hooks.persistent_id = [](const Value& v) -> ValuePtr {
    if (v.kind() == Value::Kind::kString && v.str() == "x")
      return Value::tuple({Value::string("module")});
    return nullptr;
  };
  internal::pickle(Value::list({Value::string("x")}), pkl, hooks);
  EXPECT_EQ(open_error(make_zip(pkl, {})).code(), ErrorCode::kCorrupt);
}

TEST(TorchZipValidation, MetadataLimit) {
  std::string pkl;
  internal::pickle(Value::list(std::vector<ValuePtr>(1000, Value::integer(1))), pkl);
  OpenOptions o;
  o.limits.max_metadata_bytes = 100;
  auto z = make_zip(pkl, {});
  auto e = test::capture_error([&] { Checkpoint::open(memory_source(z, "big.pt"), o); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
}

TEST(TorchZipValidation, EveryTruncationIsATypedError) {
  TempDir dir;
  std::vector<Tensor> ts = {float_tensor("a", {16}), float_tensor("b", {3})};
  MemorySink sink;
  save_torch(sink, state_dict_value(ts), ts);
  auto full = sink.take();
  for (size_t n = 0; n < full.size(); n += 7) {
    std::vector<std::byte> cut(full.begin(), full.begin() + n);
    try {
      Checkpoint c = Checkpoint::open(memory_source(cut, "cut.pt"));
      c.load_all();
    } catch (const Error&) {
      continue;  // typed error: fine
    }
    // A prefix that still opens must be the whole file (nothing else can have an end record).
    EXPECT_EQ(n, full.size());
  }
}

TEST(TorchZip, BigEndianRecordsAreSwapped) {
  // A file saying byteorder=big with big-endian floats loads as the same values.
  float v[3] = {1.5f, -2.0f, 3.25f};
  std::string be(12, '\0');
  for (int i = 0; i < 3; ++i) {
    uint32_t w;
    std::memcpy(&w, &v[i], 4);
    w = __builtin_bswap32(w);
    std::memcpy(be.data() + 4 * i, &w, 4);
  }
  auto z = make_zip(tensor_pickle(3, {3}, {1}), {{"byteorder", "big"}, {"data/0", be}});
  Checkpoint c = Checkpoint::open(memory_source(z, "be.pt"));
  EXPECT_EQ(c.properties().at("byteorder"), "big");
  for (Tensor t : {c.tensor("t"), c.load_all()[0]}) {
    const float* f = reinterpret_cast<const float*>(t.data());
    EXPECT_EQ(f[0], 1.5f);
    EXPECT_EQ(f[2], 3.25f);
  }
}

TEST(TorchZip, WriterRefusesMixedDtypesOnOneStorage) {
  auto a = float_tensor("a", {4});
  TensorInfo i = a.info();
  i.dtype = DType::kInt32;
  i.name = "a_as_int";
  std::vector<Tensor> ts = {a, Tensor(i, a.storage())};
  MemorySink sink;
  EXPECT_CKPT_ERROR(save_torch(sink, state_dict_value(ts), ts), ErrorCode::kInvalidArgument);
}

TEST(TorchZip, AtomicSaveLeavesOldFileOnFailure) {
  TempDir dir;
  std::string path = dir.file("keep.pt");
  std::vector<Tensor> ts = {float_tensor("a", {4})};
  save_torch(path, state_dict_value(ts), ts);
  auto before = test::read_file(path);
  // A tree that refers to a tensor that was not given fails mid-save.
  EXPECT_CKPT_ERROR(save_torch(path, Value::list({Value::tensor(5)}), ts),
                    ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::read_file(path), before);
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++files;
  EXPECT_EQ(files, 1u);  // no temporary left behind
}

// A checkpoint over 4 GiB: zip64 sizes and offsets, written and read back.
TEST(TorchZip, Over4GiBZip64) {
  TempDir dir;
  const uint64_t big = (4ull << 30) + 4096;  // > 0xFFFFFFFF bytes
  void* p = ::mmap(nullptr, big, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::shared_ptr<void> owner(p, [big](void* q) { ::munmap(q, big); });
  auto* b = static_cast<std::byte*>(p);
  b[0] = std::byte{1};
  b[big - 1] = std::byte{7};
  std::vector<Tensor> ts;
  ts.push_back(Tensor::from_bytes("huge", DType::kUInt8, {static_cast<int64_t>(big)},
                                  std::span<const std::byte>(b, big), owner));
  ts.push_back(float_tensor("after", {3}, 1));  // its header offset is past 4 GiB
  std::string path = dir.file("big.pt");
  SaveOptions so;
  so.fsync = false;
  save_torch(path, state_dict_value(ts), ts, so);
  owner.reset();
  Checkpoint c = Checkpoint::open(path);
  ASSERT_EQ(c.tensors().size(), 2u);
  EXPECT_EQ(c.tensors()[0].nbytes(), big);
  EXPECT_GT(c.storages()[1].offset, 0xFFFFFFFFull);
  Tensor h = c.tensor("huge");
  EXPECT_EQ(h.data()[0], std::byte{1});
  EXPECT_EQ(h.data()[big - 1], std::byte{7});
  Tensor a = c.tensor("after");
  EXPECT_EQ(reinterpret_cast<const float*>(a.data())[2], 3.0f);
  EXPECT_EQ(c.verify(), c.records().size());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ckpt
