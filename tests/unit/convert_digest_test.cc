// include/ckpt/digest.h: SHA-256 of tensors' logical bytes across formats and layouts, file
// digests, manifests, digests stored in safetensors by convert, and verify naming tensors.
// The same against files written by torch: tests/interop/test_cli_digest.py.

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <filesystem>

#include "ckpt/ckpt.h"
#include "ckpt/digest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using test::TempDir;

using test::make_tensor;
using test::pattern;

std::vector<Tensor> sample_tensors() {
  return {make_tensor("model.embed.weight", DType::kFloat32, {64, 48}, 1),
          make_tensor("model.layers.0.bias", DType::kBFloat16, {48}, 2),
          make_tensor("model.layers.0.steps", DType::kInt64, {}, 3),
          make_tensor("model.layers.0.mask", DType::kBool, {7}, 4),
          make_tensor("model.empty", DType::kFloat16, {0, 3}, 5),
          make_tensor("model.big", DType::kFloat32, {3, 1 << 18}, 6)};
}

std::string hex_of(std::string_view s) {
  return to_hex(
      sha256(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size())));
}

std::map<std::string, std::string> by_name(const std::vector<TensorDigest>& ds) {
  std::map<std::string, std::string> m;
  for (const auto& d : ds) m[d.name] = d.sha256 ? to_hex(*d.sha256) : "meta";
  return m;
}

TEST(Digest, Sha256KnownVectorsAndHex) {
  EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 d = sha256({});
  EXPECT_EQ(sha256_from_hex(to_hex(d)), d);
  std::string upper = to_hex(d);
  for (auto& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(sha256_from_hex(upper), d);
  EXPECT_FALSE(sha256_from_hex("abc"));
  EXPECT_FALSE(sha256_from_hex(std::string(63, '0') + "g"));
}

TEST(Digest, StridedTensorsHashTheirRowMajorElements) {
  // A 3x4 float32 storage; its transpose (4x3, strides 1,4), a column slice and an expanded row.
  Tensor base = make_tensor("m", DType::kFloat32, {3, 4}, 9);
  auto view = [&](std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t off) {
    TensorInfo i = base.info();
    i.shape = std::move(shape);
    i.strides = std::move(strides);
    i.storage_offset = off;
    return Tensor(i, base.storage());
  };
  for (const Tensor& t : {view({4, 3}, {1, 4}, 0), view({3, 2}, {4, 1}, 1), view({5, 4}, {0, 1}, 4),
                          view({2, 1, 2}, {4, 7, 2}, 1)}) {
    ASSERT_FALSE(t.info().is_contiguous());
    EXPECT_EQ(tensor_sha256(t), sha256(t.contiguous_bytes()));
  }
  EXPECT_EQ(tensor_sha256(base), sha256(base.bytes()));
  // A large transposed tensor: many one-element blocks through the gather buffer.
  Tensor big = make_tensor("b", DType::kFloat16, {300, 500}, 3);
  TensorInfo ti = big.info();
  ti.shape = {500, 300};
  ti.strides = {1, 500};
  Tensor tr(ti, big.storage());
  EXPECT_EQ(tensor_sha256(tr), sha256(tr.contiguous_bytes()));
}

TEST(Digest, SameDigestsInEveryFormat) {
  TempDir dir;
  auto ts = sample_tensors();
  SaveOptions po;
  po.fsync = false;
  save_torch(dir.file("a.pt"), state_dict_value(ts), ts, po);
  SafetensorsSaveOptions so;
  so.fsync = false;
  save_safetensors(dir.file("a.safetensors"), ts, {}, so);
  TensorizerSaveOptions zo;
  zo.fsync = false;
  save_tensorizer(dir.file("a.tensors"), ts, zo);

  std::map<std::string, std::string> want;
  for (const auto& t : ts) want[t.name()] = to_hex(sha256(t.bytes()));
  for (const char* f : {"a.pt", "a.safetensors", "a.tensors"}) {
    for (bool mmap : {true, false}) {
      OpenOptions oo;
      oo.mmap = mmap;
      Checkpoint c = Checkpoint::open(dir.file(f), oo);
      for (int threads : {1, 3}) {
        DigestOptions d;
        d.threads = threads;
        auto got = tensor_digests(c, d);
        EXPECT_EQ(by_name(got), want) << f;
        for (const auto& g : got) {
          auto i = c.find(g.name);
          ASSERT_TRUE(i) << g.name;
          EXPECT_EQ(g.dtype, c.tensors()[*i].dtype);
          EXPECT_EQ(g.shape, c.tensors()[*i].shape);
        }
      }
    }
  }
  // A manifest of one verifies the others.
  auto a = tensor_digests(Checkpoint::open(dir.file("a.pt")));
  EXPECT_TRUE(compare_digests(a, tensor_digests(Checkpoint::open(dir.file("a.tensors")))).empty());
}

TEST(Digest, TiedNamesAndMetaTensors) {
  TempDir dir;
  Tensor w = make_tensor("enc.weight", DType::kFloat32, {4, 4}, 1);
  Tensor tied = w;
  tied.info().name = "dec.weight";
  std::vector<Tensor> ts = {w, tied};
  SaveOptions po;
  po.fsync = false;
  save_torch(dir.file("t.pt"), state_dict_value(ts), ts, po);
  auto d = by_name(tensor_digests(Checkpoint::open(dir.file("t.pt"))));
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d["enc.weight"], to_hex(sha256(w.bytes())));
  EXPECT_EQ(d["dec.weight"], d["enc.weight"]);

  std::vector<TensorizerEntry> es(2);
  es[0].tensor = make_tensor("real", DType::kInt32, {5}, 2);
  es[1].tensor = make_tensor("ghost", DType::kFloat32, {2, 3}, 3);
  es[1].meta = true;
  TensorizerSaveOptions zo;
  zo.fsync = false;
  save_tensorizer(dir.file("m.tensors"), es, zo);
  auto md = tensor_digests(Checkpoint::open(dir.file("m.tensors")));
  ASSERT_EQ(md.size(), 2u);
  for (const auto& x : md) {
    EXPECT_EQ(x.meta, x.name == "ghost");
    EXPECT_EQ(x.sha256.has_value(), x.name != "ghost");
  }
  // Manifests carry meta entries through.
  DigestManifest m;
  m.tensors = md;
  auto back = manifest_from_json(manifest_to_json(m));
  EXPECT_TRUE(compare_digests(back.tensors, md).empty());
}

TEST(Digest, FileDigestIsTheFilesSha256) {
  TempDir dir;
  auto bytes = pattern((9 << 20) + 13, 4);  // several 4 MiB pieces
  test::write_file(dir.file("blob.bin"), bytes);
  FileDigest f = file_digest(dir.file("blob.bin"));
  EXPECT_EQ(f.name, "blob.bin");
  EXPECT_EQ(f.size, bytes.size());
  EXPECT_EQ(f.sha256, sha256(bytes));
  EXPECT_EQ(file_digest(*open_mmap_source(dir.file("blob.bin"))).sha256, sha256(bytes));
  EXPECT_CKPT_ERROR(file_digest(dir.file("missing")), ErrorCode::kNotFound);
}

TEST(Digest, ManifestRoundTripAndMismatches) {
  auto ts = sample_tensors();
  DigestManifest m;
  m.file = FileDigest{"x \"y\".pt", 1234, sha256({})};
  for (const auto& t : ts) {
    TensorDigest d;
    d.name = t.name();
    d.dtype = t.dtype();
    d.shape = t.shape();
    d.sha256 = tensor_sha256(t);
    m.tensors.push_back(d);
  }
  m.tensors[0].quantization = QuantizationDigest{"per_tensor_affine", 0.125, 3, 0, {}, {}};
  std::string json = manifest_to_json(m);
  DigestManifest back = manifest_from_json(json);
  ASSERT_TRUE(back.file);
  EXPECT_EQ(back.file->name, m.file->name);
  EXPECT_EQ(back.file->size, 1234u);
  EXPECT_EQ(back.file->sha256, m.file->sha256);
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) EXPECT_EQ(back.tensors[i].name, m.tensors[i].name);
  EXPECT_TRUE(compare_digests(back.tensors, m.tensors).empty());

  auto actual = m.tensors;
  actual[1].sha256->at(0) ^= 1;      // digest
  actual[2].dtype = DType::kInt32;   // dtype
  actual[3].shape = {8};             // shape
  actual.erase(actual.begin() + 4);  // missing from the file
  actual.push_back(actual[0]);
  actual.back().name = "extra";  // not in the manifest
  auto bad = compare_digests(m.tensors, actual);
  ASSERT_EQ(bad.size(), 5u);
  EXPECT_EQ(bad[0].tensor, "model.layers.0.bias");
  EXPECT_NE(bad[0].problem.find("SHA-256"), std::string::npos);
  EXPECT_EQ(bad[1].tensor, "model.layers.0.steps");
  EXPECT_NE(bad[1].problem.find("dtype int32, expected int64"), std::string::npos);
  EXPECT_EQ(bad[2].tensor, "model.layers.0.mask");
  EXPECT_NE(bad[2].problem.find("shape [8], expected [7]"), std::string::npos);
  EXPECT_EQ(bad[3].tensor, "model.empty");
  EXPECT_EQ(bad[3].problem, "not in the file");
  EXPECT_EQ(bad[4].tensor, "extra");
  EXPECT_EQ(bad[4].problem, "not in the manifest");

  for (
      const char* text :
      {"", "[]", "{}", R"({"ckpt_digest": 2, "tensors": {}})",
       R"({"ckpt_digest": 1, "algorithm": "md5", "tensors": {}})", R"({"ckpt_digest": 1})",
       R"({"ckpt_digest": 1, "tensors": {"a": {"dtype": "float32"}}})",
       R"({"ckpt_digest": 1, "tensors": {"a": {"dtype": "nope", "shape": [], "sha256": ""}}})",
       R"({"ckpt_digest": 1, "tensors": {"a": {"dtype": "float32", "shape": [1]}}})",
       R"({"ckpt_digest": 1, "tensors": {"a": {"dtype": "float32", "shape": [1], "sha256": "00"}}})",
       R"({"ckpt_digest": 1, "tensors": {"a": {"dtype": "float32", "shape": ["1"], "sha256": "00"}}})"}) {
    SCOPED_TRACE(text);
    EXPECT_CKPT_ERROR(manifest_from_json(text, "m.json"), ErrorCode::kInvalidArgument);
  }
  TempDir dir;
  EXPECT_CKPT_ERROR(read_manifest(dir.file("none.json")), ErrorCode::kNotFound);
}

// A byte inside tensor `name`'s data in a file, flipped.
void flip_byte_of(const std::string& path, const std::string& name, uint64_t at = 0) {
  uint64_t off;
  {
    Checkpoint c = Checkpoint::open(path);
    const TensorInfo& t = c.tensors()[*c.find(name)];
    off = c.storages()[t.storage].offset + t.byte_offset() + at;
  }
  auto bytes = test::read_file(path);
  bytes.at(off) ^= std::byte{0x5a};
  test::write_file(path, bytes);
}

TEST(Digest, ConvertStoresDigestsInSafetensorsMetadata) {
  TempDir dir;
  auto ts = sample_tensors();
  SaveOptions po;
  po.fsync = false;
  save_torch(dir.file("a.pt"), state_dict_value(ts), ts, po);
  Checkpoint src = Checkpoint::open(dir.file("a.pt"));
  EXPECT_FALSE(stored_digests(src));

  ConvertOptions co;
  co.fsync = false;
  co.target = SafetensorsTarget{.store_digests = true};
  ConvertReport r = convert(src, dir.file("b.safetensors"), co);
  EXPECT_EQ(r.digests_stored, ts.size());
  {
    Checkpoint b = Checkpoint::open(dir.file("b.safetensors"));
    auto it = b.properties().find(std::string("metadata.") + kSafetensorsDigestKey);
    ASSERT_NE(it, b.properties().end());
    EXPECT_EQ(b.properties().at("metadata.format"), "pt");
    auto stored = stored_digests(b);
    ASSERT_TRUE(stored);
    EXPECT_EQ(by_name(*stored), by_name(tensor_digests(src)));
    EXPECT_TRUE(compare_digests(*stored, tensor_digests(b)).empty());
  }
  flip_byte_of(dir.file("b.safetensors"), "model.big", 4096);
  {
    Checkpoint b = Checkpoint::open(dir.file("b.safetensors"));
    auto bad = compare_digests(*stored_digests(b), tensor_digests(b));
    ASSERT_EQ(bad.size(), 1u);
    EXPECT_EQ(bad[0].tensor, "model.big");
  }
  // Other targets have no place for them: only SafetensorsTarget has store_digests (the CLI
  // refuses `--digests` for them: tests/interop/test_cli_digest.py).
}

TEST(Digest, ConvertWithCopySharedStoresADigestPerName) {
  TempDir dir;
  Tensor w = make_tensor("enc.weight", DType::kFloat32, {4, 4}, 1);
  Tensor tied = w;
  tied.info().name = "dec.weight";
  std::vector<Tensor> ts = {w, tied};
  SaveOptions po;
  po.fsync = false;
  save_torch(dir.file("t.pt"), state_dict_value(ts), ts, po);
  ConvertOptions co;
  co.fsync = false;
  co.target = SafetensorsTarget{.copy_shared = true, .store_digests = true};
  convert(Checkpoint::open(dir.file("t.pt")), dir.file("t.safetensors"), co);
  Checkpoint b = Checkpoint::open(dir.file("t.safetensors"));
  auto stored = by_name(*stored_digests(b));
  EXPECT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored["dec.weight"], to_hex(sha256(w.bytes())));
  EXPECT_EQ(stored["enc.weight"], to_hex(sha256(w.bytes())));
}

TEST(Digest, StoredDigestsThatAreNotAnObjectAreCorrupt) {
  TempDir dir;
  SafetensorsSaveOptions so;
  so.fsync = false;
  save_safetensors(dir.file("x.safetensors"), sample_tensors(), {{kSafetensorsDigestKey, "[1]"}},
                   so);
  EXPECT_CKPT_ERROR(stored_digests(Checkpoint::open(dir.file("x.safetensors"))),
                    ErrorCode::kCorrupt);
  save_safetensors(dir.file("y.safetensors"), sample_tensors(),
                   {{kSafetensorsDigestKey, R"({"model.big": "xyz"})"}}, so);
  EXPECT_CKPT_ERROR(stored_digests(Checkpoint::open(dir.file("y.safetensors"))),
                    ErrorCode::kCorrupt);
}

TEST(Digest, VerifyCrcMismatchNamesTheTensorsOfTheRecord) {
  TempDir dir;
  auto ts = sample_tensors();
  SaveOptions po;
  po.fsync = false;
  save_torch(dir.file("a.pt"), state_dict_value(ts), ts, po);
  flip_byte_of(dir.file("a.pt"), "model.embed.weight", 10);
  Error e = test::capture_error([&] { Checkpoint::open(dir.file("a.pt")).verify(); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("CRC32 mismatch"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("(tensors: model.embed.weight)"), std::string::npos)
      << e.what();
  // And the digests say which tensor changed.
  auto good = sample_tensors();
  std::vector<TensorDigest> want;
  for (const auto& t : good)
    want.push_back({t.name(), t.dtype(), t.shape(), false, tensor_sha256(t), {}});
  auto bad = compare_digests(want, tensor_digests(Checkpoint::open(dir.file("a.pt"))));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].tensor, "model.embed.weight");
}

}  // namespace
}  // namespace ckpt
