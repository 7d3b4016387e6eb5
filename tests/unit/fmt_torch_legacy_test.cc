// Legacy torch files in every pickle protocol (issue 13, point 1), made by hand so that each
// encoding of the magic number and the protocol-0 text persistent id is exercised exactly; and
// the classes a rewrite must keep (torch.Size, frozenset) through the unpickler and pickler.
// Hostile variants are refused with a typed Error naming the offset or the record.

#include <gtest/gtest.h>

#include <string>

#include "ckpt/ckpt.h"
#include "pickle/pickler.h"
#include "pickle/unpickler.h"
#include "test_util.h"
#include "util/bytes.h"
#include "zip/zip_writer.h"

namespace ckpt {
namespace {

using namespace std::string_literals;

std::string u64le(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::vector<std::byte> torch_zip(const std::string& pkl) {
  MemorySink sink;
  internal::ZipWriter z(sink, "archive/", 64);
  z.add("data.pkl", pkl);
  z.add("version", std::string_view("3\n"));
  z.finish();
  return sink.take();
}

const std::string kMagicLong1 = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"s;

// The magic number's pickle as torch.save writes it with `pickle_protocol=p`.
std::string magic(int p) {
  if (p < 2) return "L119547037146038801333356L\n.";
  std::string body = kMagicLong1 + ".";
  std::string head = "\x80"s + char(p);
  if (p >= 4) head += "\x95" + u64le(body.size());
  return head + body;
}

// A protocol-0 legacy file holding {'w': tensor([1.5, -2.0])} with a text persistent id `pid`.
std::vector<std::byte> protocol0_file(const std::string& pid) {
  std::string proto = "I1001\n.";
  std::string sys = "(dp0\nVlittle_endian\np1\nI01\ns.";
  std::string obj =
      "(dp0\nVw\np1\nctorch._utils\n_rebuild_tensor_v2\np2\n(P" + pid +
      "\nI0\n(I2\ntp3\n(I1\ntp4\nI00\nccollections\nOrderedDict\np5\n(tRp6\ntp7\nRp8\ns.";
  std::string keys = "(lp0\nV0\np1\na.";
  float data[2] = {1.5f, -2.0f};
  std::string bytes(reinterpret_cast<const char*>(data), sizeof data);
  return test::to_bytes(magic(0) + proto + sys + obj + keys + u64le(2) + bytes);
}

const std::string kPid = "('storage', <class 'torch.FloatStorage'>, '0', 'cpu', 2, None)";

TEST(LegacyProtocols, Protocol0TextPersistentIdReads) {
  Checkpoint c = Checkpoint::open(memory_source(protocol0_file(kPid), "p0.pt"));
  EXPECT_EQ(c.format(), Format::kTorchLegacy);
  ASSERT_EQ(c.tensors().size(), 1u);
  Tensor t = c.tensor("w");
  ASSERT_EQ(t.info().shape, (std::vector<int64_t>{2}));
  float v[2];
  std::memcpy(v, t.data(), sizeof v);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], -2.0f);
}

TEST(LegacyProtocols, MagicNumberInEveryProtocolIsDetected) {
  // Each protocol's magic pickle followed by a protocol-2 rest: detection and the magic check
  // only look at the first pickle.
  for (int p = 0; p <= 5; ++p) {
    std::string rest = "\x80\x02M\xe9\x03.\x80\x02}q\x00.\x80\x02}q\x00.\x80\x02]."s;
    auto bytes = test::to_bytes(magic(p) + rest);
    Checkpoint c = Checkpoint::open(memory_source(bytes, "p.pt"));
    EXPECT_EQ(c.format(), Format::kTorchLegacy) << p;
    EXPECT_TRUE(c.tensors().empty());
  }
  // LONG4 instead of LONG1 (no torch version writes it; another pickler may).
  std::string rest = "\x80\x02M\xe9\x03.\x80\x02}q\x00.\x80\x02}q\x00.\x80\x02]."s;
  std::string long4 = "\x80\x02\x8b\x0a\x00\x00\x00"s + kMagicLong1.substr(2) + ".";
  Checkpoint c = Checkpoint::open(memory_source(test::to_bytes(long4 + rest), "l4.pt"));
  EXPECT_EQ(c.format(), Format::kTorchLegacy);
}

TEST(LegacyProtocols, WrongMagicValueIsCorruptCutMagicIsTruncated) {
  for (int p : {0, 2, 4}) {
    std::string m = magic(p);
    // A different number in the same encoding: the last digit / the last LONG1 byte.
    std::string bad = m;
    bad[bad.size() - (p < 2 ? 4 : 2)] ^= 0x01;
    Error e = test::capture_error(
        [&] { Checkpoint::open(memory_source(test::to_bytes(bad + "I1001\n."), "bad.pt")); });
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << p << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
    for (size_t n : {3u, 9u, 14u}) {
      Error cut = test::capture_error(
          [&] { Checkpoint::open(memory_source(test::to_bytes(m.substr(0, n)), "cut.pt")); });
      EXPECT_EQ(cut.code(), ErrorCode::kTruncated) << p << " " << n << ": " << cut.what();
    }
  }
}

TEST(LegacyProtocols, HostileTextPersistentIdsAreRefused) {
  struct Case {
    std::string pid;
    ErrorCode code;
  };
  const Case cases[] = {
      {"('storage', <class 'os.system'>, '0', 'cpu', 2, None)", ErrorCode::kUnsupported},
      {"('storage', <class 'builtins.eval'>, '0', 'cpu', 2, None)", ErrorCode::kUnsupported},
      {"('storage', <class 'torch.FloatStorage'>, '0', 'cpu', 2", ErrorCode::kCorrupt},
      {"('storage', <class 'torch.FloatStorage'>, '0\\x41', 'cpu', 2, None)", ErrorCode::kCorrupt},
      {"('storage', <class 'torch.FloatStorage'>, '0', 'cpu', 2, None) + 1", ErrorCode::kCorrupt},
      {"('storage', __import__('os'), '0', 'cpu', 2, None)", ErrorCode::kCorrupt},
      {"('storage', <class 'torch.FloatStorage'>, '0', 'cpu', 99999999999999999999, None)",
       ErrorCode::kCorrupt},
      {"('storage', <class 'torch.FloatStorage'>, '0', 'cpu', 2, 1, 2, 3, 4, 5)",
       ErrorCode::kCorrupt},
      {"", ErrorCode::kCorrupt},
      {"'storage'", ErrorCode::kCorrupt},
  };
  for (const Case& c : cases) {
    Error e = test::capture_error(
        [&] { Checkpoint::open(memory_source(protocol0_file(c.pid), "hostile.pt")); });
    EXPECT_EQ(e.code(), c.code) << c.pid << ": " << e.what();
  }
}

TEST(LegacyProtocols, HugeTextIntIsUnsupportedWithItsOffset) {
  std::string pkl = "(I1\nL" + std::string(6000, '7') + "L\nt.";
  internal::UnpicklerHooks hooks;
  Error e = test::capture_error([&] { internal::unpickle(internal::as_bytes(pkl), hooks, {}); });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  EXPECT_EQ(e.offset(), std::optional<uint64_t>(4));
  // Just below the bound: read, digits kept.
  std::string ok = "L" + std::string(5000, '7') + "L\n.";
  auto v = internal::unpickle(internal::as_bytes(ok), hooks, {});
  EXPECT_TRUE(v->is_big_int());
  EXPECT_EQ(v->str().size(), 5000u);
}

TEST(RewriteClasses, FrozensetStaysAFrozensetThroughPickler) {
  internal::UnpicklerHooks hooks;
  hooks.allow_global = [](const std::string& m, const std::string& n) {
    return m == "builtins" && (n == "frozenset" || n == "set");
  };
  // FROZENSET opcode (protocol 4), REDUCE of builtins.frozenset (protocol 2), and a plain set.
  auto a = internal::unpickle(internal::as_bytes("\x80\x04(K\x01K\x02\x91."s), hooks, {});
  auto b = internal::unpickle(internal::as_bytes("\x80\x02"
                                                 "c__builtin__\nfrozenset\n]K\x03\x61\x85R."s),
                              hooks, {});
  auto s = internal::unpickle(internal::as_bytes("\x80\x04\x8f(K\x01\x90."s), hooks, {});
  EXPECT_TRUE(a->is_frozenset());
  EXPECT_TRUE(b->is_frozenset());
  EXPECT_FALSE(s->is_frozenset());
  EXPECT_EQ(a->repr(), "frozenset({1, 2})");
  std::string out;
  internal::pickle(a, out);
  auto again = internal::unpickle(internal::as_bytes(out), hooks, {});
  EXPECT_TRUE(again->is_frozenset());
  EXPECT_EQ(again->items().size(), 2u);
  EXPECT_NE(out.find("frozenset"), std::string::npos);
  // clone keeps it
  EXPECT_TRUE(a->clone()->is_frozenset());
}

TEST(RewriteClasses, TorchSizeStaysTorchSize) {
  // torch.save({'s': torch.Size([3, 4])}) in a torch zip, read and written back.
  std::string pkl =
      "\x80\x02}q\x00X\x01\x00\x00\x00sq\x01"
      "ctorch\nSize\nq\x02K\x03K\x04\x86q\x03\x85q\x04Rq\x05s."s;
  MemorySink sink;
  {
    Checkpoint c = Checkpoint::open(memory_source(torch_zip(pkl), "s.pt"));
    auto s = c.root()->get("s");
    ASSERT_TRUE(s);
    ASSERT_EQ(s->kind(), Value::Kind::kObject);
    EXPECT_EQ(s->module(), "torch");
    EXPECT_EQ(s->name(), "Size");
    EXPECT_EQ(s->repr(), "torch.Size([3, 4])");
    convert(c, sink, ConvertOptions{.target = PtTarget{}});
  }
  Checkpoint back = Checkpoint::open(memory_source(sink.take(), "back.pt"));
  EXPECT_EQ(back.root()->get("s")->repr(), "torch.Size([3, 4])");
}

}  // namespace
}  // namespace ckpt
