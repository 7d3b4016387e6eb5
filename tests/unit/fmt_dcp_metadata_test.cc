// The `.metadata` reader of DCP folders (formats/dcp/dcp_metadata.cc) on hostile pickles: trees
// nested past the depth limit, planner_data paths whose list indexes ask for padding, keys
// listed twice. The pickles are written opcode by opcode, as pickle.dump writes the dataclasses.

#include <gtest/gtest.h>

#include "ckpt/error.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/flat_index.h"
#include "test_util.h"

namespace ckpt {
namespace {

using namespace std::string_literals;

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
std::string str(const std::string& s) { return "X" + le32(static_cast<uint32_t>(s.size())) + s; }
std::string newobj(const std::string& cls) {
  return "ctorch.distributed.checkpoint.metadata\n" + cls + "\n)\x81";
}

// Metadata(state_dict_metadata={key: BytesStorageMetadata()...}, planner_data=..., storage_data={})
// `planner`: the pickled (key, path) pairs of planner_data.
std::string metadata(const std::vector<std::string>& keys, const std::string& planner) {
  std::string p = "\x80\x02" + newobj("Metadata") + "}(" + str("state_dict_metadata") + "}(";
  for (const auto& k : keys) p += str(k) + newobj("BytesStorageMetadata");
  p += "u" + str("planner_data") + "}(" + planner + "u" + str("storage_data") + "}ub.";
  return p;
}
// One planner_data item: key -> (step, index).
std::string path_item(const std::string& key, const std::string& step, uint32_t index) {
  return str(key) + str(step) + "J" + le32(index) + "\x86";
}

internal::DcpMetadata read(const std::string& pickle, const Limits& limits = {}) {
  auto bytes = test::to_bytes(pickle);
  return internal::read_dcp_metadata(bytes, "dir/.metadata", limits);
}

TEST(DcpMetadata, ReadsTheHandWrittenPickle) {
  auto md = read(metadata({"a.0", "b"}, path_item("a.0", "a", 0)));
  ASSERT_EQ(md.entries.size(), 2u);
  EXPECT_TRUE(md.entries[0].is_bytes);
  ASSERT_EQ(md.entries[0].path.size(), 2u);
  EXPECT_EQ(md.entries[0].path[1]->as_int(), 0);
  EXPECT_TRUE(md.entries[1].path.empty());
}

TEST(DcpMetadata, DeepTreeIsLimitExceededNotAStackOverflow) {
  // PROTO 2, None, 300,000 TUPLE1, STOP: a 300 KB .metadata that crashed `ckpt ls`.
  const std::string deep = "\x80\x02N" + std::string(300000, '\x85') + ".";
  Error e = test::capture_error([&] { read(deep); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_NE(std::string(e.what()).find("max_pickle_depth"), std::string::npos) << e.what();
  // With the limit raised past the depth, the refusal prints the tree cut short.
  Limits deep_ok;
  deep_ok.max_pickle_depth = 400000;
  e = test::capture_error([&] { read(deep, deep_ok); });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_NE(e.message().find("(((((((("), std::string::npos) << e.what();
}

TEST(DcpMetadata, IndexPaddingCountsAgainstTheObjectBudget) {
  // ("a", 16777216): a list of 16,777,217 slots from a 200-byte file.
  Error e = test::capture_error([] { read(metadata({"a"}, path_item("a", "a", 1u << 24))); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_EQ(e.record(), "a");
  EXPECT_NE(e.message().find("limits.max_object_bytes"), std::string::npos) << e.what();
  // Sixteen lists of a million slots each: each fits alone, together they do not.
  std::vector<std::string> keys;
  std::string planner;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("k" + std::to_string(i));
    planner += path_item(keys.back(), "l" + std::to_string(i), 1000000);
  }
  EXPECT_NO_THROW(read(metadata({"k0"}, path_item("k0", "l0", 1000000))));
  EXPECT_CKPT_ERROR(read(metadata(keys, planner)), ErrorCode::kLimitExceeded);
  // Gaps are real: torch writes ("a", 1) alone for {"a": [{}, t]}. One list padded by many
  // keys counts once.
  keys.clear();
  planner.clear();
  for (int i = 0; i < 16; ++i) {
    keys.push_back("a." + std::to_string(1000000 - i));
    planner += path_item(keys.back(), "a", 1000000 - i);
  }
  EXPECT_EQ(read(metadata(keys, planner)).entries.size(), 16u);
  // The budget grows with max_object_bytes.
  Limits small;
  small.max_object_bytes = 1 << 20;
  EXPECT_CKPT_ERROR(read(metadata({"k0"}, path_item("k0", "l0", 1000000)), small),
                    ErrorCode::kLimitExceeded);
}

TEST(DcpMetadata, PathsDeeperThanTheDepthLimitAreRefused) {
  std::string path = str("k") + "(";
  for (int i = 0; i < 20; ++i) path += str("s");
  path += "t";
  Limits l;
  l.max_pickle_depth = 19;
  Error e = test::capture_error([&] { read(metadata({"k"}, path), l); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_NE(e.message().find("max_pickle_depth"), std::string::npos) << e.what();
  l.max_pickle_depth = 20;
  EXPECT_EQ(read(metadata({"k"}, path), l).entries[0].path.size(), 20u);
}

TEST(DcpMetadata, KeysListedTwiceAreCorrupt) {
  Error e = test::capture_error([] { read(metadata({"w", "b", "w"}, "")); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "w");
  EXPECT_NE(e.message().find("twice"), std::string::npos) << e.what();
  e = test::capture_error(
      [] { read(metadata({"w"}, path_item("w", "a", 0) + path_item("w", "a", 1))); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "w");
}

// The reader's index: every key found again after the slots grew, a key added twice keeps its
// first item, an absent key is kNone, and keys whose hashes are all equal are still told apart
// (by `same`, as a crafted file's would be).
TEST(DcpFlatIndex, FindsEveryKeyThroughGrowthAndEqualHashes) {
  using internal::FlatIndex;
  std::vector<std::string> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back("model.layers." + std::to_string(i) + ".weight");
  for (const bool collide : {false, true}) {
    auto hash = [&](const std::string& k) { return collide ? 42 : internal::name_hash(k); };
    FlatIndex index;  // 16 slots: grows many times
    for (size_t i = 0; i < keys.size(); ++i) {
      auto same = [&](uint32_t j) { return keys[j] == keys[i]; };
      ASSERT_EQ(index.find_or_add(hash(keys[i]), i, same), i);
      ASSERT_EQ(index.find_or_add(hash(keys[i]), keys.size() + i, same), i);
    }
    EXPECT_EQ(index.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      EXPECT_EQ(index.find(hash(keys[i]), [&](uint32_t j) { return keys[j] == keys[i]; }), i);
    const std::string absent = "model.layers.x.weight";
    EXPECT_EQ(index.find(hash(absent), [&](uint32_t j) { return keys[j] == absent; }),
              FlatIndex::kNone);
  }
}

}  // namespace
}  // namespace ckpt
