// Writing torch.distributed.checkpoint folders (save_dcp, convert with DcpTarget): ckpt reads
// its own folders back equal to the input, the chunk boxes are Shard(0)'s, and what DCP cannot
// hold is refused before anything appears at the path. (torch's dcp.load reading these folders:
// tests/interop/test_dcp_write.py.)

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "ckpt/ckpt.h"
#include "formats/dcp/dcp_metadata.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

Tensor iota_tensor(std::string name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1.0f);
  return Tensor::copy_of(std::move(name), DType::kFloat32, std::move(shape),
                         std::as_bytes(std::span<const float>(v)));
}

void expect_equal(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype()) << b.name();
  EXPECT_EQ(a.shape(), b.shape()) << b.name();
  auto x = a.contiguous_bytes(), y = b.contiguous_bytes();
  EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << b.name();
}

// A nested state: a model dict, a number, a list holding a tensor, and a transposed view.
struct State {
  std::vector<Tensor> tensors;
  ValuePtr root;
};
State nested_state() {
  State s;
  s.tensors = {iota_tensor("w", {10, 3}), iota_tensor("b", {3}), iota_tensor("t", {4, 6})};
  // tensors[2] seen transposed: shape (6, 4), strides (1, 6).
  s.tensors[2].info().shape = {6, 4};
  s.tensors[2].info().strides = {1, 6};
  ValuePtr model = Value::ordered_dict();
  model->set("w", Value::tensor(0));
  model->set("b", Value::tensor(1));
  s.root = Value::dict();
  s.root->set("model", model);
  s.root->set("step", Value::integer(7));
  s.root->set("hist", Value::list({Value::tensor(2), Value::string("x")}));
  return s;
}

TEST(DcpWrite, ReadsBackWhatItWroteWithShard0Chunks) {
  test::TempDir dir;
  State s = nested_state();
  DcpSaveOptions o;
  o.files = 4;
  o.fsync = false;
  save_dcp(dir.file("out"), s.root, s.tensors, o);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.file("out")))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".metadata", "__0_0.distcp", "__1_0.distcp",
                                             "__2_0.distcp", "__3_0.distcp"}));

  Checkpoint c = Checkpoint::open(dir.file("out"));
  EXPECT_EQ(c.format(), Format::kTorchDcp);
  expect_equal(c.tensor("model.w"), s.tensors[0]);
  expect_equal(c.tensor("model.b"), s.tensors[1]);
  expect_equal(c.tensor("hist.0"), s.tensors[2]);  // the view, as the elements it shows
  ASSERT_TRUE(c.root()->get("step"));
  EXPECT_EQ(c.root()->get("step")->as_int(), 7);
  ASSERT_TRUE(c.root()->get("hist") && c.root()->get("hist")->kind() == Value::Kind::kList);
  EXPECT_EQ(c.root()->get("hist")->items()[1]->str(), "x");

  auto bytes = test::read_file(dir.file("out/.metadata"));
  internal::DcpMetadata md = internal::read_dcp_metadata(bytes, ".metadata", Limits{});
  EXPECT_EQ(md.version, "1.0.0");
  ASSERT_EQ(md.entries.size(), 5u);
  const internal::DcpEntry& w = md.entries[0];
  EXPECT_EQ(w.fqn, "model.w");
  ASSERT_EQ(w.chunks.size(), 4u);  // ceil(10 / 4) = 3 rows: 3, 3, 3, 1
  EXPECT_EQ(w.chunks[3].offsets, (std::vector<int64_t>{9, 0}));
  EXPECT_EQ(w.chunks[3].sizes, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(md.entries[2].is_bytes);  // step
  EXPECT_EQ(md.entries[2].fqn, "step");
  EXPECT_EQ(md.entries[3].fqn, "hist.0");
  ASSERT_EQ(md.entries[3].path.size(), 2u);
  EXPECT_EQ(md.entries[3].path[1]->kind(), Value::Kind::kInt);  // a list position
  EXPECT_TRUE(md.entries[4].is_bytes);                          // hist.1
}

TEST(DcpWrite, ConvertRoundTripAndReport) {
  test::TempDir dir;
  State s = nested_state();
  save_torch(dir.file("in.pt"), s.root, s.tensors);
  Checkpoint in = Checkpoint::open(dir.file("in.pt"));
  ConvertOptions o;
  o.fsync = false;
  o.target = DcpTarget{2};
  uint64_t last = 0;
  o.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(done, total);
    last = done;
  };
  ConvertReport r = convert(in, dir.file("dcp"), o);
  EXPECT_EQ(r.format, ConvertFormat::kDcp);
  EXPECT_EQ(r.files, (std::vector<std::string>{"__0_0.distcp", "__1_0.distcp", ".metadata"}));
  EXPECT_EQ(last, r.bytes_written);
  Checkpoint c = Checkpoint::open(dir.file("dcp"));
  expect_equal(c.tensor("model.w"), s.tensors[0]);
  EXPECT_EQ(parse_convert_format("dcp"), ConvertFormat::kDcp);
  EXPECT_STREQ(convert_format_name(ConvertFormat::kDcp), "dcp");
  EXPECT_EQ(target_format(default_target(ConvertFormat::kDcp)), ConvertFormat::kDcp);
}

TEST(DcpWrite, RefusalsLeaveNothing) {
  test::TempDir dir;
  State s = nested_state();
  auto refused = [&](ErrorCode code, const ConstValuePtr& root, std::vector<Tensor> tensors,
                     DcpSaveOptions o = {}) {
    Error e = test::capture_error([&] { save_dcp(dir.file("out"), root, tensors, o); });
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_FALSE(fs::exists(dir.file("out")));
    return e;
  };
  refused(ErrorCode::kInvalidArgument, Value::tensor(0), s.tensors);  // not a state dict
  DcpSaveOptions zero;
  zero.files = 0;
  refused(ErrorCode::kInvalidArgument, s.root, s.tensors, zero);
  ValuePtr dup = Value::dict();
  ValuePtr a = Value::dict();
  a->set("b", Value::tensor(0));
  dup->set("a", a);
  dup->set("a.b", Value::tensor(1));
  Error e = refused(ErrorCode::kInvalidArgument, dup, s.tensors);
  EXPECT_EQ(e.record(), "a.b");
  ValuePtr float_key = Value::dict();
  float_key->set(Value::real(1.5), Value::tensor(0));
  refused(ErrorCode::kUnsupported, float_key, s.tensors);
  std::vector<Tensor> meta = s.tensors;
  auto st = std::make_shared<Storage>(*meta[0].storage());
  st->info.meta = true;
  meta[0] = Tensor(meta[0].info(), st);
  refused(ErrorCode::kUnsupported, s.root, meta);
  ValuePtr cycle = Value::dict();
  ValuePtr inner = Value::dict();
  inner->set("up", cycle);
  cycle->set("in", inner);
  refused(ErrorCode::kInvalidArgument, cycle, s.tensors);
  inner->set("up", Value::none());  // free the cycle

  // Into a sink, or an existing non-empty folder.
  save_torch(dir.file("in.pt"), s.root, s.tensors);
  Checkpoint in = Checkpoint::open(dir.file("in.pt"));
  ConvertOptions o;
  o.target = DcpTarget{};
  MemorySink sink;
  EXPECT_EQ(test::capture_error([&] { convert(in, sink, o); }).code(), ErrorCode::kInvalidArgument);
  fs::create_directories(dir.file("taken"));
  test::write_file(dir.file("taken/keep"), test::to_bytes("x"));
  EXPECT_EQ(test::capture_error([&] { convert(in, dir.file("taken"), o); }).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(dir.file("taken/keep")));
  EXPECT_FALSE(fs::exists(dir.file("taken/.metadata")));
}

}  // namespace
}  // namespace ckpt
