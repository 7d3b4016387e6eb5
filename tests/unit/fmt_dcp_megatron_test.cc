// Megatron-core torch_dist folders (formats/dcp/dcp_folder.h): a DCP folder with metadata.json and
// common.pt beside opens with common.pt's state under `common` and the backends as properties;
// another tool's metadata.json changes nothing; a missing common.pt and a sharded key that
// would hide it are refused. (Folders megatron-core itself saves: tests/interop/test_megatron.py.)

#include <gtest/gtest.h>

#include <string>

#include "ckpt/ckpt.h"
#include "test_util.h"

namespace ckpt {
namespace {

void write_text(const std::string& path, const std::string& s) {
  test::write_file(path, std::as_bytes(std::span<const char>(s.data(), s.size())));
}

constexpr const char* kConfig =
    R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, )"
    R"("common_backend": "torch", "common_backend_version": 1})";

// A DCP folder of `sharded` (a flat dict of tensors by key) with Megatron's two files beside:
// common.pt holding {"step": 12, "scale": tensor}.
std::string megatron_folder(const test::TempDir& dir, const std::string& sharded_key = "w") {
  const std::string d = dir.file("ckpt");
  std::vector<Tensor> t = {test::make_tensor(sharded_key, DType::kFloat32, {4, 3}, 1)};
  DcpSaveOptions o;
  o.files = 2;
  o.fsync = false;
  save_dcp(d, nullptr, t, o);
  std::vector<Tensor> c = {test::make_tensor("scale", DType::kBFloat16, {2}, 2)};
  ValuePtr common = Value::dict();
  common->set("step", Value::integer(12));
  common->set("scale", Value::tensor(0));
  save_torch(d + "/common.pt", common, c);
  write_text(d + "/metadata.json", kConfig);
  return d;
}

TEST(DcpMegatron, CommonPtJoinsUnderCommonWithTheBackends) {
  test::TempDir dir;
  Checkpoint c = Checkpoint::open(megatron_folder(dir));
  EXPECT_EQ(c.format(), Format::kTorchDcp);
  ASSERT_TRUE(c.find("w"));
  ASSERT_TRUE(c.find("common.scale"));
  EXPECT_EQ(c.tensor("common.scale").info().dtype, DType::kBFloat16);
  auto want = test::pattern(4, 2);
  auto got = c.tensor("common.scale").contiguous_bytes();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  ValuePtr common = c.root()->get("common");
  ASSERT_TRUE(common && common->is_dict());
  ASSERT_TRUE(common->get("step"));
  EXPECT_EQ(common->get("step")->as_int(), 12);
  EXPECT_EQ(c.properties().at("megatron_sharded_backend"), "torch_dist 1");
  EXPECT_EQ(c.properties().at("megatron_common_backend"), "torch 1");
}

TEST(DcpMegatron, AnotherToolsMetadataJsonChangesNothing) {
  for (const char* text :
       {R"({"producer": "x"})", "[1, 2]", "not json", R"({"sharded_backend": 3})"}) {
    test::TempDir dir;
    const std::string d = megatron_folder(dir);
    write_text(d + "/metadata.json", text);
    Checkpoint c = Checkpoint::open(d);
    EXPECT_TRUE(c.find("w")) << text;
    EXPECT_FALSE(c.find("common.scale")) << text;
    EXPECT_FALSE(c.root()->get("common")) << text;
    EXPECT_EQ(c.properties().count("megatron_sharded_backend"), 0u) << text;
  }
}

TEST(DcpMegatron, MissingCommonPtIsRefusedNamingIt) {
  test::TempDir dir;
  const std::string d = megatron_folder(dir);
  std::remove((d + "/common.pt").c_str());
  try {
    Checkpoint::open(d);
    ADD_FAILURE() << "opened without common.pt";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("common.pt"), std::string::npos) << e.what();
  }
}

TEST(DcpMegatron, ASharedKeyNamedCommonIsRefused) {
  test::TempDir dir;
  EXPECT_CKPT_ERROR(Checkpoint::open(megatron_folder(dir, "common")), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace ckpt
