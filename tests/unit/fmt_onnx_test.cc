// ONNX reader (src/formats/onnx): models assembled field by field with the wire writer helpers,
// opened from memory. Interop with python3-onnx and onnxruntime: tests/interop/test_onnx.py.

#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/checkpoint.h"
#include "ckpt/onnx.h"
#include "formats/onnx/onnx_model.h"
#include "formats/onnx/onnx_wire.h"
#include "formats/open.h"

namespace ckpt {
namespace {

namespace w = internal::onnx;

std::string tensor_msg(const std::string& name, int type, std::vector<uint64_t> dims,
                       const std::string& extra) {
  std::string t;
  for (uint64_t d : dims) {
    w::put_tag(t, 1, w::kVarint);
    w::put_varint(t, d);
  }
  w::put_tag(t, 2, w::kVarint);
  w::put_varint(t, static_cast<uint64_t>(type));
  w::put_len(t, 8, name);
  return t + extra;
}

std::string model_with(const std::string& graph) {
  std::string m;
  w::put_tag(m, 1, w::kVarint);
  w::put_varint(m, 8);
  w::put_len(m, 7, graph);
  return m;
}

Checkpoint open_str(const std::string& bytes) {
  return Checkpoint::open(memory_source(std::string_view(bytes), "<memory>"));
}

TEST(Onnx, RawDataIsAZeroCopyView) {
  std::string raw(16, '\0');
  float v[4] = {1, 2, 3, 4};
  std::memcpy(raw.data(), v, 16);
  std::string payload;
  w::put_len(payload, 9, raw);
  std::string g;
  w::put_len(g, 5, tensor_msg("w", 1, {2, 2}, payload));
  std::string m = model_with(g);
  Checkpoint c = open_str(m);
  ASSERT_EQ(c.format(), Format::kOnnx);
  ASSERT_EQ(c.tensors().size(), 1u);
  EXPECT_EQ(c.tensors()[0].shape, (std::vector<int64_t>{2, 2}));
  Tensor t = c.tensor(0);
  EXPECT_EQ(std::memcmp(t.data(), v, 16), 0);
  // the view points into the source's memory at raw_data's offset
  auto places = onnx_places(c);
  ASSERT_EQ(places.size(), 1u);
  EXPECT_EQ(places[0].how, "raw_data");
  EXPECT_EQ(t.data(), c.source().memory() + places[0].offset);
}

TEST(Onnx, TypedInt32DataForFloat16AndInt8) {
  std::string vals;
  for (uint64_t x : {0x3c00u, 0xc000u}) {  // 1.0, -2.0 as half bits
    w::put_varint(vals, x);
  }
  std::string f16;
  w::put_len(f16, 5, vals);
  std::string i8;
  for (int64_t x : {-1, 2, -3}) {
    w::put_tag(i8, 5, w::kVarint);  // unpacked form
    w::put_varint(i8, static_cast<uint64_t>(x));
  }
  std::string g;
  w::put_len(g, 5, tensor_msg("h", 10, {2}, f16));
  w::put_len(g, 5, tensor_msg("b", 3, {3}, i8));
  Checkpoint c = open_str(model_with(g));
  Tensor h = c.tensor("h");
  uint16_t hb[2];
  std::memcpy(hb, h.data(), 4);
  EXPECT_EQ(hb[0], 0x3c00);
  EXPECT_EQ(hb[1], 0xc000);
  Tensor b = c.tensor("b");
  const auto* p = reinterpret_cast<const int8_t*>(b.data());
  EXPECT_EQ(p[0], -1);
  EXPECT_EQ(p[1], 2);
  EXPECT_EQ(p[2], -3);
}

TEST(Onnx, HostileWireRefused) {
  auto code = [](const std::string& bytes) {
    try {
      internal::open_onnx(memory_source(std::string_view(bytes), "<memory>"), {});
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kIo;  // (not thrown: marks a failure)
  };
  EXPECT_EQ(code(std::string("\x08") + std::string(11, '\xff')), ErrorCode::kCorrupt);
  EXPECT_EQ(code(std::string("\x08\x08\x3a\x05\x00", 5)), ErrorCode::kTruncated);
  EXPECT_EQ(code(std::string("\x08\x08\x3b", 3)), ErrorCode::kCorrupt);  // a group
  EXPECT_EQ(code(std::string("\x08\x08", 2)), ErrorCode::kCorrupt);      // no graph
  // raw_data shorter than the dims say
  std::string payload;
  w::put_len(payload, 9, std::string(15, '\0'));
  std::string g;
  w::put_len(g, 5, tensor_msg("w", 1, {4}, payload));
  EXPECT_EQ(code(model_with(g)), ErrorCode::kCorrupt);
}

TEST(Onnx, ExternalLocationsStayInsideTheFolder) {
  EXPECT_THROW(internal::onnx_external_path("/m", "../x", "t"), Error);
  EXPECT_THROW(internal::onnx_external_path("/m", "/etc/passwd", "t"), Error);
  EXPECT_THROW(internal::onnx_external_path("/m", "a/../../x", "t"), Error);
  EXPECT_THROW(internal::onnx_external_path("/m", "", "t"), Error);
  EXPECT_EQ(internal::onnx_external_path("/m", "w.bin", "t"), "/m/w.bin");
  EXPECT_EQ(internal::onnx_model_dir("<memory>"), "");
  EXPECT_EQ(internal::onnx_model_dir("model.onnx"), ".");
}

TEST(Onnx, ExternalDataFromMemoryIsRefused) {
  std::string ext;
  auto entry = [&](const std::string& k, const std::string& v) {
    std::string e;
    w::put_len(e, 1, k);
    w::put_len(e, 2, v);
    w::put_len(ext, 13, e);
  };
  entry("location", "w.bin");
  entry("prepacked_0", "MatMul+1|4096;16;0|8192;32;0");
  ext += '\x70';
  ext += '\x01';
  std::string g;
  w::put_len(g, 5, tensor_msg("w", 1, {4}, ext));
  Checkpoint c = open_str(model_with(g));
  auto packs = onnx_prepacked(c);
  ASSERT_EQ(packs.size(), 1u);
  EXPECT_EQ(packs[0].key, "MatMul+1");
  ASSERT_EQ(packs[0].buffers.size(), 2u);
  EXPECT_EQ(packs[0].buffers[1].offset, 8192u);
  EXPECT_EQ(packs[0].buffers[1].length, 32u);
  try {
    c.tensor(0);
    FAIL() << "read external data without a folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

}  // namespace
}  // namespace ckpt
