// The direct `.metadata` reader (formats/dcp/dcp_metadata_direct.cc) against the generic one:
// on metadata ckpt's DCP writer and torch wrote, it gives exactly the generic reader's result;
// on every one-byte change and truncation of them, on shapes it does not read, and near every
// limit, it gives nothing (the generic reader then runs and names the fault), never a result of
// its own and never an error.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <optional>

#include "ckpt/ckpt.h"
#include "formats/dcp/dcp_metadata.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using internal::DcpMetadata;

Tensor iota_tensor(std::string name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1.0f);
  return Tensor::copy_of(std::move(name), DType::kFloat32, std::move(shape),
                         std::as_bytes(std::span<const float>(v)));
}

// ckpt's DCP writer's .metadata of a nested state: tensors in 3 files (several chunks each), a
// number and a string (bytes items), a list position in a planner path.
std::vector<std::byte> ckpt_written() {
  test::TempDir dir;
  std::vector<Tensor> ts = {iota_tensor("w", {10, 3}), iota_tensor("b", {3})};
  ValuePtr model = Value::ordered_dict();
  model->set("w", Value::tensor(0));
  model->set("b", Value::tensor(1));
  ValuePtr root = Value::dict();
  root->set("model", model);
  root->set("step", Value::integer(7));
  root->set("hist", Value::list({Value::tensor(1), Value::string("x")}));
  DcpSaveOptions o;
  o.files = 3;
  o.fsync = false;
  save_dcp(dir.file("out"), root, ts, o);
  return test::read_file(dir.file("out/.metadata"));
}

std::string fixtures() {
  if (const char* env = std::getenv("CKPT_FIXTURES")) return std::string(env) + "/torch2";
  return "/work/shared/fixtures/torch2";
}

std::optional<DcpMetadata> generic(std::span<const std::byte> b, const Limits& l = {}) {
  try {
    return internal::read_dcp_metadata_generic(b, "dir/.metadata", l);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The direct reader reads `bytes` as the generic one does; each one-byte change and each
// truncation of them is either declined or read as the generic reader reads it.
void check(const std::vector<std::byte>& bytes) {
  const std::optional<DcpMetadata> fast = internal::read_dcp_metadata_direct(bytes, Limits{});
  const std::optional<DcpMetadata> slow = generic(bytes);
  ASSERT_TRUE(fast.has_value());
  ASSERT_TRUE(slow.has_value());
  EXPECT_TRUE(same_metadata(*fast, *slow));
  size_t accepted = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::vector<std::byte> b = bytes;
      b[i] ^= std::byte(flip);
      const std::optional<DcpMetadata> f = internal::read_dcp_metadata_direct(b, Limits{});
      if (!f) continue;
      ++accepted;
      const std::optional<DcpMetadata> g = generic(b);
      ASSERT_TRUE(g.has_value()) << "byte " << i << " ^ " << int(flip)
                                 << ": the generic reader refuses";
      EXPECT_TRUE(same_metadata(*f, *g)) << "byte " << i << " ^ " << int(flip);
    }
  EXPECT_GT(accepted, 0u);  // changed names and numbers are still read
  for (size_t n = 0; n < bytes.size(); n += 7) {
    const std::span<const std::byte> head(bytes.data(), n);
    const std::optional<DcpMetadata> f = internal::read_dcp_metadata_direct(head, Limits{});
    if (f) {
      const std::optional<DcpMetadata> g = generic(head);
      ASSERT_TRUE(g.has_value()) << n << " bytes";
      EXPECT_TRUE(same_metadata(*f, *g)) << n << " bytes";
    }
  }
}

TEST(DcpDirect, AgreesWithTheGenericReaderOnCkptWrittenMetadata) { check(ckpt_written()); }

TEST(DcpDirect, AgreesWithTheGenericReaderOnTorchWrittenMetadata) {
  const std::string path = fixtures() + "/dcp_model/.metadata";
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture at " << path;
  const std::vector<std::byte> bytes = test::read_file(path);
  const std::optional<DcpMetadata> md = internal::read_dcp_metadata_direct(bytes, Limits{});
  ASSERT_TRUE(md.has_value());
  EXPECT_EQ(md->version, "1.0.0");  // torch 2.x's, with its pathlib checkpoint_id read past
  EXPECT_FALSE(md->entries.empty());
  check(bytes);
}

// Hand-written pickles of shapes the direct reader does not read: the generic reader's result.
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
std::string str(const std::string& s) { return "X" + le32(static_cast<uint32_t>(s.size())) + s; }
std::string newobj(const std::string& cls) {
  return "ctorch.distributed.checkpoint.metadata\n" + cls + "\n)\x81";
}
std::string metadata(const std::string& entries, const std::string& extra = {}) {
  return "\x80\x02" + newobj("Metadata") + "}(" + str("state_dict_metadata") + "}(" + entries +
         "u" + str("storage_data") + "}" + extra + "ub.";
}

TEST(DcpDirect, DeclinesShapesItDoesNotRead) {
  const std::string bytes_entry = str("a") + newobj("BytesStorageMetadata");
  // What it reads: the same result as the generic reader.
  auto plain = test::to_bytes(metadata(bytes_entry));
  ASSERT_TRUE(internal::read_dcp_metadata_direct(plain, Limits{}).has_value());
  const std::vector<std::string> declined = {
      // a protocol-0 int, DUP, POP: opcodes it does not read
      metadata(bytes_entry, str("x") + "I1\n"),
      metadata(bytes_entry, str("x") + "N2"),
      metadata(bytes_entry + str("b") + "N0" + newobj("BytesStorageMetadata")),
      // a list fetched from the memo (shared and mutable)
      metadata(bytes_entry, str("x") + "]q\x07h\x07\x86"),
      // Megatron-core's mcore_data
      metadata(bytes_entry, str("mcore_data") + "}"),
      // a bytes entry made with arguments
      metadata(str("a") +
               "ctorch.distributed.checkpoint.metadata\nBytesStorageMetadata\nK\x01\x85R"),
      // a Python 2 str
      metadata(bytes_entry, "U\x01x" + str("y")),
  };
  for (const std::string& p : declined) {
    auto b = test::to_bytes(p);
    EXPECT_FALSE(internal::read_dcp_metadata_direct(b, Limits{}).has_value()) << p;
    // read_dcp_metadata gives the generic reader's result or error.
    std::optional<DcpMetadata> g = generic(b);
    std::string err;
    std::optional<DcpMetadata> r;
    try {
      r = internal::read_dcp_metadata(b, "dir/.metadata", Limits{});
    } catch (const Error& x) {
      err = x.what();
    }
    ASSERT_EQ(r.has_value(), g.has_value()) << err;
    if (r) EXPECT_TRUE(same_metadata(*r, *g));
  }
}

// A storage_data of 20,001 items is read on a second thread beside the entries (named *Thread*
// for make tsan): the same result as the generic reader's.
TEST(DcpDirect, StorageItemsOnASecondThreadAgree) {
  std::string entries, items;
  const std::string none_offset = str("offset") + "N";
  for (int i = 0; i <= 20000; ++i) {
    const std::string k = "k" + std::to_string(i);
    entries += str(k) + newobj("BytesStorageMetadata");
    items += newobj("MetadataIndex") + "}(" + str("fqn") + str(k) + none_offset + "ub" +
             "ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81}(" +
             str("relative_path") + str("__0_0.distcp") + str("offset") + "J" +
             le32(static_cast<uint32_t>(i) * 8) + str("length") + "K\x08ub";
  }
  std::string p = metadata(entries);
  p.insert(p.size() - 3, "(" + items + "u");  // into storage_data's dict
  auto b = test::to_bytes(p);
  const std::optional<DcpMetadata> fast = internal::read_dcp_metadata_direct(b, Limits{});
  const std::optional<DcpMetadata> slow = generic(b);
  ASSERT_TRUE(fast.has_value());
  ASSERT_TRUE(slow.has_value());
  ASSERT_EQ(fast->storage.size(), 20001u);
  EXPECT_EQ(fast->storage[20000].offset, 160000u);
  EXPECT_TRUE(same_metadata(*fast, *slow));
}

// Near each limit the direct reader declines, and read_dcp_metadata's error is the generic
// reader's: typed, naming the file, the record and (for the VM's limits) the offset.
TEST(DcpDirect, EachLimitMeetsTheGenericReadersError) {
  const std::vector<std::byte> bytes = ckpt_written();
  struct Case {
    const char* name;
    std::function<void(Limits&)> set;
  };
  const std::vector<Case> cases = {
      {"max_pickle_depth", [](Limits& l) { l.max_pickle_depth = 6; }},
      {"max_pickle_memo", [](Limits& l) { l.max_pickle_memo = 20; }},
      {"max_pickle_stack", [](Limits& l) { l.max_pickle_stack = 6; }},
      {"object budget",
       [](Limits& l) {
         l.max_object_bytes = 8 << 10;
         l.object_bytes_per_byte = 0;
       }},
      {"max_tensors", [](Limits& l) { l.max_tensors = 2; }},
      {"max_dims", [](Limits& l) { l.max_dims = 1; }},
  };
  for (const Case& c : cases) {
    Limits l;
    c.set(l);
    EXPECT_FALSE(internal::read_dcp_metadata_direct(bytes, l).has_value()) << c.name;
    Error want = test::capture_error(
        [&] { internal::read_dcp_metadata_generic(bytes, "dir/.metadata", l); });
    Error got =
        test::capture_error([&] { internal::read_dcp_metadata(bytes, "dir/.metadata", l); });
    EXPECT_EQ(got.code(), ErrorCode::kLimitExceeded) << c.name << ": " << got.what();
    EXPECT_EQ(std::string(got.what()), std::string(want.what())) << c.name;
    EXPECT_EQ(got.source(), "dir/.metadata") << c.name;
    EXPECT_EQ(got.offset(), want.offset()) << c.name;
  }
  // The size limit is checked before either reader runs.
  Limits small;
  small.max_metadata_bytes = 100;
  Error e =
      test::capture_error([&] { internal::read_dcp_metadata(bytes, "dir/.metadata", small); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_EQ(e.source(), "dir/.metadata");
}

}  // namespace
}  // namespace ckpt
