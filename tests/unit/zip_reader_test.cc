// ZipReader: round trips, computed offsets and read counts, real files from torch 1.13 and
// Python's zipfile, and one test per validation rule on hostile input.

#include "zip/zip_reader.h"

#include <gtest/gtest.h>
#include <libdeflate.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "test_util.h"
#include "util/crc32.h"
#include "zip_test_util.h"

namespace ckpt::test {
namespace {

using internal::ZipReader;
using internal::ZipWriter;

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) & 0xFF);
  return s;
}

std::vector<std::byte> three_records(uint32_t alignment = 64) {
  return build_zip(
      [](ZipWriter& w) {
        w.add("data.pkl", pattern(300, 1));
        w.add("data/0", std::string_view(""));
        w.add_deflated("code/x.py", as_span(std::string(5000, 'z')));
        w.add("data/1", pattern(70000, 2));
      },
      "archive/", alignment);
}

ZipReader open(std::vector<std::byte> bytes, Limits limits = {}) {
  return ZipReader(memory_source(std::move(bytes), "test.zip"), limits);
}

TEST(ZipReader, RoundTripWithComputedOffsets) {
  for (uint32_t alignment : {64u, 4096u}) {
    auto src = faulty_source(three_records(alignment), {}, "rt.zip");  // no memory(): copies
    ZipReader r(src, Limits{});
    EXPECT_EQ(src->stats().reads.load(), 1u);
    ASSERT_EQ(r.entries().size(), 4u);
    EXPECT_EQ(r.prefix(), "archive/");
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(r.offset_is_computed(i)) << alignment << " " << i;
      EXPECT_EQ(r.entries()[i].data_offset, r.data_offset(i));
    }
    EXPECT_EQ(r.data_offset(0) % alignment, 0u);
    EXPECT_EQ(r.data_offset(3) % alignment, 0u);
    EXPECT_EQ(src->stats().reads.load(), 1u);  // data_offset() needed no I/O

    EXPECT_EQ(r.read_checked(0, true).str(), pattern(300, 1));
    EXPECT_EQ(r.read(1, true).size(), 0u);
    EXPECT_EQ(r.read(2, true).str(), std::string(5000, 'z'));
    EXPECT_EQ(r.read(3, true).str(), pattern(70000, 2));
    EXPECT_EQ(r.entries()[2].method, 8);

    ASSERT_TRUE(r.find("archive/data/1"));
    EXPECT_EQ(*r.find("archive/data/1"), 3u);
    EXPECT_FALSE(r.find("data/1"));
    EXPECT_FALSE(r.find("archive/data/2"));
  }
}

TEST(ZipReader, StoredReadIsAViewForMemorySources) {
  auto bytes = three_records();
  auto src = memory_source(bytes);
  ZipReader r(src, Limits{});
  Bytes b = r.read(3);
  EXPECT_EQ(b.begin(), src->memory() + r.data_offset(3));
  Bytes c = r.read_checked(0);
  EXPECT_EQ(c.begin(), src->memory() + r.data_offset(0));
}

TEST(ZipReader, LargeDirectoryOpensInTwoReads) {
  // ~5000 * 70 bytes of directory: more than the tail read covers.
  auto bytes = build_zip([](ZipWriter& w) {
    for (int i = 0; i < 5000; ++i) w.add("data/storage_number_" + std::to_string(i), "x");
  });
  auto src = faulty_source(bytes, {});
  ZipReader r(src, Limits{});
  EXPECT_EQ(src->stats().reads.load(), 2u);
  ASSERT_EQ(r.entries().size(), 5000u);
  for (size_t i = 0; i < 5000; ++i) ASSERT_TRUE(r.offset_is_computed(i)) << i;
  EXPECT_EQ(r.read(4999).str(), "x");
}

TEST(ZipReader, NamesOutliveTheSourcePointerAndMoves) {
  // Entry names are views into the directory bytes the reader holds: a copy (pread source, the
  // directory read on its own) or the mapping (memory source).
  auto bytes = build_zip([](ZipWriter& w) {
    for (int i = 0; i < 5000; ++i) w.add("data/storage_number_" + std::to_string(i), "x");
  });
  for (bool mapped : {false, true}) {
    SourcePtr src = mapped ? memory_source(bytes) : faulty_source(bytes, {});
    std::optional<ZipReader> r1(ZipReader(src, Limits{}));
    src.reset();
    ZipReader r2 = std::move(*r1);
    r1.reset();
    ASSERT_EQ(r2.entries().size(), 5000u);
    for (int i : {0, 1234, 4999}) {
      const std::string name = "archive/data/storage_number_" + std::to_string(i);
      EXPECT_EQ(r2.entries()[i].name, name);
      EXPECT_EQ(r2.find(name), size_t(i));
      EXPECT_EQ(r2.read(i).str(), "x");
    }
  }
}

TEST(ZipReader, FindWithHint) {
  ZipReader r = open(three_records());
  for (size_t hint : {size_t{0}, size_t{2}, size_t{3}, size_t{4}, SIZE_MAX}) {
    SCOPED_TRACE(hint);
    EXPECT_EQ(r.find("archive/data/1", hint), 3u);
    EXPECT_EQ(r.find("archive/data.pkl", hint), 0u);
    EXPECT_FALSE(r.find("archive/data/2", hint));
    EXPECT_FALSE(r.find("", hint));
  }
}

TEST(ZipFormat, NameProblems) {
  using internal::zipfmt::name_problem;
  // Short names take a byte loop, names of 8 bytes and more a word loop whose last word overlaps.
  for (std::string ok :
       {"a", "a.b", "...", "..a", "a..", "x/.../y", "archive/data/0", "archive/.data/version",
        "a/..b/c", "a/b../c", "12345678", "1234567..", "archive/x/...", ".hidden/..x", "ab:c"}) {
    EXPECT_EQ(name_problem(ok), nullptr) << ok;
  }
  const std::string nul = "nul";
  for (size_t len : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 30u}) {
    for (size_t at = 0; at < len; ++at) {
      std::string s(len, 'a');
      s[at] = '\0';
      EXPECT_STREQ(name_problem(s), "name contains a NUL byte") << len << " " << at;
    }
  }
  for (std::string dotdot : {"..", "../a", "a/..", "a/../b", "a\\..\\b", "archive/data/..",
                             "archive/../data/0", "../archive/data/0", "archive/data/0/../.."}) {
    EXPECT_STREQ(name_problem(dotdot), "name has a '..' component") << dotdot;
  }
  EXPECT_STREQ(name_problem(""), "empty name");
  EXPECT_STREQ(name_problem("/archive/data/0"), "absolute name");
  EXPECT_STREQ(name_problem("\\x"), "absolute name");
  EXPECT_STREQ(name_problem("C:archive/data"), "absolute name (drive letter)");
  EXPECT_STREQ(name_problem("z:"), "absolute name (drive letter)");
  // The first problem in this order wins: NUL, absolute, drive letter, "..".
  EXPECT_STREQ(name_problem(std::string("/../\0", 5)), "name contains a NUL byte");
  EXPECT_STREQ(name_problem("/../archive/data"), "absolute name");
}

TEST(ZipReader, Torch113File) {
  auto src = open_file_source(zip_fixture("torch113_arange.pt"));
  ZipReader r(src, Limits{});
  EXPECT_EQ(src->stats().reads.load(), 1u);
  EXPECT_EQ(r.prefix(), "torch113_arange/");
  const char* names[] = {"data.pkl", "data/0", "data/1", "version"};
  ASSERT_EQ(r.entries().size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.entries()[i].name, r.prefix() + names[i]);
    EXPECT_TRUE(r.offset_is_computed(i)) << i;
    EXPECT_EQ(r.data_offset(i) % 64, 0u);
  }
  EXPECT_EQ(r.entries()[2].size, 0u);
  EXPECT_EQ(r.entries()[2].flags, 0x0800);
  Bytes pkl = r.read_checked(0, true);
  EXPECT_EQ(pkl.size(), r.entries()[0].size);
  EXPECT_EQ(static_cast<uint8_t>(pkl.data[0]), 0x80);  // pickle PROTO
  Bytes storage = r.read(1, true);
  ASSERT_EQ(storage.size(), 16u);
  float f[4];
  std::memcpy(f, storage.begin(), 16);
  EXPECT_EQ(f[0], 0.f);
  EXPECT_EQ(f[3], 3.f);
  EXPECT_EQ(r.read(3, true).str(), "3\n");
  // The whole file fits in the tail read at open: records are served from it, and no local
  // header is ever read.
  EXPECT_EQ(src->stats().reads.load(), 1u);
}

TEST(ZipReader, PythonZipfileDeflatedFallsBackToLocalHeaders) {
  // zipfile.ZipFile(..., 'w') to a file: no FB extra, no descriptors, one deflated entry.
  auto src = open_file_source(zip_fixture("pyzip_deflated.zip"));
  ZipReader r(src, Limits{});
  EXPECT_EQ(src->stats().reads.load(), 1u);
  EXPECT_EQ(r.prefix(), "pkg/");
  ASSERT_EQ(r.entries().size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(r.offset_is_computed(i)) << i;
  std::string text;
  for (int i = 0; i < 20; ++i) text += "hello hello hello hello hello hello ";
  std::string raw;
  for (int i = 0; i < 100; ++i) raw += static_cast<char>(i);
  EXPECT_EQ(r.entries()[0].method, 8);
  EXPECT_EQ(r.read(0, true).str(), text);
  EXPECT_EQ(src->stats().reads.load(), 3u);  // local header + compressed data
  EXPECT_EQ(r.read_checked(1, true).str(), raw);
  EXPECT_EQ(r.read(2, true).size(), 0u);
  const uint64_t reads = src->stats().reads.load();
  EXPECT_EQ(r.data_offset(0), 30u + 12u);  // cached: no read
  EXPECT_EQ(src->stats().reads.load(), reads);
}

TEST(ZipReader, PythonZipfileStreamWithDescriptors) {
  // zipfile to an unseekable stream: flag bit 3 and 16-byte descriptors, no FB extra.
  ZipReader r(open_file_source(zip_fixture("pyzip_stream.zip")), Limits{});
  ASSERT_EQ(r.entries().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(r.offset_is_computed(i));
    EXPECT_TRUE(r.entries()[i].flags & 8);
  }
  std::string a;
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 64; ++i) a += static_cast<char>(i);
  std::string b;
  for (int i = 0; i < 90; ++i) b += "abc";
  EXPECT_EQ(r.read(0, true).str(), a);
  EXPECT_EQ(r.read(1, true).str(), b);
}

TEST(ZipReader, ConcurrentFallbackReads) {
  ZipReader r(open_file_source(zip_fixture("pyzip_deflated.zip")), Limits{});
  std::vector<std::thread> threads;
  std::vector<uint64_t> got(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { got[t] = r.data_offset(1) + r.read(0).size(); });
  for (auto& t : threads) t.join();
  for (int t = 1; t < 8; ++t) EXPECT_EQ(got[t], got[0]);
}

TEST(ZipReader, PrefixEmptyWhenEntriesDisagree) {
  auto b = build_zip(
      [](ZipWriter& w) {
        w.add("a/x", "1");
        w.add("b/y", "2");
      },
      "");
  EXPECT_EQ(open(b).prefix(), "");
  auto c = build_zip([](ZipWriter& w) { w.add("flat", "1"); }, "");
  EXPECT_EQ(open(c).prefix(), "");
}

TEST(ZipReader, ZeroCrcIsNotChecked) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[0] + 16, 0);  // torch with compute_crc32=False
  ZipReader r = open(b);
  EXPECT_EQ(r.read(0, true).str(), pattern(300, 1));
}

// --- Hostile input: one test per rule ---------------------------------------------------------

TEST(ZipReaderHostile, TooSmall) {
  EXPECT_CKPT_ERROR(open(to_bytes("PK\x05\x06")), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, TruncatedTail) {
  // A zip cut anywhere is truncated (the local headers say it started as a zip), not corrupt.
  auto full = three_records();
  for (size_t n : {full.size() - 10, full.size() - 1, size_t{40}, size_t{3}, size_t{0}}) {
    std::vector<std::byte> b(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
    Error e = capture_error([&] { open(b); });
    EXPECT_EQ(e.code(), ErrorCode::kTruncated) << n << ": " << e.what();
    EXPECT_EQ(e.source(), "test.zip");
  }
}

TEST(ZipReaderHostile, DamagedEndRecordIsCorrupt) {
  // Every byte there, but the end record's signature is damaged: not a cut.
  auto b = three_records();
  put_at<uint32_t>(b, b.size() - 22, 0x12345678);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, NoEndRecord) {
  EXPECT_CKPT_ERROR(open(to_bytes(std::string(5000, 'x'))), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, EndRecordCommentPastTheEnd) {
  auto b = three_records();
  put_at<uint16_t>(b, b.size() - 2, 5);  // comment of 5 bytes that are not there: cut
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kTruncated);
}

TEST(ZipReaderHostile, Zip64LocatorOutOfRange) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint64_t>(b, l.locator + 8, b.size());
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, Zip64EndRecordBadSignature) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.zip64_end, 0x12345678);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, MultiDisk) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.zip64_end + 16, 1);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kUnsupported);
}

TEST(ZipReaderHostile, CentralDirectoryOutOfRange) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint64_t>(b, l.zip64_end + 48, l.cd_offset + 100);
  Error e = capture_error([&] { open(b); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(e.offset().has_value());
  put_at<uint64_t>(b, l.zip64_end + 48, UINT64_MAX - 5);  // overflows offset + size
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, CountLargerThanDirectory) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint64_t>(b, l.zip64_end + 24, 1000);
  put_at<uint64_t>(b, l.zip64_end + 32, 1000);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
  put_at<uint64_t>(b, l.zip64_end + 24, uint64_t{1} << 60);
  put_at<uint64_t>(b, l.zip64_end + 32, uint64_t{1} << 60);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kLimitExceeded);
}

TEST(ZipReaderHostile, CountOverMaxRecords) {
  Limits limits;
  limits.max_records = 3;
  EXPECT_CKPT_ERROR(open(three_records(), limits), ErrorCode::kLimitExceeded);
  limits.max_records = 4;
  EXPECT_EQ(open(three_records(), limits).entries().size(), 4u);
}

TEST(ZipReaderHostile, DirectoryOverMetadataLimit) {
  Limits limits;
  limits.max_metadata_bytes = 100;
  EXPECT_CKPT_ERROR(open(three_records(), limits), ErrorCode::kLimitExceeded);
}

TEST(ZipReaderHostile, BadCentralSignature) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[1], 0);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, CentralEntryPassesTheDirectory) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint16_t>(b, l.central[3] + 32, 2000);  // comment past the directory's end
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kTruncated);
}

TEST(ZipReaderHostile, EntryDataPassesDirectory) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[3] + 20, 1000000);
  put_at<uint32_t>(b, l.central[3] + 24, 1000000);
  Error e = capture_error([&] { open(b); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data/1");
}

TEST(ZipReaderHostile, HeaderOffsetPastTheFile) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[0] + 42, 0xFFFFFFF0);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, OverlappingEntries) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  // data/0 (empty) claims to start inside data.pkl's data.
  put_at<uint32_t>(b, l.central[1] + 42, static_cast<uint32_t>(l.local[0] + 100));
  Error e = capture_error([&] { open(b); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data.pkl");
  // Two entries at the same offset.
  auto c = three_records();
  put_at<uint32_t>(c, l.central[2] + 42, static_cast<uint32_t>(l.local[1]));
  EXPECT_CKPT_ERROR(open(c), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, DuplicateNames) {
  auto b = build_zip([](ZipWriter& w) {
    w.add("data/0", "a");
    w.add("data/1", "b");
  });
  ZipLayout l = zip_layout(b);
  b[l.central[1] + 46 + std::string("archive/data/").size()] = std::byte{'0'};
  Error e = capture_error([&] { open(b); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data/0");
}

TEST(ZipReaderHostile, DotDotNames) {
  for (std::string bad : {"archive/../x", "../archive/x", "archive/x/..", "archiv\\..\\xx"}) {
    auto b = build_zip([](ZipWriter& w) { w.add("abcd", "a"); });
    ZipLayout l = zip_layout(b);
    ASSERT_EQ(bad.size(), 12u);
    std::memcpy(b.data() + l.central[0] + 46, bad.data(), bad.size());
    SCOPED_TRACE(bad);
    EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
  }
}

TEST(ZipReaderHostile, AbsoluteNames) {
  for (std::string bad : {"/archive/abc", "\\archive\\abc", "C:archive/ab"}) {
    auto b = build_zip([](ZipWriter& w) { w.add("abcd", "a"); });
    ZipLayout l = zip_layout(b);
    ASSERT_EQ(bad.size(), 12u);
    std::memcpy(b.data() + l.central[0] + 46, bad.data(), bad.size());
    SCOPED_TRACE(bad);
    EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
  }
}

TEST(ZipReaderHostile, SaturatedFieldWithoutZip64Extra) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[0] + 24, 0xFFFFFFFF);
  EXPECT_CKPT_ERROR(open(b), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, DeflateBombDeclaredSize) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[2] + 24, 0xFFFFFFF0);  // claims ~4 GiB inflated
  Limits limits;
  limits.max_inflated_bytes = 1 << 20;
  ZipReader r = open(b, limits);
  Error e = capture_error([&] { r.read(2); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_EQ(e.record(), "archive/code/x.py");
}

TEST(ZipReaderHostile, DeflateBombRealStream) {
  // 64 MiB of zeros deflate to a few KiB.
  std::vector<std::byte> zeros(64 << 20);
  auto b = build_zip([&](ZipWriter& w) { w.add_deflated("bomb", zeros); });
  Limits limits;
  limits.max_inflated_bytes = 1 << 20;
  ZipReader r = open(b, limits);
  EXPECT_LT(r.entries()[0].compressed_size, 1u << 20);
  EXPECT_CKPT_ERROR(r.read(0), ErrorCode::kLimitExceeded);
  EXPECT_EQ(open(b).read(0, true).size(), zeros.size());
}

TEST(ZipReaderHostile, MaxSizeCap) {
  ZipReader r = open(three_records());
  EXPECT_CKPT_ERROR(r.read(3, false, 1000), ErrorCode::kLimitExceeded);
  EXPECT_CKPT_ERROR(r.read_checked(0, false, 299), ErrorCode::kLimitExceeded);
  EXPECT_CKPT_ERROR(r.read(2, false, 4999), ErrorCode::kLimitExceeded);
  EXPECT_EQ(r.read(0, false, 300).size(), 300u);
}

TEST(ZipReaderHostile, CorruptDeflateStream) {
  auto b = three_records();
  ZipReader good = open(b);
  const uint64_t off = good.data_offset(2);
  const uint64_t n = good.entries()[2].compressed_size;
  for (uint64_t i = 0; i < n; ++i) b[off + i] = std::byte{0xFF};  // reserved block type
  EXPECT_CKPT_ERROR(open(b).read(2), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, DeflateSizeDisagreesWithDirectory) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[2] + 24, 4999);  // inflates to more than declared
  EXPECT_CKPT_ERROR(open(b).read(2), ErrorCode::kCorrupt);
  put_at<uint32_t>(b, l.central[2] + 24, 5001);  // inflates to less
  EXPECT_CKPT_ERROR(open(b).read(2), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, CrcMismatchWithVerify) {
  auto b = three_records();
  const uint64_t off = open(b).data_offset(0);
  b[off + 7] ^= std::byte{1};
  ZipReader r = open(b);
  EXPECT_EQ(r.read(0).size(), 300u);  // not verified: returned as is
  Error e = capture_error([&] { r.read(0, true); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data.pkl");
  EXPECT_NE(e.message().find("CRC32 mismatch"), std::string::npos);
  EXPECT_CKPT_ERROR(r.read_checked(0, true), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, CrcMismatchDeflated) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[2] + 16, 0x1234);
  EXPECT_CKPT_ERROR(open(b).read(2, true), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, ReadCheckedLocalExtraDisagrees) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint16_t>(b, l.local[0] + 28, get_at<uint16_t>(b, l.local[0] + 28) - 1);
  ZipReader r = open(b);
  ASSERT_TRUE(r.offset_is_computed(0));
  Error e = capture_error([&] { r.read_checked(0); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(e.record(), "archive/data.pkl");
  EXPECT_EQ(r.read(0).size(), 300u);  // the unchecked path trusts the directory
}

TEST(ZipReaderHostile, ReadCheckedLocalSignature) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.local[3], 0);
  EXPECT_CKPT_ERROR(open(b).read_checked(3), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, ReadCheckedLocalName) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  b[l.local[0] + 30 + 2] = std::byte{'X'};
  EXPECT_CKPT_ERROR(open(b).read_checked(0), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, FallbackLocalHeaderSignature) {
  auto b = read_file(zip_fixture("pyzip_deflated.zip"));
  put_at<uint32_t>(b, 57, 0);  // pkg/raw.bin
  ZipReader r = open(b);
  EXPECT_CKPT_ERROR(r.data_offset(1), ErrorCode::kCorrupt);
  EXPECT_CKPT_ERROR(r.read(1), ErrorCode::kCorrupt);
  EXPECT_EQ(r.read(0, true).size(), 720u);
}

TEST(ZipReaderHostile, FallbackLocalExtraPastNextEntry) {
  auto b = read_file(zip_fixture("pyzip_deflated.zip"));
  put_at<uint16_t>(b, 57 + 28, 500);
  EXPECT_CKPT_ERROR(open(b).read(1), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, UnsupportedMethodAtReadOnly) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint16_t>(b, l.central[0] + 10, 12);  // bzip2
  ZipReader r = open(b);
  EXPECT_CKPT_ERROR(r.read(0), ErrorCode::kUnsupported);
  EXPECT_CKPT_ERROR(r.read_checked(0), ErrorCode::kUnsupported);
  EXPECT_EQ(r.read(3).size(), 70000u);
}

TEST(ZipReaderHostile, EncryptedEntry) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint16_t>(b, l.central[3] + 8, 0x0809);
  EXPECT_CKPT_ERROR(open(b).read(3), ErrorCode::kUnsupported);
}

TEST(ZipReaderHostile, StoredSizesDisagree) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[0] + 24, 299);
  EXPECT_CKPT_ERROR(open(b).read(0), ErrorCode::kCorrupt);
}

TEST(ZipReaderHostile, ReadFailurePropagates) {
  EXPECT_CKPT_ERROR(ZipReader(faulty_source(three_records(), {.fail_on_read = 1}), Limits{}),
                    ErrorCode::kIo);
  // data.pkl lies before the tail read at open (a 1 MiB record follows it), so reading it
  // is the source's second read.
  auto bytes = build_zip(
      [](ZipWriter& w) {
        w.add("data.pkl", pattern(300, 1));
        w.add("data/0", pattern(1 << 20, 2));
      },
      "archive/", 64);
  ZipReader r(faulty_source(bytes, {.fail_on_read = 2}), Limits{});
  Error e = capture_error([&] { r.read(0); });
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_EQ(e.record(), "archive/data.pkl");
}

TEST(ZipReaderHostile, IndexOutOfRange) {
  ZipReader r = open(three_records());
  EXPECT_CKPT_ERROR(r.read(4), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(r.data_offset(4), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(r.offset_is_computed(4));
}

TEST(ZipReader, TorchDataOffsetFormula) {
  // docs/formats/torch.md "torch.save zip", **Zip layout** example: "archive/data.pkl" at 0 -> data
  // at 64.
  EXPECT_EQ(internal::torch_data_offset(0, 16, 100, 64), 64u);
  EXPECT_EQ(internal::torch_data_offset(0, 16, 100, 1), 50u);
  // zip64: +4 extra header, +16 for a huge size, +8 for a huge offset.
  EXPECT_EQ(internal::torch_data_offset(0, 16, 0xFFFFFFFF, 1), 50u + 4 + 16);
  EXPECT_EQ(internal::torch_data_offset(0xFFFFFFFF, 16, 1, 1), 0xFFFFFFFFull + 50 + 4 + 8);
  EXPECT_EQ(internal::torch_data_offset(0xFFFFFFFF, 16, 0xFFFFFFFF, 1),
            0xFFFFFFFFull + 50 + 4 + 24);
}

// A deflated entry of several MiB: inflated into a caller's buffer and streamed in bounded
// pieces, the CRC checked on the way (a whole inflate held the compressed and inflated bytes).
TEST(ZipReaderStream, ReadIntoAndStreamMatchRead) {
  const std::string big = pattern(5u << 20, 3);
  auto b = build_zip([&](ZipWriter& w) { w.add_deflated("big", as_span(big)); });
  ZipReader r = open(b);
  std::vector<std::byte> dst(big.size());
  r.read_into(0, dst, true);
  EXPECT_EQ(std::memcmp(dst.data(), big.data(), big.size()), 0);
  size_t pieces = 0, total = 0, largest = 0;
  r.stream(0, true, [&](std::span<const std::byte> p) {
    EXPECT_EQ(std::memcmp(p.data(), big.data() + total, p.size()), 0);
    total += p.size();
    largest = std::max(largest, p.size());
    ++pieces;
  });
  EXPECT_EQ(total, big.size());
  EXPECT_GT(pieces, 1u);
  EXPECT_LE(largest, size_t{1} << 20);
  std::vector<std::byte> wrong(big.size() - 1);
  EXPECT_CKPT_ERROR(r.read_into(0, wrong, false), ErrorCode::kCorrupt);
}

TEST(ZipReaderStream, CrcMismatchFoundWhileStreaming) {
  auto b = three_records();
  ZipLayout l = zip_layout(b);
  put_at<uint32_t>(b, l.central[2] + 16, 0x12345678);  // code/x.py's CRC
  ZipReader r = open(b);
  EXPECT_CKPT_ERROR(r.stream(2, true, [](std::span<const std::byte>) {}), ErrorCode::kCorrupt);
  std::vector<std::byte> dst(5000);
  EXPECT_CKPT_ERROR(r.read_into(2, dst, true), ErrorCode::kCorrupt);
  r.read_into(2, dst, false);  // without verify the bytes are read
  EXPECT_EQ(dst[0], std::byte{'z'});
}

}  // namespace
}  // namespace ckpt::test
