// tensorizer: every fixture (written by tensorizer 2.11.1) read bit-exact against manifest.json,
// hash verification, encryption, hostile files, and writer round trips / byte comparisons.

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/sink.h"
#include "ckpt/tensorizer.h"
#include "formats/open.h"
#include "load/plan.h"
#include "test_util.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt {
namespace {

using internal::CheckpointModel;
using internal::open_tensorizer;

std::string fixture_dir() {
  if (const char* env = std::getenv("CKPT_TZR_FIXTURES")) return env;
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../../../shared/fixtures/tensorizer";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::string sha256_hex(std::span<const std::byte> b) {
  unsigned char md[32];
  unsigned int n = 0;
  EVP_Digest(b.data(), b.size(), md, &n, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += {hex[md[i] >> 4], hex[md[i] & 15]};
  return s;
}

std::vector<std::byte> load(const CheckpointModel& d, size_t i, bool verify = false) {
  const StorageInfo& s = d.storages[i];
  std::vector<std::byte> out(s.nbytes);
  if (s.meta) return out;
  if (s.offset == kNoOffset)
    d.decoder->read(i, out, verify);
  else
    d.source->read_into(s.offset, out);
  return out;
}

OpenOptions options_for(const std::string& file) {
  OpenOptions o;
  std::string stem = fixture_dir() + "/" + file.substr(0, file.rfind('.'));
  if (std::filesystem::exists(stem + ".key")) o.decrypt_key = slurp(stem + ".key");
  if (std::filesystem::exists(stem + ".password")) {
    o.decrypt_password = slurp(stem + ".password");
    while (!o.decrypt_password.empty() && o.decrypt_password.back() == '\n')
      o.decrypt_password.pop_back();
  }
  return o;
}

std::shared_ptr<CheckpointModel> open_fixture(const std::string& file, OpenOptions o) {
  return open_tensorizer(open_file_source(fixture_dir() + "/" + file), o);
}

class Fixtures : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(fixture_dir() + "/manifest.json"))
      GTEST_SKIP() << "no fixtures at " << fixture_dir();
    manifest_ = nlohmann::json::parse(slurp(fixture_dir() + "/manifest.json"))["files"];
  }
  nlohmann::json manifest_;
};

TEST_F(Fixtures, EveryFixtureMatchesManifest) {
  ASSERT_GE(manifest_.size(), 7u);
  for (const auto& [file, m] : manifest_.items()) {
    SCOPED_TRACE(file);
    auto d = open_fixture(file, options_for(file));
    EXPECT_EQ(d->format, Format::kTensorizer);
    EXPECT_EQ(d->properties.at("version"), std::to_string(m["data_version"].get<int>()));
    ASSERT_EQ(d->tensors.size(), m["tensors"].size());
    for (const auto& [name, t] : m["tensors"].items()) {
      SCOPED_TRACE(name);
      auto it = std::find_if(d->tensors.begin(), d->tensors.end(),
                             [&](const TensorInfo& i) { return i.name == name; });
      ASSERT_NE(it, d->tensors.end());
      EXPECT_EQ(dtype_name(it->dtype), t["dtype"].get<std::string>());
      EXPECT_EQ(it->shape, t["shape"].get<std::vector<int64_t>>());
      const StorageInfo& s = d->storages[it->storage];
      EXPECT_EQ(s.meta, t.value("meta", false));
      if (s.meta) continue;
      EXPECT_EQ(s.nbytes, t["nbytes"].get<uint64_t>());
      auto bytes = load(*d, it->storage, /*verify=*/true);
      EXPECT_EQ(sha256_hex(bytes), t["sha256"].get<std::string>());
      // Raw storages carry the CRC32 of their bytes alone (derived from the stored one).
      if (s.offset != kNoOffset) {
        ASSERT_TRUE(s.crc32.has_value());
        EXPECT_EQ(*s.crc32, internal::crc32(bytes));
      }
    }
    EXPECT_EQ(d->verify({}), d->tensors.size());
  }
}

TEST_F(Fixtures, TensorTypesAndStructuredNames) {
  auto mod = open_fixture("module.tensors", {});
  std::map<std::string, std::string> types;
  for (auto& t : mod->tensors) types[t.name] = t.type;
  EXPECT_EQ(types["running"], "buffer");
  EXPECT_EQ(types["lin.weight"], "param");
  EXPECT_EQ(types["lin.bias"], "param");

  auto nested = open_fixture("nested.tensors", {});
  ASSERT_TRUE(nested->root->is_dict());
  auto enc = nested->root->get("encoder");
  ASSERT_TRUE(enc && enc->is_dict());
  auto layers = enc->get("layers");
  ASSERT_TRUE(layers && layers->kind() == Value::Kind::kList);
  ASSERT_EQ(layers->items().size(), 2u);
  auto w1 = layers->items()[1]->get("w");
  ASSERT_TRUE(w1 && w1->kind() == Value::Kind::kTensor);
  EXPECT_EQ(nested->tensors[w1->as_int()].name, "encoder.layers.1.w");
  EXPECT_EQ(nested->root->get("head")->kind(), Value::Kind::kTensor);
}

TEST_F(Fixtures, OpensWithOneReadPlusOneHeaderBatch) {
  auto src = open_file_source(fixture_dir() + "/v1_numpy_dtypes.tensors");
  auto d = open_tensorizer(src, {});
  // 1 prologue+index read, then the batched header reads (served in turn by a file source).
  EXPECT_EQ(src->stats().reads.load(), 1 + d->tensors.size());
  auto msrc = open_mmap_source(fixture_dir() + "/v1_numpy_dtypes.tensors");
  open_tensorizer(msrc, {});
  EXPECT_EQ(msrc->stats().reads.load(), 1u);
}

TEST_F(Fixtures, FlippedDataByteFailsVerification) {
  auto bytes = test::read_file(fixture_dir() + "/v1_numpy_dtypes.tensors");
  auto d0 = open_tensorizer(memory_source(bytes), {});
  size_t big = 0;
  while (d0->tensors[big].name != "big") ++big;
  bytes[d0->storages[big].offset + 12345] ^= std::byte{1};
  auto d = open_tensorizer(memory_source(bytes), {});
  auto e = test::capture_error([&] { d->verify({}); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "big");
  EXPECT_NE(internal::crc32(load(*d, big)), *d->storages[big].crc32);
}

TEST_F(Fixtures, FlippedCiphertextIsAuthError) {
  const std::string f = "v3_encrypted_random_key.tensors";
  auto bytes = test::read_file(fixture_dir() + "/" + f);
  auto d0 = open_fixture(f, options_for(f));
  // The data offset of the first tensor from the index (storage offsets are hidden: encrypted).
  auto hdr_off = internal::load_le<uint64_t>(bytes.data() + 73 + 2 + 1 + 1 + 1 + 3 + 1 + 8);
  auto data_off = internal::load_le<uint64_t>(bytes.data() + 73 + 2 + 1 + 1 + 1 + 3 + 1 + 8 + 8);
  ASSERT_LT(hdr_off, data_off);
  bytes[data_off + 3] ^= std::byte{0x40};
  auto d = open_tensorizer(memory_source(bytes), options_for(f));
  EXPECT_EQ(test::capture_error([&] { d->verify({}); }).code(), ErrorCode::kAuth);
  std::vector<std::byte> buf(d->storages[0].nbytes);
  auto e = test::capture_error([&] { d->decoder->read(0, buf, false); });
  EXPECT_EQ(e.code(), ErrorCode::kAuth);
  EXPECT_EQ(e.record(), d->tensors[0].name);
}

TEST_F(Fixtures, WrongKeyOrPasswordIsAuthError) {
  OpenOptions k;
  k.decrypt_key = std::string(64, 'a');
  auto d = open_fixture("v3_encrypted_random_key.tensors", k);
  std::vector<std::byte> buf(d->storages[0].nbytes);
  EXPECT_CKPT_ERROR(d->decoder->read(0, buf, false), ErrorCode::kAuth);
  OpenOptions p;
  p.decrypt_password = "wrong horse";
  auto dp = open_fixture("v3_encrypted_password.tensors", p);
  std::vector<std::byte> buf2(dp->storages[0].nbytes);
  EXPECT_CKPT_ERROR(dp->decoder->read(0, buf2, true), ErrorCode::kAuth);
  auto none = open_fixture("v3_encrypted_password.tensors", {});
  EXPECT_EQ(none->properties.at("encrypted"), "true");
  EXPECT_CKPT_ERROR(none->decoder->read(0, buf2, false), ErrorCode::kAuth);
  OpenOptions bad;
  bad.decrypt_key = "short";
  EXPECT_CKPT_ERROR(open_fixture("v3_encrypted_password.tensors", bad),
                    ErrorCode::kInvalidArgument);
  // The password file's key, given raw, decrypts too (any file decrypts with its raw key).
}

TEST_F(Fixtures, TruncatedFilesGiveTypedErrors) {
  for (const auto& [file, m] : manifest_.items()) {
    auto bytes = test::read_file(fixture_dir() + "/" + file);
    for (size_t cut : {size_t{0}, size_t{3}, size_t{40}, size_t{72}, size_t{1000},
                       size_t{262217 + 20}, bytes.size() - 9}) {
      std::vector<std::byte> b(bytes.begin(), bytes.begin() + std::min(cut, bytes.size()));
      auto e = test::capture_error([&] { open_tensorizer(memory_source(b), options_for(file)); });
      EXPECT_TRUE(e.code() == ErrorCode::kTruncated || e.code() == ErrorCode::kCorrupt)
          << file << " cut at " << cut << ": " << e.what();
    }
  }
}

std::vector<std::byte> v1_bytes() {
  return test::read_file(fixture_dir() + "/v1_numpy_dtypes.tensors");
}

TEST_F(Fixtures, HostilePrologues) {
  auto b = v1_bytes();
  auto version = b;
  internal::store_le<uint32_t>(version.data() + 5, 5);
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(version), {}), ErrorCode::kUnsupported);
  auto magic = b;
  magic[1] = std::byte{'X'};
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(magic), {}), ErrorCode::kCorrupt);
  auto count = b;
  internal::store_le<uint64_t>(count.data() + 57, uint64_t{1} << 40);
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(count), {}), ErrorCode::kLimitExceeded);
  auto count2 = b;
  internal::store_le<uint64_t>(count2.data() + 57, 100000);
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(count2), {}), ErrorCode::kCorrupt);
  auto index = b;
  internal::store_le<uint64_t>(index.data() + 65, uint64_t{1} << 62);
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(index), {}), ErrorCode::kLimitExceeded);
  auto index2 = b;
  internal::store_le<uint64_t>(index2.data() + 65, b.size());
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(index2), {}), ErrorCode::kTruncated);
  // A header field that disagrees with the index.
  auto hdr = b;
  auto h0 = internal::load_le<uint64_t>(b.data() + 73 + 2 + 3 + 1 + 1 + 3 + 1 + 8);
  hdr[h0 + 8 + 2 + 1 + 2] ^= std::byte{1};  // first byte of the name
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(hdr), {}), ErrorCode::kCorrupt);
  OpenOptions dims;
  dims.limits.max_dims = 1;
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(b), dims), ErrorCode::kLimitExceeded);
}

// ---- writer ----

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 167 + seed * 29) & 0xFF);
  return v;
}

// Re-writes a fixture's tensors (read back with our reader) in the same order and compares bytes.
void expect_rewrite_identical(const std::string& file,
                              const std::function<void(size_t, TensorizerEntry&)>& adjust) {
  auto d = open_fixture(file, {});
  std::vector<TensorizerEntry> entries(d->tensors.size());
  for (size_t i = 0; i < d->tensors.size(); ++i) {
    const TensorInfo& ti = d->tensors[i];
    auto t = Tensor::copy_of(ti.name, ti.dtype, ti.shape, load(*d, ti.storage));
    entries[i].tensor = t;
    entries[i].type = ti.type == "param"    ? TensorizerTensorType::kParam
                      : ti.type == "buffer" ? TensorizerTensorType::kBuffer
                                            : TensorizerTensorType::kStateDict;
    entries[i].meta = d->storages[ti.storage].meta;
    adjust(i, entries[i]);
  }
  MemorySink sink;
  save_tensorizer(sink, entries);
  auto want = test::read_file(fixture_dir() + "/" + file);
  ASSERT_EQ(sink.bytes().size(), want.size()) << file;
  size_t diff = 0;
  while (diff < want.size() && sink.bytes()[diff] == want[diff]) ++diff;
  EXPECT_EQ(diff, want.size()) << file << ": first difference at byte " << diff;
}

TEST_F(Fixtures, WriterReproducesUnencryptedFixturesByteForByte) {
  expect_rewrite_identical("v1_numpy_dtypes.tensors", [](size_t, TensorizerEntry&) {});
  expect_rewrite_identical("v2_opaque_dtypes.tensors", [](size_t, TensorizerEntry&) {});
  expect_rewrite_identical("v4_meta.tensors", [](size_t, TensorizerEntry&) {});
  expect_rewrite_identical("module.tensors", [](size_t, TensorizerEntry& e) {
    // write_module labels: root module "" + ".running" (module 0), "lin" is module 1.
    if (e.tensor.name() == "running") {
      e.tensor.info().name = ".running";
    } else {
      e.module_index = 1;
    }
  });
  expect_rewrite_identical("nested.tensors", [](size_t, TensorizerEntry& e) {
    const std::string& n = e.tensor.name();
    if (n.rfind("encoder.layers.", 0) == 0)
      e.path = {std::string("encoder"), std::string("layers"), int64_t{n[15] - '0'},
                std::string("w")};
  });
}

std::vector<TensorizerEntry> writer_entries() {
  std::vector<TensorizerEntry> es;
  int seed = 0;
  for (int k = 0; k < kNumDTypes; ++k) {
    DType dt = static_cast<DType>(k);
    const auto& info = dtype_info(dt);
    if (info.is_quantized || info.bits % 8 || dt == DType::kFloat4_e2m1fn_x2) continue;
    TensorizerEntry e;
    e.tensor = Tensor::copy_of(std::string("t.") + info.name, dt, {3, 2},
                               pattern(6 * info.bits / 8, ++seed));
    es.push_back(std::move(e));
  }
  TensorizerEntry scalar, empty, nested, big;
  scalar.tensor = Tensor::copy_of("scalar", DType::kFloat64, {}, pattern(8, 1));
  empty.tensor = Tensor::copy_of("empty", DType::kInt32, {0, 4}, {});
  nested.tensor = Tensor::copy_of("x", DType::kFloat32, {2}, pattern(8, 2));
  nested.path = {std::string("a"), int64_t{0}, std::string("caf\xc3\xa9")};
  nested.type = TensorizerTensorType::kParam;
  big.tensor = Tensor::copy_of("big", DType::kFloat32, {5, 1024, 1024},
                               pattern(5 << 22, 3));  // 20 MiB: several crypt chunks
  es.push_back(scalar);
  es.push_back(empty);
  es.push_back(nested);
  es.push_back(big);
  return es;
}

void expect_read_back(const std::shared_ptr<CheckpointModel>& d,
                      const std::vector<TensorizerEntry>& es) {
  ASSERT_EQ(d->tensors.size(), es.size());
  for (size_t i = 0; i < es.size(); ++i) {
    SCOPED_TRACE(es[i].tensor.name());
    const TensorInfo& ti = d->tensors[i];
    EXPECT_EQ(ti.dtype, es[i].tensor.dtype());
    EXPECT_EQ(ti.shape, es[i].tensor.shape());
    EXPECT_EQ(d->storages[i].meta, es[i].meta);
    if (es[i].meta) continue;
    EXPECT_EQ(load(*d, i, true), es[i].tensor.contiguous_bytes());
  }
  EXPECT_EQ(d->verify({}), es.size());
}

TEST(TensorizerWriter, RoundTripPlainVersions) {
  auto es = writer_entries();
  MemorySink sink;
  save_tensorizer(sink, es);
  auto d = open_tensorizer(memory_source(sink.bytes()), {});
  EXPECT_EQ(d->properties.at("version"), "2");  // opaque dtypes present
  expect_read_back(d, es);
  EXPECT_EQ(d->tensors[es.size() - 2].name, "a.0.caf\xc3\xa9");
  EXPECT_EQ(d->tensors[es.size() - 2].type, "param");

  std::vector<TensorizerEntry> numpy_only{es.back()};
  MemorySink s1;
  save_tensorizer(s1, numpy_only);
  EXPECT_EQ(open_tensorizer(memory_source(s1.bytes()), {})->properties.at("version"), "1");

  TensorizerEntry meta;
  meta.tensor = Tensor::copy_of("m", DType::kBFloat16, {7, 3}, pattern(42, 4));
  meta.meta = true;
  std::vector<TensorizerEntry> with_meta{es[0], meta};
  MemorySink s4;
  save_tensorizer(s4, with_meta);
  auto d4 = open_tensorizer(memory_source(s4.bytes()), {});
  EXPECT_EQ(d4->properties.at("version"), "4");
  expect_read_back(d4, with_meta);
  EXPECT_EQ(d4->storages[1].nbytes, 42u);
}

TEST(TensorizerWriter, RoundTripEncryptedRandomKeyFile) {
  test::TempDir dir;
  TensorizerSaveOptions o;
  o.encryption = TensorizerEncryption::kRandomKey;
  o.key_file = dir.file("k.key");
  auto es = writer_entries();
  std::string key = save_tensorizer(dir.file("e.tensors"), es, o);
  EXPECT_EQ(key.size(), 32u);
  OpenOptions ro;
  ro.decrypt_key = slurp(o.key_file);
  EXPECT_EQ(ro.decrypt_key.size(), 65u);
  auto d = open_tensorizer(open_file_source(dir.file("e.tensors")), ro);
  EXPECT_EQ(d->properties.at("version"), "3");
  EXPECT_EQ(d->storages[0].offset, kNoOffset);
  expect_read_back(d, es);
  OpenOptions raw;
  raw.decrypt_key = key;
  EXPECT_EQ(open_tensorizer(open_file_source(dir.file("e.tensors")), raw)->verify({}), es.size());
  OpenOptions wrong;
  wrong.decrypt_key = std::string(32, 'x');
  auto dw = open_tensorizer(open_file_source(dir.file("e.tensors")), wrong);
  EXPECT_CKPT_ERROR(dw->verify({}), ErrorCode::kAuth);
}

TEST(TensorizerWriter, RoundTripEncryptedPasswordWithMeta) {
  TensorizerSaveOptions o;
  o.encryption = TensorizerEncryption::kPassword;
  o.password = "hunter2";
  o.pwhash_opslimit = 1;
  o.pwhash_memlimit = 8192;
  auto es = writer_entries();
  es.resize(3);
  TensorizerEntry meta;
  meta.tensor = Tensor::copy_of("m", DType::kFloat32, {2}, pattern(8, 4));
  meta.meta = true;
  es.push_back(meta);
  MemorySink sink;
  save_tensorizer(sink, es, o);
  OpenOptions ro;
  ro.decrypt_password = "hunter2";
  auto d = open_tensorizer(memory_source(sink.bytes()), ro);
  EXPECT_EQ(d->properties.at("version"), "4");
  EXPECT_EQ(d->properties.at("encrypted"), "true");
  expect_read_back(d, es);
  OpenOptions bad;
  bad.decrypt_password = "hunter3";
  EXPECT_CKPT_ERROR(open_tensorizer(memory_source(sink.bytes()), bad)->verify({}),
                    ErrorCode::kAuth);
}

TEST(TensorizerWriter, RefusesBadInput) {
  MemorySink sink;
  TensorizerEntry q;
  q.tensor = Tensor::copy_of("q", DType::kQInt8, {1}, pattern(1, 1));
  EXPECT_CKPT_ERROR(save_tensorizer(sink, {q}), ErrorCode::kUnsupported);
  TensorizerEntry a;
  a.tensor = Tensor::copy_of("a", DType::kFloat32, {1}, pattern(4, 1));
  EXPECT_CKPT_ERROR(save_tensorizer(sink, {a, a}), ErrorCode::kInvalidArgument);
  TensorizerSaveOptions o;
  o.encryption = TensorizerEncryption::kKey;
  o.key = "nope";
  EXPECT_CKPT_ERROR(save_tensorizer(sink, {a}, o), ErrorCode::kInvalidArgument);
  test::TempDir dir;
  TensorizerSaveOptions r;
  r.encryption = TensorizerEncryption::kRandomKey;
  EXPECT_CKPT_ERROR(save_tensorizer(dir.file("x.tensors"), std::vector<Tensor>{a.tensor}, r),
                    ErrorCode::kInvalidArgument);
}

// The key sources convert() takes are the save function's too: a key file made on first use and
// read after, a password file; a source that does not go with the mode is refused.
TEST(TensorizerWriter, KeyAndPasswordFiles) {
  test::TempDir dir;
  auto es = writer_entries();
  TensorizerSaveOptions o;
  o.key_file = dir.file("k.key");  // kNone with a key file: kKeyFile
  const std::string key = save_tensorizer(dir.file("a.tensors"), es, o);
  ASSERT_EQ(key.size(), 32u);
  OpenOptions ro;
  ro.decrypt_key = slurp(o.key_file);
  expect_read_back(open_tensorizer(open_file_source(dir.file("a.tensors")), ro), es);
  o.encryption = TensorizerEncryption::kKeyFile;  // the file exists now: its key is used
  EXPECT_EQ(save_tensorizer(dir.file("b.tensors"), es, o), key);
  expect_read_back(open_tensorizer(open_file_source(dir.file("b.tensors")), ro), es);

  {
    std::ofstream pf(dir.file("pw.txt"));
    pf << "hunter2\r\nignored\n";
  }
  TensorizerSaveOptions p;
  p.password_file = dir.file("pw.txt");
  p.pwhash_opslimit = 1;
  p.pwhash_memlimit = 8192;
  MemorySink sink;
  save_tensorizer(sink, es, p);
  OpenOptions po;
  po.decrypt_password = "hunter2";
  expect_read_back(open_tensorizer(memory_source(sink.bytes()), po), es);

  TensorizerSaveOptions mismatch;
  mismatch.encryption = TensorizerEncryption::kKey;
  mismatch.password = "pw";
  MemorySink s2;
  EXPECT_CKPT_ERROR(save_tensorizer(s2, es, mismatch), ErrorCode::kInvalidArgument);
  TensorizerSaveOptions missing;
  missing.password_file = dir.file("none.txt");
  EXPECT_CKPT_ERROR(save_tensorizer(dir.file("c.tensors"), es, missing), ErrorCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.file("c.tensors")));
}

// A source that says it is remote (preferred_read_size() > 0, no mapping) and records its reads.
class RemoteLike final : public ByteSource {
 public:
  explicit RemoteLike(std::vector<std::byte> b) : bytes_(std::move(b)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  uint64_t preferred_read_size() const override { return 8 << 20; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      reads_.emplace_back(offset, dst.size());
    }
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }
  void read_batch(std::span<const ReadRequest> requests) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++batches_;
    }
    for (const ReadRequest& r : requests) read_into(r.offset, r.dst);
  }
  // Reads that touch [from, to).
  size_t reads_in(uint64_t from, uint64_t to) const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (auto [off, len] : reads_) n += off < to && off + len > from;
    return n;
  }
  size_t batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }

 private:
  std::vector<std::byte> bytes_;
  std::string name_ = "remote";
  mutable std::mutex mu_;
  mutable std::vector<std::pair<uint64_t, uint64_t>> reads_;
  mutable size_t batches_ = 0;
};

std::vector<TensorizerEntry> lazy_entries() {
  std::vector<TensorizerEntry> es;
  for (int i = 0; i < 6; ++i) {
    TensorizerEntry e;
    e.tensor = Tensor::copy_of("w" + std::to_string(i), DType::kFloat32, {256, 1024},
                               pattern(1 << 20, 10 + i));  // 1 MiB each
    es.push_back(std::move(e));
  }
  return es;
}

// The last byte of the first tensor's header (it ends where the first tensor's data starts);
// every other header lies after it.
uint64_t first_header(const CheckpointModel& d) {
  uint64_t first = UINT64_MAX;
  for (const auto& s : d.storages) first = std::min(first, s.offset);
  return first - 1;
}

TEST(TensorizerLazyHeaders, ConcurrentVerifiedReadsShareOneHeaderRead) {
  auto es = lazy_entries();
  MemorySink sink;
  save_tensorizer(sink, es);
  auto src = std::make_shared<RemoteLike>(sink.bytes());
  auto d = open_tensorizer(src, {});
  ASSERT_EQ(d->tensors.size(), es.size());
  EXPECT_TRUE(d->hashes_in_decoder);
  // Names, shapes and offsets from the index; no CRC32 (it is in the headers) and no read at all
  // past the index.
  for (size_t i = 0; i < es.size(); ++i) {
    EXPECT_EQ(d->tensors[i].name, es[i].tensor.name());
    EXPECT_NE(d->storages[i].offset, kNoOffset);
    EXPECT_FALSE(d->storages[i].crc32.has_value());
  }
  EXPECT_EQ(src->reads_in(first_header(*d), src->size()), 0u);
  EXPECT_EQ(src->batches(), 0u);
  EXPECT_FALSE(d->properties.count("key_derivation"));

  // A plain load stays raw; a verified one goes through the decoder.
  LoadOptions plain, verified;
  verified.verify = true;
  EXPECT_EQ(internal::route_of(*d, 0, plain, false), internal::Route::kRead);
  EXPECT_EQ(internal::route_of(*d, 0, verified, false), internal::Route::kDecode);

  // Many threads at once: the headers are read once, in one batch.
  std::vector<std::thread> pool;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t)
    pool.emplace_back([&, t] {
      size_t i = static_cast<size_t>(t) % es.size();
      std::vector<std::byte> out(d->storages[i].nbytes);
      d->decoder->read(i, out, true);
      if (out == es[i].tensor.contiguous_bytes()) ++ok;
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(src->batches(), 1u);
  EXPECT_EQ(d->verify({}), es.size());
  EXPECT_EQ(src->batches(), 1u);

  // The same bytes from memory: eager, with the data CRC32 in every storage.
  auto e = open_tensorizer(memory_source(sink.bytes()), {});
  EXPECT_FALSE(e->hashes_in_decoder);
  for (const auto& s : e->storages) EXPECT_TRUE(s.crc32.has_value());
  EXPECT_EQ(internal::route_of(*e, 0, verified, true), internal::Route::kView);
}

TEST(TensorizerLazyHeaders, ConcurrentReadersAllSeeDamageFoundAtFirstUse) {
  auto es = lazy_entries();
  MemorySink sink;
  save_tensorizer(sink, es);
  std::vector<std::byte> bytes = sink.bytes();
  auto eager = open_tensorizer(memory_source(bytes), {});
  // A flipped data byte of w3: a plain read does not notice, a verified read does.
  {
    std::vector<std::byte> b = bytes;
    b[eager->storages[3].offset + 100] ^= std::byte{1};
    auto d = open_tensorizer(std::make_shared<RemoteLike>(b), {});
    std::vector<std::byte> out(d->storages[3].nbytes);
    d->decoder->read(3, out, false);
    Error err = test::capture_error([&] { d->decoder->read(3, out, true); });
    EXPECT_EQ(err.code(), ErrorCode::kCorrupt);
    EXPECT_EQ(err.record(), "w3");
    EXPECT_CKPT_ERROR(d->verify({}), ErrorCode::kCorrupt);
  }
  // A header that disagrees with the index (w2's dtype string, "<f4" -> "<i4", in its header):
  // a local open fails; a remote open succeeds, and every use of the headers fails, from one read.
  {
    std::vector<std::byte> b = bytes;
    const uint64_t data = eager->storages[2].offset;
    const uint64_t header = eager->storages[1].offset + eager->storages[1].nbytes;
    std::string_view h(reinterpret_cast<const char*>(b.data()) + header, data - header);
    size_t at = h.find("<f4");
    ASSERT_NE(at, std::string_view::npos);
    b[header + at + 1] = std::byte{'i'};
    EXPECT_CKPT_ERROR(open_tensorizer(memory_source(b), {}), ErrorCode::kCorrupt);
    auto src = std::make_shared<RemoteLike>(b);
    auto d = open_tensorizer(src, {});
    std::vector<std::thread> pool;
    std::atomic<int> corrupt{0};
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&] {
        std::vector<std::byte> out(d->storages[0].nbytes);
        Error err = test::capture_error([&] { d->decoder->read(0, out, true); });
        if (err.code() == ErrorCode::kCorrupt && err.record() == "w2") ++corrupt;
      });
    for (auto& th : pool) th.join();
    EXPECT_EQ(corrupt.load(), 4);
    EXPECT_CKPT_ERROR(d->verify({}), ErrorCode::kCorrupt);
    EXPECT_EQ(src->batches(), 1u);
  }
}

TEST(TensorizerLazyHeaders, EncryptedRemoteDecryptsWithKeyOrPassword) {
  auto es = lazy_entries();
  es.resize(3);
  TensorizerSaveOptions o;
  o.encryption = TensorizerEncryption::kPassword;
  o.password = "hunter2";
  o.pwhash_opslimit = 1;
  o.pwhash_memlimit = 8192;
  MemorySink sink;
  save_tensorizer(sink, es, o);
  OpenOptions ro;
  ro.decrypt_password = "hunter2";
  auto src = std::make_shared<RemoteLike>(sink.bytes());
  auto d = open_tensorizer(src, ro);
  EXPECT_EQ(d->properties.at("encrypted"), "true");
  EXPECT_FALSE(d->properties.count("key_derivation"));  // in the headers, not read yet
  EXPECT_EQ(d->storages[0].offset, kNoOffset);
  EXPECT_EQ(src->batches(), 0u);
  expect_read_back(d, es);
  EXPECT_EQ(src->batches(), 1u);
  // Eagerly, the property is there.
  EXPECT_EQ(open_tensorizer(memory_source(sink.bytes()), ro)->properties.at("key_derivation"),
            "argon2");
  // No password: listing works, reading is an auth error.
  auto none = open_tensorizer(std::make_shared<RemoteLike>(sink.bytes()), {});
  std::vector<std::byte> out(none->storages[0].nbytes);
  EXPECT_CKPT_ERROR(none->decoder->read(0, out, false), ErrorCode::kAuth);
  OpenOptions wrong;
  wrong.decrypt_password = "hunter3";
  auto w = open_tensorizer(std::make_shared<RemoteLike>(sink.bytes()), wrong);
  EXPECT_CKPT_ERROR(w->verify({}), ErrorCode::kAuth);
}

}  // namespace
}  // namespace ckpt
