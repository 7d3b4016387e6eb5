// Transforms of a conversion (include/ckpt/transform.h): recipes, the element conversions, and
// transformed content through every writer, with stored digests (the feed asked twice).

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "ckpt/ckpt.h"
#include "ckpt/convert.h"
#include "ckpt/digest.h"
#include "ckpt/safetensors.h"
#include "convert/numerics.h"
#include "test_util.h"

namespace ckpt {
namespace {

std::vector<std::byte> floats(std::initializer_list<float> v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

std::string model(const test::TempDir& dir) {
  const std::string path = dir.file("in.safetensors");
  save_safetensors(
      path, {Tensor::copy_of("module.a", DType::kFloat32, {2, 3}, floats({1, 2, 3, 4, 5, 6})),
             Tensor::copy_of("module.b", DType::kFloat32, {2}, floats({0.1f, 1e-40f}))});
  return path;
}

TEST(Transform, RecipeFieldsAndRefusals) {
  TransformRecipe r = parse_transform_recipe(
      R"({"rename": ["^a=b", {"strip_prefix": "m."}], "add_prefix": "x.", "cast": "fp16",
          "dequantize": true, "split": ["q:1:a,b:1,2"], "fuse": ["a,b:0:ab"]})");
  ASSERT_EQ(r.rename.size(), 3u);
  EXPECT_EQ(r.rename[0].kind, RenameRule::kRegex);
  EXPECT_EQ(r.rename[1].kind, RenameRule::kStripPrefix);
  EXPECT_EQ(r.rename[2].pattern, "x.");
  EXPECT_EQ(r.cast, DType::kFloat16);
  EXPECT_EQ(r.dequantize.size(), 2u);
  EXPECT_EQ(r.split[0].sizes, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.fuse[0].name, "ab");
  for (const char* bad : {R"({"renmae": []})", R"({"cast": "int8"})", R"([1])", "{",
                          R"({"split": ["q:x:a"]})", R"({"dequantize": ["nf4"]})"})
    EXPECT_EQ(test::capture_error([&] { parse_transform_recipe(bad); }).code(),
              ErrorCode::kInvalidArgument)
        << bad;
}

TEST(Transform, ElementConversionsRoundToNearestEven) {
  using internal::f32_to_bf16_bits;
  using internal::f32_to_f16_bits;
  EXPECT_EQ(f32_to_f16_bits(0x3F800000), 0x3C00);  // 1
  EXPECT_EQ(f32_to_f16_bits(0x477FF000), 0x7C00);  // 65520: infinity
  EXPECT_EQ(f32_to_f16_bits(0x477FEFFF), 0x7BFF);  // just below: 65504
  EXPECT_EQ(f32_to_f16_bits(0x33000000), 0x0000);  // 2^-25: a tie, to even zero
  EXPECT_EQ(f32_to_f16_bits(0x33000001), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(0xFF812345), 0xFE09);           // NaN: sign, quiet, high payload
  EXPECT_EQ(f32_to_bf16_bits(0x3F808000, 0xFFFF), 0x3F80);  // tie to even
  EXPECT_EQ(f32_to_bf16_bits(0x3F818000, 0xFFFF), 0x3F82);
  EXPECT_EQ(f32_to_bf16_bits(0x7FC00000, 0xFFFF), 0xFFFF);
  EXPECT_EQ(internal::e4m3fn_to_f32_bits(0x7E), 0x43E00000u);  // 448
  EXPECT_EQ(internal::e4m3fn_to_f32_bits(0x01), 0x3B000000u);  // 2^-9
}

// cast_elements' float32 -> bfloat16 runs (blocks of 1024, a tail, unaligned buffers) equal the
// per-element rounding, special values and NaN payloads included.
TEST(Transform, Float32ToBfloat16RunsEqualTheElementRounding) {
  std::vector<uint32_t> v = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F800001,
                             0xFFC00000, 0x7FFFFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x3F808000,
                             0x3F818000, 0x3F807FFF, 0x00008000, 0x00018000, 0x807FFFFF};
  uint32_t x = 12345;
  while (v.size() < 3000) {
    x = x * 1664525u + 1013904223u;
    v.push_back(x);
  }
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{1024}, size_t{1025}, v.size()}) {
    std::vector<std::byte> in(n * 4 + 1), out(n * 2 + 1);
    std::memcpy(in.data() + 1, v.data(), n * 4);
    internal::cast_elements(DType::kFloat32, in.data() + 1, DType::kBFloat16, out.data() + 1, n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 1 + i * 2, 2);
      ASSERT_EQ(h, internal::f32_to_bf16_bits(v[i], 0xFFFF)) << n << " " << i << " " << v[i];
    }
  }
}

TEST(Transform, EveryWriterWithDigestsAndRefusalsLeaveNothing) {
  test::TempDir dir;
  Checkpoint c = Checkpoint::open(model(dir));
  ConvertOptions o;
  o.fsync = false;
  o.transforms.rename = {{RenameRule::kStripPrefix, "module.", ""}};
  o.transforms.cast = DType::kBFloat16;
  o.transforms.transpose = {"a"};
  SafetensorsTarget st;
  st.store_digests = true;
  o.target = st;
  ConvertReport r = convert(c, dir.file("out.safetensors"), o);
  EXPECT_EQ(r.tensors, 2u);
  EXPECT_EQ(r.tensor_bytes, 16u);
  EXPECT_EQ(r.digests_stored, 2u);
  Checkpoint out = Checkpoint::open(dir.file("out.safetensors"));
  ASSERT_EQ(out.tensors().size(), 2u);
  const TensorInfo& a = out.tensors()[0].name == "a" ? out.tensors()[0] : out.tensors()[1];
  EXPECT_EQ(a.dtype, DType::kBFloat16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
  auto stored = stored_digests(out);
  ASSERT_TRUE(stored);
  for (const auto& d : *stored) {
    size_t i = out.tensors()[0].name == d.name ? 0 : 1;
    EXPECT_EQ(d.sha256, tensor_sha256(out.tensor(i))) << d.name;
  }
  for (ConvertTarget t :
       {ConvertTarget{PtTarget{}}, ConvertTarget{TensorizerTarget{}}, ConvertTarget{DcpTarget{}}}) {
    o.target = t;
    const std::string path = dir.file(std::string("out.") + convert_format_name(target_format(t)));
    EXPECT_EQ(convert(c, path, o).tensors, 2u) << path;
  }
  o.target = SafetensorsTarget{};
  o.transforms.transpose = {"b"};  // 1-D
  const std::string bad = dir.file("bad.safetensors");
  EXPECT_EQ(test::capture_error([&] { convert(c, bad, o); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(bad));
  o.transforms.transpose.clear();
  // Sharded: the plan is cut from the transformed tensors (a shard per tensor here).
  o.max_shard_size = 1;
  const ConvertReport sharded = convert(c, dir.file("sharded.safetensors"), o);
  EXPECT_EQ(sharded.files.size(), 2u);
  ASSERT_FALSE(sharded.index.empty());
  const Checkpoint set = Checkpoint::open(sharded.index);
  ASSERT_EQ(set.tensors().size(), 2u);
  EXPECT_EQ(set.tensors()[0].dtype, DType::kBFloat16);
}

}  // namespace
}  // namespace ckpt
