// safetensors reader validation rules (one test each) and writer round trips.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "formats/open.h"
#include "test_util.h"
#include "util/bytes.h"

namespace ckpt {
namespace {

using internal::CheckpointModel;
using internal::open_safetensors;

std::vector<std::byte> make_file(std::string_view header, size_t data_bytes,
                                 uint64_t declared_len = UINT64_MAX) {
  std::vector<std::byte> f(8);
  internal::store_le<uint64_t>(f.data(), declared_len == UINT64_MAX ? header.size() : declared_len);
  auto h = test::to_bytes(header);
  f.insert(f.end(), h.begin(), h.end());
  for (size_t i = 0; i < data_bytes; ++i) f.push_back(static_cast<std::byte>(i * 7 + 1));
  return f;
}

std::shared_ptr<CheckpointModel> open_bytes(std::vector<std::byte> b, OpenOptions opt = {}) {
  return open_safetensors(memory_source(std::move(b), "t.safetensors"), opt);
}

ErrorCode code_of(std::string_view header, size_t data_bytes, OpenOptions opt = {}) {
  return test::capture_error([&] { open_bytes(make_file(header, data_bytes), opt); }).code();
}

std::vector<std::byte> storage_bytes(const CheckpointModel& d, size_t i) {
  std::vector<std::byte> out(d.storages[i].nbytes);
  d.source->read_into(d.storages[i].offset, out);
  return out;
}

TEST(SafetensorsReader, ReadsTensorsInOffsetOrder) {
  auto d = open_bytes(make_file(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                                R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                R"("__metadata__":{"format":"pt"}})",
                                12));
  ASSERT_EQ(d->tensors.size(), 2u);
  EXPECT_EQ(d->format, Format::kSafetensors);
  EXPECT_EQ(d->tensors[0].name, "a");
  EXPECT_EQ(d->tensors[1].name, "b");
  EXPECT_EQ(d->tensors[1].dtype, DType::kFloat32);
  EXPECT_EQ(d->tensors[1].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(d->tensors[1].strides, (std::vector<int64_t>{1}));
  const uint64_t n = d->storages[0].offset - 8;
  EXPECT_EQ(d->storages[1].offset, 8 + n + 4);
  EXPECT_EQ(d->storages[1].nbytes, 8u);
  EXPECT_EQ(d->properties.at("metadata.format"), "pt");
  EXPECT_EQ(d->properties.at("header_bytes"), std::to_string(n));
  EXPECT_EQ(d->properties.at("data_start"), std::to_string(8 + n));
  EXPECT_EQ(d->properties.count("format_version"), 0u);
  ASSERT_TRUE(d->root && d->root->is_dict());
  ASSERT_EQ(d->root->entries().size(), 2u);
  EXPECT_EQ(d->root->entries()[0].first->str(), "a");
  EXPECT_EQ(d->root->entries()[0].second->kind(), Value::Kind::kTensor);
  EXPECT_EQ(d->root->entries()[1].second->as_int(), 1);
  ASSERT_TRUE(d->root->state());
  EXPECT_EQ(d->root->state()->get("format")->str(), "pt");
}

TEST(SafetensorsReader, HeaderTooLarge) {
  auto f = make_file("{}", 0, 100'000'001);
  EXPECT_EQ(test::capture_error([&] { open_bytes(f); }).code(), ErrorCode::kLimitExceeded);
  OpenOptions small;
  small.limits.max_metadata_bytes = 4;
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0, small),
            ErrorCode::kLimitExceeded);
}

TEST(SafetensorsReader, HeaderPassesEndOfFile) {
  auto f = make_file("{}", 0, 1000);
  EXPECT_EQ(test::capture_error([&] { open_bytes(f); }).code(), ErrorCode::kTruncated);
  EXPECT_EQ(test::capture_error([&] { open_bytes(test::to_bytes("abc")); }).code(),
            ErrorCode::kTruncated);
}

TEST(SafetensorsReader, BadJson) {
  EXPECT_EQ(code_of(R"({"a":)", 0), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of("[1,2]", 0), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of("{\"\xff\":1}", 0), ErrorCode::kCorrupt);  // not UTF-8
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[1]}})", 1), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
            ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
            ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, UnknownDtype) {
  auto e = test::capture_error([&] {
    open_bytes(make_file(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1));
  });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_EQ(e.record(), "w");
}

TEST(SafetensorsReader, Hole) {
  auto e = test::capture_error([&] {
    open_bytes(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                         R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                         5));
  });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "b");
  EXPECT_TRUE(e.offset().has_value());
}

TEST(SafetensorsReader, Overlap) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                    4),
            ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, EndNotFileEnd) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 3),
            ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({})", 1), ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, EndBeforeBegin) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,0]}})", 2),
            ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, ShapeSizeMismatch) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
            ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, SubByteMisaligned) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
            ErrorCode::kCorrupt);
  auto d = open_bytes(make_file(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2));
  EXPECT_EQ(d->tensors[0].dtype, DType::kFloat4_e2m1);
}

TEST(SafetensorsReader, Overflow) {
  EXPECT_EQ(code_of(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],)"
                    R"("data_offsets":[0,8]}})",
                    8),
            ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"a":{"dtype":"F64","shape":[2305843009213693952],)"
                    R"("data_offsets":[0,8]}})",
                    8),
            ErrorCode::kCorrupt);
  EXPECT_EQ(
      code_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}})", 1),
      ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, NonStringMetadata) {
  EXPECT_EQ(code_of(R"({"__metadata__":{"n":1}})", 0), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"__metadata__":{"n":{"x":"y"}}})", 0), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"__metadata__":"x"})", 0), ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, DuplicateNames) {
  auto e = test::capture_error([&] {
    open_bytes(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                         R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                         2));
  });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1),
            ErrorCode::kCorrupt);
}

TEST(SafetensorsReader, WhitespacePaddingAccepted) {
  auto d = open_bytes(
      make_file("  \n{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}      ", 1));
  EXPECT_EQ(d->tensors.size(), 1u);
}

TEST(SafetensorsReader, EmptyAndScalarTensors) {
  auto d = open_bytes(make_file(R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                                R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                                R"("f":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                                8));
  ASSERT_EQ(d->tensors.size(), 3u);
  EXPECT_EQ(d->tensors[0].name, "e");
  EXPECT_EQ(d->tensors[1].name, "s");
  EXPECT_TRUE(d->tensors[1].shape.empty());
  EXPECT_EQ(d->tensors[2].name, "f");
}

TEST(SafetensorsReader, TensorAndDimLimits) {
  OpenOptions o;
  o.limits.max_tensors = 1;
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    2, o),
            ErrorCode::kLimitExceeded);
  OpenOptions d;
  d.limits.max_dims = 2;
  EXPECT_EQ(code_of(R"({"a":{"dtype":"U8","shape":[1,1,1],"data_offsets":[0,1]}})", 1, d),
            ErrorCode::kLimitExceeded);
}

TEST(SafetensorsReader, AlignmentProperty) {
  std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  h.append(4096 - 8 - h.size(), ' ');
  auto d = open_bytes(make_file(h, 1));
  EXPECT_EQ(d->properties.at("alignment"), "4096");
  EXPECT_EQ(d->properties.at("data_start"), "4096");
}

// ---- writer ----

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 17) & 0xFF);
  return v;
}

std::vector<Tensor> all_dtype_tensors() {
  std::vector<Tensor> ts;
  int seed = 0;
  for (int k = 0; k < kNumDTypes; ++k) {
    DType dt = static_cast<DType>(k);
    if (!dtype_info(dt).safetensors) continue;
    std::vector<int64_t> shape{2, 4};
    auto n = dtype_nbytes(dt, 8).value();
    ts.push_back(
        Tensor::copy_of(std::string("t_") + dtype_info(dt).name, dt, shape, pattern(n, ++seed)));
  }
  ts.push_back(Tensor::copy_of("scalar", DType::kFloat32, {}, pattern(4, 99)));
  ts.push_back(Tensor::copy_of("empty", DType::kFloat16, {0, 5}, {}));
  return ts;
}

void expect_round_trip(const std::vector<Tensor>& ts, uint64_t alignment) {
  MemorySink sink;
  SafetensorsSaveOptions o;
  o.alignment = alignment;
  save_safetensors(sink, ts, {{"k", "v"}, {"quote\"", "\xc3\xa9"}}, o);
  auto d = open_bytes(sink.bytes());
  ASSERT_EQ(d->tensors.size(), ts.size());
  EXPECT_EQ(std::stoull(d->properties.at("data_start")) % alignment, 0u);
  EXPECT_EQ(d->properties.at("metadata.k"), "v");
  EXPECT_EQ(d->properties.at("metadata.quote\""), "\xc3\xa9");
  for (const Tensor& t : ts) {
    auto it = std::find_if(d->tensors.begin(), d->tensors.end(),
                           [&](const TensorInfo& i) { return i.name == t.name(); });
    ASSERT_NE(it, d->tensors.end()) << t.name();
    EXPECT_EQ(it->dtype, t.dtype());
    EXPECT_EQ(it->shape, t.shape());
    const StorageInfo& s = d->storages[it->storage];
    auto sz = dtype_size(t.dtype());
    if (sz) {
      EXPECT_EQ(s.offset % sz, 0u) << t.name();
    }
    auto got = storage_bytes(*d, it->storage);
    auto want = t.contiguous_bytes();
    if (!sz) want.assign(t.data(), t.data() + t.info().nbytes());
    EXPECT_EQ(got, want) << t.name();
  }
}

TEST(SafetensorsWriter, RoundTripAllDtypesAlign8) { expect_round_trip(all_dtype_tensors(), 8); }
TEST(SafetensorsWriter, RoundTripAllDtypesAlign4096) {
  expect_round_trip(all_dtype_tensors(), 4096);
}

TEST(SafetensorsWriter, OrdersByDtypeAlignmentThenName) {
  std::vector<Tensor> ts{Tensor::copy_of("b", DType::kUInt8, {1}, pattern(1, 1)),
                         Tensor::copy_of("z", DType::kFloat64, {1}, pattern(8, 2)),
                         Tensor::copy_of("a", DType::kUInt8, {1}, pattern(1, 3)),
                         Tensor::copy_of("c", DType::kFloat16, {1}, pattern(2, 4))};
  MemorySink sink;
  save_safetensors(sink, ts);
  auto d = open_bytes(sink.bytes());
  std::vector<std::string> names;
  for (auto& t : d->tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "c", "a", "b"}));
}

TEST(SafetensorsWriter, NonContiguousWrittenContiguous) {
  auto base = Tensor::copy_of("m", DType::kInt32, {2, 3}, pattern(24, 5));
  TensorInfo info = base.info();
  info.shape = {3, 2};
  info.strides = {1, 3};  // transpose
  Tensor t(info, base.storage());
  MemorySink sink;
  save_safetensors(sink, {t});
  auto d = open_bytes(sink.bytes());
  EXPECT_EQ(storage_bytes(*d, 0), t.contiguous_bytes());
}

TEST(SafetensorsWriter, SharedStorageRefusedOrCopied) {
  auto a = Tensor::copy_of("a", DType::kFloat32, {4}, pattern(16, 6));
  TensorInfo bi = a.info();
  bi.name = "b";
  bi.shape = {2};
  bi.strides = {1};
  bi.storage_offset = 2;
  Tensor b(bi, a.storage());
  MemorySink sink;
  auto e = test::capture_error([&] { save_safetensors(sink, {a, b}); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message().find("copy_shared"), std::string::npos);
  SafetensorsSaveOptions o;
  o.copy_shared = true;
  MemorySink sink2;
  save_safetensors(sink2, {a, b}, {}, o);
  auto d = open_bytes(sink2.bytes());
  ASSERT_EQ(d->tensors.size(), 2u);
  auto all = a.contiguous_bytes();
  EXPECT_EQ(storage_bytes(*d, d->tensors[1].storage),
            std::vector<std::byte>(all.begin() + 8, all.end()));
}

TEST(SafetensorsWriter, RefusesBadInput) {
  MemorySink sink;
  auto t = Tensor::copy_of("a", DType::kFloat32, {1}, pattern(4, 1));
  EXPECT_CKPT_ERROR(save_safetensors(sink, {t, t}), ErrorCode::kInvalidArgument);
  auto c = Tensor::copy_of("c", DType::kComplex128, {1}, pattern(16, 1));
  EXPECT_CKPT_ERROR(save_safetensors(sink, {c}), ErrorCode::kUnsupported);
  SafetensorsSaveOptions o;
  o.alignment = 12;
  EXPECT_CKPT_ERROR(save_safetensors(sink, {t}, {}, o), ErrorCode::kInvalidArgument);
}

TEST(SafetensorsWriter, FileIsAtomicAndReadable) {
  test::TempDir dir;
  std::string path = dir.file("m.safetensors");
  save_safetensors(path, all_dtype_tensors());
  auto d = open_safetensors(open_file_source(path), {});
  EXPECT_EQ(d->tensors.size(), all_dtype_tensors().size());
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++files;
  EXPECT_EQ(files, 1u);
  // A failing save leaves nothing behind.
  auto c = Tensor::copy_of("c", DType::kComplex128, {1}, pattern(16, 1));
  EXPECT_CKPT_ERROR(save_safetensors(dir.file("bad.safetensors"), {c}), ErrorCode::kUnsupported);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.safetensors")));
}

}  // namespace
}  // namespace ckpt
