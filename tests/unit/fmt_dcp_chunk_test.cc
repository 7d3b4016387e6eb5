// A DCP chunk's item read directly (formats/dcp/dcp_chunk.h) against open_model: on real items
// (ckpt's DCP writer, torch's in the workplace fixture) and on every one-byte change of them,
// read_chunk_item either declines (open_model then reads the item) or gives exactly the facts
// open_model gives; it never accepts an item open_model refuses.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ckpt/ckpt.h"
#include "formats/dcp/dcp_chunk.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/open.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using internal::DcpChunkFacts;

std::vector<std::byte> item_of(DType dtype, std::vector<int64_t> shape, size_t nbytes) {
  std::vector<std::byte> data(nbytes);
  for (size_t i = 0; i < nbytes; ++i) data[i] = std::byte(i * 7 + 1);
  std::vector<Tensor> ts = {Tensor::copy_of("t", dtype, shape, data)};
  MemorySink sink;
  SaveOptions so;
  so.archive_name = "archive";  // as the DCP writer saves an item
  save_torch(sink, Value::tensor(0), ts, so);
  return sink.take();
}

// open_model's facts, or nullopt when it refuses the item.
std::optional<DcpChunkFacts> by_open_model(const std::vector<std::byte>& bytes,
                                           const OpenOptions& o) {
  try {
    auto m = internal::open_model(memory_source(bytes, "item"), o);
    return internal::chunk_facts(*m);
  } catch (const Error&) {
    return std::nullopt;
  }
}

bool same(const DcpChunkFacts& a, const DcpChunkFacts& b) {
  return a.one_tensor == b.one_tensor && a.dtype == b.dtype && a.shape == b.shape &&
         a.raw == b.raw && a.offset == b.offset && a.nbytes == b.nbytes;
}

// `bytes` is read directly, with open_model's facts; each one-byte change of it is either
// declined or read as open_model reads it.
void check_item(const std::vector<std::byte>& bytes, const OpenOptions& o = {}) {
  std::optional<DcpChunkFacts> fast = internal::read_chunk_item(memory_source(bytes, "item"), o);
  std::optional<DcpChunkFacts> slow = by_open_model(bytes, o);
  ASSERT_TRUE(fast.has_value());
  ASSERT_TRUE(slow.has_value());
  EXPECT_TRUE(same(*fast, *slow));
  size_t accepted = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t change : {0x01, 0x80, 0xff}) {
      std::vector<std::byte> b = bytes;
      b[i] ^= std::byte(change);
      fast = internal::read_chunk_item(memory_source(b, "item"), o);
      if (!fast) continue;
      ++accepted;
      slow = by_open_model(b, o);
      ASSERT_TRUE(slow.has_value())
          << "byte " << i << " ^ " << int(change) << ": read directly, refused by open_model";
      EXPECT_TRUE(same(*fast, *slow)) << "byte " << i << " ^ " << int(change);
    }
  }
  std::printf("%zu bytes: %zu of %zu changes read directly\n", bytes.size(), accepted,
              3 * bytes.size());
}

TEST(DcpChunkItem, AgreesWithOpenModelOnEveryByteChange) {
  check_item(item_of(DType::kFloat32, {4}, 16));
  check_item(item_of(DType::kFloat32, {}, 4));
  check_item(item_of(DType::kInt64, {2, 3}, 48));
  check_item(item_of(DType::kBFloat16, {3, 1, 2, 2}, 24));
}

TEST(DcpChunkItem, DeclinesWhatTheLimitsOrStrictModeRefuse) {
  const std::vector<std::byte> item = item_of(DType::kFloat32, {2, 2}, 16);
  OpenOptions o;
  o.limits.max_dims = 1;
  EXPECT_FALSE(internal::read_chunk_item(memory_source(item, "item"), o));
  EXPECT_FALSE(by_open_model(item, o));
  o = {};
  o.limits.max_tensors = 0;
  EXPECT_FALSE(internal::read_chunk_item(memory_source(item, "item"), o));
  o = {};
  o.limits.max_records = 2;
  EXPECT_FALSE(internal::read_chunk_item(memory_source(item, "item"), o));
  EXPECT_FALSE(by_open_model(item, o));
  o = {};
  o.strict = true;  // open_model reads it under its strict allow-list
  EXPECT_FALSE(internal::read_chunk_item(memory_source(item, "item"), o));
}

std::string fixtures() {
  if (const char* env = std::getenv("CKPT_FIXTURES")) return std::string(env) + "/torch2";
  std::string here = __FILE__;
  std::string beside = here.substr(0, here.rfind('/')) + "/../../../shared/fixtures/torch2";
  if (fs::exists(beside + "/dcp_model")) return beside;
  return "/work/shared/fixtures/torch2";
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

TEST(DcpChunkItem, TorchWrittenItemsAreReadDirectly) {
  const std::string dir = fixtures() + "/dcp_model";
  if (!fs::exists(dir + "/.metadata")) GTEST_SKIP() << "no fixture at " << dir;
  const std::vector<std::byte> meta = file_bytes(dir + "/.metadata");
  const internal::DcpMetadata md = internal::read_dcp_metadata(meta, ".metadata", Limits{});
  size_t tensors = 0, checked = 0;
  for (const internal::DcpEntry& e : md.entries) tensors += !e.is_bytes;
  for (const internal::DcpStorage& s : md.storage) {
    const auto e = std::find_if(md.entries.begin(), md.entries.end(),
                                [&](const internal::DcpEntry& x) { return x.fqn == s.fqn; });
    if (e == md.entries.end() || e->is_bytes) continue;
    const std::vector<std::byte> file = file_bytes(dir + "/" + s.relative_path);
    ASSERT_LE(s.offset + s.length, file.size());
    const std::vector<std::byte> item(file.begin() + s.offset, file.begin() + s.offset + s.length);
    if (checked++ == 0) {
      check_item(item);
    } else {
      auto fast = internal::read_chunk_item(memory_source(item, "item"), OpenOptions{});
      auto slow = by_open_model(item, OpenOptions{});
      ASSERT_TRUE(fast && slow) << s.fqn;
      EXPECT_TRUE(same(*fast, *slow)) << s.fqn;
    }
  }
  EXPECT_GT(checked, 0u);
  EXPECT_GE(checked, tensors);
}

}  // namespace
}  // namespace ckpt
