// torch.distributed.checkpoint folders opened as one checkpoint: the workplace fixture dcp_model
// (torch 2.11, one process) equals torch's dcp_to_torch_save of it, read by ckpt; damaged copies
// are refused naming the data file and the tensor.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ckpt/ckpt.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string fixtures() {
  if (const char* env = std::getenv("CKPT_FIXTURES")) return std::string(env) + "/torch2";
  std::string here = __FILE__;
  std::string beside = here.substr(0, here.rfind('/')) + "/../../../shared/fixtures/torch2";
  if (fs::exists(beside + "/dcp_model")) return beside;
  return "/work/shared/fixtures/torch2";
}

class DcpFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fixtures() + "/dcp_model";
    if (!fs::exists(dir_ + "/.metadata")) GTEST_SKIP() << "no fixture at " << dir_;
  }
  // A writable copy of the fixture folder.
  std::string copy() {
    std::string d = ::testing::TempDir() + "dcp_copy_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(d);
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(dir_)) {
      fs::copy_file(e.path(), d + "/" + e.path().filename().string());
      fs::permissions(d + "/" + e.path().filename().string(), fs::perms::owner_all);
    }
    return d;
  }
  std::string dir_;
};

TEST_F(DcpFixture, EqualsDcpToTorchSave) {
  Checkpoint dcp = Checkpoint::open(dir_);
  Checkpoint ref = Checkpoint::open(fixtures() + "/dcp_model_as_torch_save.pt");
  EXPECT_EQ(dcp.format(), Format::kTorchDcp);
  EXPECT_EQ(std::string(format_name(dcp.format())), "torch-dcp");
  ASSERT_EQ(dcp.tensors().size(), ref.tensors().size());
  for (const TensorInfo& t : ref.tensors()) {
    auto i = dcp.find(t.name);
    ASSERT_TRUE(i) << t.name;
    Tensor a = dcp.tensor(*i), b = ref.tensor(t.name);
    EXPECT_EQ(a.info().dtype, b.info().dtype) << t.name;
    EXPECT_EQ(a.info().shape, b.info().shape) << t.name;
    auto ab = a.contiguous_bytes(), bb = b.contiguous_bytes();
    EXPECT_TRUE(std::equal(ab.begin(), ab.end(), bb.begin(), bb.end())) << t.name;
  }
  // The nested tree dcp_to_torch_save rebuilds from planner_data.
  ASSERT_TRUE(dcp.root()->is_dict());
  ASSERT_TRUE(dcp.root()->get("model"));
  EXPECT_TRUE(dcp.root()->get("model")->get("0.weight"));
  ASSERT_TRUE(dcp.root()->get("extra"));
  EXPECT_TRUE(dcp.root()->get("extra")->get("step"));
  EXPECT_EQ(dcp.files().size(), 1u);
  EXPECT_EQ(fs::path(dcp.files()[0]).filename(), "__0_0.distcp");
  // Every load path gives the same bytes.
  std::vector<Tensor> all = dcp.load_all();
  ASSERT_EQ(all.size(), dcp.tensors().size());
  size_t streamed = 0;
  dcp.stream(1 << 20, [&](const Tensor& t) {
    auto want = ref.tensor(t.name()).contiguous_bytes();
    auto got = t.contiguous_bytes();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << t.name();
    ++streamed;
  });
  EXPECT_EQ(streamed, all.size());
  EXPECT_EQ(dcp.verify(), 0u);  // DCP stores no checksums
}

// The fixture's .metadata, with `from` replaced by `to` once (a byte patch of the pickle).
void patch(const std::string& path, const std::string& from, const std::string& to) {
  std::vector<std::byte> b = test::read_file(path);
  std::string s = test::to_string(b);
  auto at = s.find(from);
  ASSERT_NE(at, std::string::npos);
  s.replace(at, from.size(), to);
  test::write_file(path, test::to_bytes(s));
}

TEST_F(DcpFixture, MissingDataFileIsNamed) {
  std::string d = copy();
  fs::remove(d + "/__0_0.distcp");
  Error e = test::capture_error([&] { Checkpoint::open(d); });
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_NE(std::string(e.what()).find("__0_0.distcp"), std::string::npos) << e.what();
}

TEST_F(DcpFixture, ItemPastTheEndIsNamed) {
  std::string d = copy();
  fs::resize_file(d + "/__0_0.distcp", 3000);
  Error e = test::capture_error([&] { Checkpoint::open(d); });
  EXPECT_EQ(e.code(), ErrorCode::kTruncated);
  EXPECT_NE(e.source().find("__0_0.distcp"), std::string::npos) << e.what();
  EXPECT_FALSE(e.record().empty());
  EXPECT_TRUE(e.offset());
}

// model.0.weight is 32x16 in one chunk of sizes (32, 16): "K\x20K\x10\x86" in the pickle.
TEST_F(DcpFixture, HoleIsRefused) {
  std::string d = copy();
  // The chunk's sizes (32, 16) become (16, 16): half the tensor has no chunk.
  patch(d + "/.metadata", "sizes\x94h!K K\x10", "sizes\x94h!K\x10K\x10");
  Error e = test::capture_error([&] { Checkpoint::open(d); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
  EXPECT_EQ(e.record(), "model.0.weight");
  EXPECT_NE(std::string(e.what()).find("hole"), std::string::npos) << e.what();
}

TEST_F(DcpFixture, ChunkOutsideIsRefused) {
  std::string d = copy();
  patch(d + "/.metadata", "sizes\x94h!K K\x10", "sizes\x94h!K!K\x10");
  Error e = test::capture_error([&] { Checkpoint::open(d); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
  EXPECT_EQ(e.record(), "model.0.weight");
  EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
  EXPECT_NE(e.source().find("__0_0.distcp"), std::string::npos) << e.what();
}

TEST_F(DcpFixture, DataFileOutsideTheFolderIsRefused) {
  std::string d = copy();
  patch(d + "/.metadata", "\x8c\x0c__0_0.distcp", "\x8c\x0c../_0.distcp");
  Error e = test::capture_error([&] { Checkpoint::open(d); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
}

}  // namespace
}  // namespace ckpt
