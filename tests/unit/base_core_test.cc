#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>

#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"
#include "ckpt/value.h"
#include "test_util.h"
#include "util/bytes.h"
#include "util/crc32.h"
#include "util/name_index.h"
#include "util/text.h"

namespace ckpt {
namespace {

TEST(DType, TableLookups) {
  EXPECT_EQ(dtype_from_name("float32"), DType::kFloat32);
  EXPECT_EQ(dtype_from_name("torch.bfloat16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_EQ(dtype_from_storage_class("FloatStorage"), DType::kFloat32);
  EXPECT_EQ(dtype_from_storage_class("torch.BFloat16Storage"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_storage_class("ComplexHalfStorage"), DType::kComplex32);
  EXPECT_EQ(dtype_from_storage_class("Float8_e4m3fnStorage"), DType::kFloat8_e4m3fn);
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kFloat8_e4m3fn);
  EXPECT_EQ(dtype_from_numpy("<f2"), DType::kFloat16);
  EXPECT_EQ(dtype_from_numpy("|b1"), DType::kBool);
  EXPECT_EQ(dtype_from_numpy("<u1"), DType::kUInt8);
  EXPECT_FALSE(dtype_from_name("float31"));
  EXPECT_FALSE(dtype_from_storage_class("EvilStorage"));
}

TEST(DType, SizesAndSubByte) {
  EXPECT_EQ(dtype_size(DType::kComplex128), 16u);
  EXPECT_EQ(dtype_size(DType::kComplex32), 4u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_size(DType::kFloat4_e2m1), 0u);
  EXPECT_EQ(dtype_nbytes(DType::kFloat4_e2m1, 4), 2u);
  EXPECT_FALSE(dtype_nbytes(DType::kFloat4_e2m1, 3));  // ends mid-byte
  EXPECT_EQ(dtype_nbytes(DType::kFloat6_e2m3, 4), 3u);
  EXPECT_FALSE(dtype_nbytes(DType::kFloat64, UINT64_MAX / 2));  // overflow
  for (int i = 0; i < kNumDTypes; ++i) {
    auto& info = dtype_info(static_cast<DType>(i));
    EXPECT_EQ(dtype_from_name(info.name), info.dtype) << info.name;
  }
}

TEST(Error, MessageNamesEverything) {
  Error e(ErrorCode::kCorrupt, "bad magic", "a.pt", "archive/data.pkl", 42);
  e.add_context("reading data.pkl");
  std::string w = e.what();
  EXPECT_NE(w.find("a.pt"), std::string::npos);
  EXPECT_NE(w.find("archive/data.pkl"), std::string::npos);
  EXPECT_NE(w.find("at byte 42"), std::string::npos);
  EXPECT_NE(w.find("while reading data.pkl"), std::string::npos);
  EXPECT_NE(w.find("[corrupt]"), std::string::npos);
}

TEST(Crc32, KnownValueAndFusedCopy) {
  auto b = test::to_bytes("123456789");
  EXPECT_EQ(internal::crc32(b), 0xCBF43926u);
  std::vector<std::byte> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::byte(i * 7);
  std::vector<std::byte> dst(big.size());
  EXPECT_EQ(internal::copy_crc32(0, dst.data(), big), internal::crc32(big));
  EXPECT_EQ(dst, big);
}

TEST(Cursor, BoundsChecked) {
  auto b = test::to_bytes("\x01\x02\x03");
  internal::Cursor c(b, "f", "r", 100);
  EXPECT_EQ(c.get<uint16_t>(), 0x0201);
  auto e = test::capture_error([&] { c.get<uint16_t>(); });
  EXPECT_EQ(e.code(), ErrorCode::kTruncated);
  EXPECT_EQ(e.offset(), 102u);
}

TEST(Sources, FileMmapMemoryAgree) {
  test::TempDir dir;
  std::string path = dir.file("x.bin");
  auto bytes = test::to_bytes("hello, checkpoint");
  test::write_file(path, bytes);
  for (auto src : {open_file_source(path), open_mmap_source(path), memory_source(bytes)}) {
    EXPECT_EQ(src->size(), bytes.size());
    auto r = src->read(7, 5);
    EXPECT_EQ(test::to_string(r.data), "check");
    EXPECT_CKPT_ERROR(src->read(10, 100), ErrorCode::kTruncated);
    EXPECT_GE(src->stats().reads.load(), 1u);
  }
  EXPECT_CKPT_ERROR(open_file_source(dir.file("missing")), ErrorCode::kNotFound);
}

// release() drops a mapping's pages from the process; the bytes stay what the file holds, and
// a memory source (whose bytes exist nowhere else) ignores it.
TEST(Sources, ReleaseKeepsTheBytes) {
  test::TempDir dir;
  std::string path = dir.file("x.bin");
  std::vector<std::byte> bytes(5 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 3);
  test::write_file(path, bytes);
  for (auto src : {open_file_source(path), open_mmap_source(path), memory_source(bytes)}) {
    auto before = src->read(0, bytes.size());
    ASSERT_EQ(std::memcmp(before.begin(), bytes.data(), bytes.size()), 0);
    src->release(100, 4 * 4096);
    src->release(0, bytes.size() + 999);  // past the end: clipped
    src->release(bytes.size() + 5, 10);   // outside: ignored
    auto after = src->read(0, bytes.size());
    EXPECT_EQ(std::memcmp(after.begin(), bytes.data(), bytes.size()), 0) << src->name();
  }
}

// Eager and streaming copies of a mapped file go through pread_twin(): the same open file, so
// replacing the path (an atomic rename by a writer) does not change what a loaded checkpoint reads.
TEST(Sources, PreadTwinReadsTheMappedFileNotThePath) {
  test::TempDir dir;
  std::string path = dir.file("x.bin"), other = dir.file("y.bin");
  test::write_file(path, test::to_bytes("first version"));
  test::write_file(other, test::to_bytes("other content"));  // same length
  auto m = open_mmap_source(path);
  std::filesystem::rename(other, path);
  auto twin = m->pread_twin();
  ASSERT_TRUE(twin);
  EXPECT_EQ(twin.get(), m->pread_twin().get());
  std::vector<std::byte> buf(13);
  twin->read_into(0, buf);
  EXPECT_EQ(test::to_string(buf), "first version");
  EXPECT_FALSE(open_file_source(path)->pread_twin());
  EXPECT_FALSE(memory_source(test::to_bytes("abc"))->pread_twin());
}

TEST(Sinks, AtomicFileSinkCommitsOrLeavesNothing) {
  test::TempDir dir;
  std::string path = dir.file("out.bin");
  {
    auto s = create_file_sink(path);
    s->write(std::string_view("abc"));
    // destroyed without commit
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  {
    auto s = create_file_sink(path);
    s->write(std::string_view("abcdef"));
    s->patch(0, test::to_bytes("X"));
    EXPECT_CKPT_ERROR(s->patch(5, test::to_bytes("YY")), ErrorCode::kInvalidArgument);
    s->commit();
  }
  EXPECT_EQ(test::to_string(test::read_file(path)), "Xbcdef");
}

TEST(Tensor, ViewsAndContiguity) {
  std::vector<float> data = {0, 1, 2, 3, 4, 5};
  auto t =
      Tensor::from_bytes("t", DType::kFloat32, {2, 3}, std::as_bytes(std::span<const float>(data)));
  EXPECT_TRUE(t.info().is_contiguous());
  EXPECT_EQ(t.info().nbytes(), 24u);
  TensorInfo tr = t.info();  // transpose view
  tr.shape = {3, 2};
  tr.strides = {1, 3};
  Tensor tt(tr, t.storage());
  EXPECT_FALSE(tt.info().is_contiguous());
  auto c = tt.contiguous_bytes();
  const float* f = reinterpret_cast<const float*>(c.data());
  EXPECT_EQ(f[1], 3.0f);
  EXPECT_EQ(f[2], 1.0f);
  EXPECT_CKPT_ERROR(
      Tensor::from_bytes("bad", DType::kFloat32, {5}, std::as_bytes(std::span<const float>(data))),
      ErrorCode::kInvalidArgument);
}

TEST(Value, DictAndRepr) {
  auto d = Value::ordered_dict();
  d->set("a", Value::integer(1));
  d->set(Value::integer(3), Value::string("x"));
  d->set("a", Value::real(0.5));
  EXPECT_EQ(d->entries().size(), 2u);
  EXPECT_EQ(d->get("a")->as_float(), 0.5);
  EXPECT_EQ(d->get(3)->str(), "x");
  EXPECT_EQ(Value::real(0.1)->repr(), "0.1");
  EXPECT_EQ(Value::real(2)->repr(), "2.0");
  EXPECT_EQ(Value::tuple({Value::integer(1)})->repr(), "(1,)");
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// Value nodes made with a deleter that counts, so that a test can check that a whole tree died.
std::atomic<size_t> g_values_freed{0};
ValuePtr counted(const ValuePtr& like) {
  auto* v = new Value(*like);
  return ValuePtr(v, [](Value* p) {
    ++g_values_freed;
    delete p;
  });
}

// Runs `fn` on a thread with a stack of `stack_bytes` (std::thread cannot set one) and waits for
// it. A recursive destructor of a tree nested 1e5+ deep needs megabytes of stack: it would crash
// the test here instead of passing on the main thread's 8 MiB.
void run_on_small_stack(size_t stack_bytes, std::function<void()> fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t thread;
  int rc = pthread_create(
      &thread, &attr,
      [](void* arg) -> void* {
        (*static_cast<std::function<void()>*>(arg))();
        return nullptr;
      },
      &fn);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
}
constexpr size_t kSmallStack = 256 << 10;

TEST(Value, DeepTreeFreesWithoutRecursion) {
  g_values_freed = 0;
  constexpr size_t kDepth = 1000000;
  ValuePtr root = counted(Value::list());
  Value* cur = root.get();
  std::weak_ptr<Value> deepest;
  for (size_t i = 0; i < kDepth; ++i) {
    auto next = counted(Value::list());
    cur->items().push_back(next);
    cur = next.get();
    if (i + 1 == kDepth) deepest = next;
  }
  std::weak_ptr<Value> top = root;
  // A recursive destructor would overflow this stack (one frame per level).
  run_on_small_stack(kSmallStack, [&] { root.reset(); });
  EXPECT_TRUE(top.expired());
  EXPECT_TRUE(deepest.expired());
  EXPECT_EQ(g_values_freed.load(), kDepth + 1);  // every node, not just the root
}
}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST(Value, DeepTreesPrintWithoutRecursingPastABound) {
  // 300,000 nested 1-tuples (a 300 KB pickle makes them): repr and path_component print the
  // outer levels and "..." below, at any max_len; they used to overflow the stack.
  ValuePtr root = Value::none();
  for (int i = 0; i < 300000; ++i) root = Value::tuple({root});
  std::string short_text, long_text, key;
  run_on_small_stack(8 << 20, [&] {
    short_text = root->repr(40);
    long_text = root->repr(1 << 20);
    key = path_component(*root);
  });
  EXPECT_EQ(short_text, std::string(37, '(') + "...");
  EXPECT_EQ(long_text.substr(0, 1001), std::string(1001, '('));
  EXPECT_NE(long_text.find("(...,),),"), std::string::npos) << long_text.substr(990, 40);
  EXPECT_EQ(key.substr(0, 1001), std::string(1001, '('));
  // Objects whose state is keyed by a tuple holding the next object, 100,000 deep: repr and
  // path_component call each other, and the depth runs on through both.
  ValuePtr obj = Value::none();
  for (int i = 0; i < 100000; ++i) {
    ValuePtr state = Value::dict();
    state->set(Value::tuple({obj}), Value::integer(i));
    obj = Value::object("m", "C", {}, state);
  }
  run_on_small_stack(8 << 20, [&] { short_text = obj->repr(1 << 20); });
  EXPECT_EQ(short_text.substr(0, 17), "m.C((m.C((m.C((m.") << short_text.substr(0, 40);
}

TEST(Value, SharedChildOutlivesOneParent) {
  // A subtree reachable from two parents (a pickle memo hit) survives the first parent's death.
  ValuePtr leaf = Value::string("shared");
  ValuePtr inner = Value::list({leaf, Value::integer(7)});
  ValuePtr a = Value::dict(), b = Value::tuple({inner});
  a->set("x", inner);
  a->set_state(Value::list({Value::list({Value::tuple({inner})})}));
  leaf.reset();
  a.reset();
  ASSERT_EQ(b->items().size(), 1u);
  ASSERT_EQ(b->items()[0]->items().size(), 2u);
  EXPECT_EQ(b->items()[0]->items()[0]->str(), "shared");
  EXPECT_EQ(b->items()[0]->items()[1]->as_int(), 7);
  b.reset();
  EXPECT_EQ(inner.use_count(), 1);
  EXPECT_EQ(inner->items().size(), 2u);  // `inner` is still ours: nobody emptied it
}

TEST(Value, WideAndDeepTreesFree) {
  // A flat state dict (leaves only), and chains through dict values, object state and items.
  g_values_freed = 0;
  constexpr size_t kWide = 100000, kDeep = 300000;
  ValuePtr flat = counted(Value::ordered_dict());
  std::weak_ptr<Value> first_leaf, last_leaf;
  for (size_t i = 0; i < kWide; ++i) {
    ValuePtr key = counted(Value::string("layer." + std::to_string(i) + ".weight"));
    ValuePtr leaf = counted(Value::tensor(i));
    if (i == 0) first_leaf = leaf;
    if (i + 1 == kWide) last_leaf = leaf;
    flat->entries().emplace_back(std::move(key), std::move(leaf));
  }
  run_on_small_stack(kSmallStack, [&] { flat.reset(); });
  EXPECT_TRUE(first_leaf.expired());
  EXPECT_TRUE(last_leaf.expired());
  EXPECT_EQ(g_values_freed.load(), 2 * kWide + 1);

  g_values_freed = 0;
  size_t made = 1;
  ValuePtr root = counted(Value::dict());
  Value* cur = root.get();
  std::weak_ptr<Value> deepest;
  for (size_t i = 0; i < kDeep; ++i) {
    ValuePtr next = counted(i % 3 == 0   ? Value::dict()
                            : i % 3 == 1 ? Value::object("", "")
                                         : Value::list());
    ++made;
    if (cur->kind() == Value::Kind::kDict) {
      ValuePtr key = counted(Value::integer(static_cast<int64_t>(i)));
      ++made;
      cur->entries().emplace_back(std::move(key), next);
    } else if (cur->kind() == Value::Kind::kObject) {
      cur->set_state(next);
    } else {
      cur->items().push_back(next);
    }
    cur = next.get();
    if (i + 1 == kDeep) deepest = next;
  }
  run_on_small_stack(kSmallStack, [&] { root.reset(); });
  EXPECT_TRUE(deepest.expired());
  EXPECT_EQ(g_values_freed.load(), made);
}

TEST(NameIndex, InsertFindAndDuplicates) {
  std::vector<std::string> names;
  for (int i = 0; i < 50000; ++i) names.push_back("archive/data/" + std::to_string(i));
  names.push_back("");
  names.push_back("a");
  names.push_back(std::string("nul\0inside", 10));
  auto name_of = [&](size_t i) -> const std::string& { return names[i]; };
  internal::NameIndex idx;
  EXPECT_FALSE(idx.find("x", name_of));  // empty before reset
  idx.reset(names.size() + 1);
  for (size_t i = 0; i < names.size(); ++i) ASSERT_FALSE(idx.insert(names[i], i, name_of)) << i;
  EXPECT_EQ(idx.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) ASSERT_EQ(idx.find(names[i], name_of), i) << i;
  EXPECT_FALSE(idx.find("archive/data/50000", name_of));
  EXPECT_FALSE(idx.find("archive/data/", name_of));
  EXPECT_FALSE(idx.find(std::string("nul\0insidf", 10), name_of));
  // A repeated name keeps its first position and is not added.
  names.push_back("archive/data/123");
  EXPECT_EQ(idx.insert(names.back(), names.size() - 1, name_of), 123u);
  EXPECT_EQ(idx.size(), names.size() - 1);
  EXPECT_EQ(idx.find("archive/data/123", name_of), 123u);
  // reset() empties it.
  idx.reset(4);
  EXPECT_FALSE(idx.find("a", name_of));
  EXPECT_EQ(idx.size(), 0u);
}

TEST(NameIndex, HashDependsOnEveryByte) {
  // Names that differ in one byte anywhere (first word, middle, the overlapping tail) hash apart.
  std::string base = "prefix/some/record/name_17";
  const uint64_t h = internal::name_hash(base);
  for (size_t i = 0; i < base.size(); ++i) {
    std::string s = base;
    s[i] ^= 1;
    EXPECT_NE(internal::name_hash(s), h) << i;
  }
  EXPECT_NE(internal::name_hash(base + '\0'), h);
  EXPECT_EQ(internal::name_hash(std::string(base)), h);
}

}  // namespace
}  // namespace ckpt

namespace ckpt::internal {
namespace {

TEST(Bytes, AlignUpAndRoundUp) {
  static_assert(align_up(0, 64) == 0 && align_up(1, 64) == 64 && align_up(64, 64) == 64);
  static_assert(align_up(65, 64) == 128 && align_up(4097, 4096) == 8192 && align_up(7, 1) == 7);
  static_assert(is_pow2(1) && is_pow2(64) && is_pow2(uint64_t{1} << 63));
  static_assert(!is_pow2(0) && !is_pow2(3) && !is_pow2(96));
  for (uint64_t align : {1, 2, 8, 64, 4096, 1 << 20})
    for (uint64_t v : {0, 1, 7, 63, 64, 65, 4095, 4096, 123456789})
      EXPECT_EQ(align_up(v, align), round_up(v, align)) << v << " " << align;
  EXPECT_EQ(round_up(10, 0), 10u);
  EXPECT_EQ(round_up(10, 3), 12u);  // round_up also takes alignments that are no power of two
}

TEST(Text, Hex) {
  EXPECT_EQ(hex_digit_value('0'), 0);
  EXPECT_EQ(hex_digit_value('9'), 9);
  EXPECT_EQ(hex_digit_value('a'), 10);
  EXPECT_EQ(hex_digit_value('F'), 15);
  EXPECT_EQ(hex_digit_value('g'), -1);
  EXPECT_EQ(hex_digit_value('\0'), -1);
  EXPECT_EQ(hex32(0), "00000000");
  EXPECT_EQ(hex32(0xCBF43926u), "cbf43926");
  const unsigned char raw[] = {0x00, 0x7f, 0x80, 0xff, 0x1a};
  EXPECT_EQ(to_hex(std::span<const unsigned char>(raw)), "007f80ff1a");
  EXPECT_EQ(to_hex(std::as_bytes(std::span<const unsigned char>(raw))), "007f80ff1a");
  EXPECT_EQ(to_hex(std::span<const std::byte>()), "");
  unsigned char out[5];
  ASSERT_TRUE(parse_hex("007F80fF1a", out));
  EXPECT_EQ(std::memcmp(out, raw, 5), 0);
  EXPECT_FALSE(parse_hex("007f80ff1", out));    // too short
  EXPECT_FALSE(parse_hex("007f80ff1a0", out));  // too long
  EXPECT_FALSE(parse_hex("007f80ff1g", out));   // not hex
  EXPECT_FALSE(parse_hex("0x7f80ff1a", out));
}

TEST(Text, Utf8) {
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("plain ascii, longer than eight bytes"));
  EXPECT_TRUE(is_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // 2, 3 and 4 bytes
  EXPECT_TRUE(is_utf8("\xF4\x8F\xBF\xBF"));                           // U+10FFFF
  for (std::string_view bad : {
           std::string_view("\x80"),              // stray continuation byte
           std::string_view("abcdefgh\xC3"),      // truncated after an ASCII run
           std::string_view("\xE2\x82"),          // truncated
           std::string_view("\xC3\x28"),          // bad continuation
           std::string_view("\xC0\xAF"),          // overlong '/'
           std::string_view("\xE0\x80\xAF"),      // overlong
           std::string_view("\xF0\x80\x80\xAF"),  // overlong
           std::string_view("\xF4\x90\x80\x80"),  // above U+10FFFF
           std::string_view("\xF8\x88\x80\x80\x80"),
           std::string_view("\xFF"),
       }) {
    EXPECT_FALSE(is_utf8(bad)) << to_hex(as_bytes(bad));
    EXPECT_FALSE(is_utf8(bad, Surrogates::kAllow)) << to_hex(as_bytes(bad));
  }
  // An encoded surrogate (U+D800): strict UTF-8 refuses it, CPython's 'surrogatepass' does not.
  EXPECT_FALSE(is_utf8("x\xED\xA0\x80"));
  EXPECT_TRUE(is_utf8("x\xED\xA0\x80", Surrogates::kAllow));
  EXPECT_TRUE(is_utf8("\xED\x9F\xBF"));  // U+D7FF, just below
  uint32_t cp = 0;
  EXPECT_EQ(utf8_decode("\xF0\x9F\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(utf8_decode("a\xC3\xA9", 1, cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(utf8_decode("\xED\xA0\x80", 0, cp), 0u);
  EXPECT_EQ(utf8_decode("\xED\xA0\x80", 0, cp, Surrogates::kAllow), 3u);
  EXPECT_EQ(cp, 0xD800u);
  std::string enc;
  for (uint32_t c : {0x41u, 0xE9u, 0x20ACu, 0x1F600u, 0x10FFFFu}) append_utf8(enc, c);
  EXPECT_EQ(enc, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF");
  EXPECT_TRUE(is_utf8(enc));
}

}  // namespace
}  // namespace ckpt::internal

namespace ckpt {
namespace {

TEST(Value, CloneIsDeepAndKeepsSharing) {
  auto shared = Value::list({Value::integer(1)});
  auto root = Value::ordered_dict();
  root->set("a", shared);
  root->set("b", shared);
  root->set_state(Value::dict());
  ConstValuePtr frozen = root;
  ValuePtr copy = frozen->clone();
  ASSERT_TRUE(copy && copy->is_dict());
  EXPECT_EQ(copy->name(), "OrderedDict");
  EXPECT_NE(copy.get(), root.get());
  EXPECT_NE(copy->get("a").get(), shared.get());          // deep
  EXPECT_EQ(copy->get("a").get(), copy->get("b").get());  // sharing kept
  copy->get("a")->items().push_back(Value::integer(2));
  EXPECT_EQ(shared->items().size(), 1u);  // the original is untouched
  ASSERT_TRUE(copy->state());
  // Depth is bounded, not recursed: a chain past the limit is refused.
  ValuePtr chain = Value::list();
  for (int i = 0; i < 50; ++i) chain = Value::list({chain});
  EXPECT_EQ(test::capture_error([&] { chain->clone(10); }).code(), ErrorCode::kLimitExceeded);
  EXPECT_TRUE(chain->clone(100));
}

TEST(Value, FactoriesSetWhatAccessorsRead) {
  EXPECT_EQ(Value::big_integer("123456789012345678901234567890")->str(),
            "123456789012345678901234567890");
  EXPECT_TRUE(Value::big_integer("1")->is_big_int());
  EXPECT_FALSE(Value::integer(5)->is_big_int());
  EXPECT_TRUE(Value::bytes("x", true)->is_bytearray());
  EXPECT_EQ(Value::set({Value::none()})->kind(), Value::Kind::kSet);
  EXPECT_EQ(Value::object("m", "C", {}, nullptr, 7)->as_int(), 7);
  auto t = Value::tensor(3);
  t->set_tensor_index(4);
  EXPECT_EQ(t->tensor_index(), 4u);
  EXPECT_EQ(Value::dict_of("collections", "OrderedDict")->repr(), "OrderedDict(0 items)");
}

}  // namespace
}  // namespace ckpt
