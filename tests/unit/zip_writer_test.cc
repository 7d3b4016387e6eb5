// ZipWriter: byte-exact torch layout (checked against a file torch 1.13 wrote), alignment,
// streaming, deflate, zip64 past 4 GiB (sparse file), and argument errors.

#include "zip/zip_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "test_util.h"
#include "util/crc32.h"
#include "zip/zip_reader.h"
#include "zip_test_util.h"

namespace ckpt::test {
namespace {

using internal::ZipReader;
using internal::ZipWriter;

// Zeroes the DOS time and date of every local and central header, so that files that differ
// only in timestamps compare equal.
std::vector<std::byte> mask_times(std::vector<std::byte> b) {
  ZipLayout l = zip_layout(b);
  for (uint64_t off : l.local) put_at<uint32_t>(b, off + 10, 0);
  for (uint64_t off : l.central) put_at<uint32_t>(b, off + 12, 0);
  return b;
}

TEST(ZipWriter, ByteIdenticalToTorch113) {
  // torch.save({'a': torch.arange(4.), 'e': torch.zeros(0)}, 'torch113_arange.pt') with
  // Debian's python3-torch 1.13: records data.pkl, data/0, data/1 (empty), version.
  const std::vector<std::byte> torch_file = read_file(zip_fixture("torch113_arange.pt"));
  ASSERT_GT(torch_file.size(), 0u);
  ZipReader r(memory_source(torch_file), Limits{});
  ASSERT_EQ(r.prefix(), "torch113_arange/");
  ASSERT_EQ(r.entries().size(), 4u);

  MemorySink sink;
  ZipWriter w(sink, r.prefix(), 64);
  for (size_t i = 0; i < r.entries().size(); ++i)
    w.add(r.entries()[i].name.substr(r.prefix().size()), r.read(i, /*verify=*/true).data);
  w.finish();
  const std::vector<std::byte> ours = sink.take();

  ASSERT_EQ(ours.size(), torch_file.size());
  EXPECT_TRUE(mask_times(ours) == mask_times(torch_file));
  // torch 1.13 writes time 0 and date 0, and so do we: the files are identical, timestamps too.
  EXPECT_TRUE(ours == torch_file);
  ASSERT_EQ(w.written().size(), 4u);
  EXPECT_EQ(w.written()[0].first, "data.pkl");
  EXPECT_EQ(w.written()[1].second, r.entries()[1].crc32);
}

TEST(ZipWriter, HeaderFieldsForOneRecord) {
  // "archive/data.pkl" at offset 0: start 50 -> data at 64, 14 bytes of padding.
  auto b = build_zip([](ZipWriter& w) {
    w.add("data.pkl", std::string_view("abcd"));
    w.add("data/0", std::string_view(""));
  });
  EXPECT_EQ(get_at<uint32_t>(b, 0), internal::zipfmt::kLocalSig);
  EXPECT_EQ(get_at<uint16_t>(b, 4), 0);       // version needed
  EXPECT_EQ(get_at<uint16_t>(b, 6), 0x0808);  // descriptor + UTF-8
  EXPECT_EQ(get_at<uint16_t>(b, 8), 0);       // stored
  EXPECT_EQ(get_at<uint32_t>(b, 14), 0u);     // crc in the descriptor only
  EXPECT_EQ(get_at<uint32_t>(b, 18), 0u);
  EXPECT_EQ(get_at<uint32_t>(b, 22), 0u);
  EXPECT_EQ(get_at<uint16_t>(b, 26), 16);  // name length
  EXPECT_EQ(get_at<uint16_t>(b, 28), 18);  // FB header + 14 bytes of padding
  EXPECT_EQ(to_string({b.data() + 46, 4}), std::string("FB\x0e\x00", 4));
  EXPECT_EQ(to_string({b.data() + 50, 14}), std::string(14, 'Z'));
  EXPECT_EQ(to_string({b.data() + 64, 4}), "abcd");
  // Descriptor: sig, crc, compressed, uncompressed.
  EXPECT_EQ(get_at<uint32_t>(b, 68), internal::zipfmt::kDescriptorSig);
  EXPECT_EQ(get_at<uint32_t>(b, 72), internal::crc32(as_span("abcd")));
  EXPECT_EQ(get_at<uint32_t>(b, 76), 4u);
  EXPECT_EQ(get_at<uint32_t>(b, 80), 4u);
  // The empty record: flags 0x0800, no descriptor after it.
  EXPECT_EQ(get_at<uint32_t>(b, 84), internal::zipfmt::kLocalSig);
  EXPECT_EQ(get_at<uint16_t>(b, 84 + 6), 0x0800);

  ZipLayout l = zip_layout(b);
  ASSERT_EQ(l.count, 2u);
  const uint64_t c = l.central[0];
  EXPECT_EQ(get_at<uint32_t>(b, c), internal::zipfmt::kCentralSig);
  EXPECT_EQ(get_at<uint16_t>(b, c + 4), 0);  // made by
  EXPECT_EQ(get_at<uint16_t>(b, c + 6), 0);  // needed
  EXPECT_EQ(get_at<uint16_t>(b, c + 8), 0x0808);
  EXPECT_EQ(get_at<uint32_t>(b, c + 16), internal::crc32(as_span("abcd")));
  EXPECT_EQ(get_at<uint32_t>(b, c + 20), 4u);
  EXPECT_EQ(get_at<uint32_t>(b, c + 24), 4u);
  EXPECT_EQ(get_at<uint16_t>(b, c + 30), 0);   // no FB extra in the central copy
  EXPECT_EQ(get_at<uint32_t>(b, c + 38), 0u);  // external attributes
  EXPECT_EQ(get_at<uint32_t>(b, c + 42), 0u);
  EXPECT_EQ(get_at<uint16_t>(b, l.central[1] + 8), 0x0800);
  // zip64 end record, locator, end record.
  EXPECT_EQ(l.zip64_end, l.cd_offset + l.cd_size);
  EXPECT_EQ(get_at<uint64_t>(b, l.zip64_end + 4), 44u);
  EXPECT_EQ(get_at<uint16_t>(b, l.zip64_end + 12), 0x031E);
  EXPECT_EQ(get_at<uint16_t>(b, l.zip64_end + 14), 45);
  EXPECT_EQ(get_at<uint32_t>(b, l.locator + 16), 1u);
  EXPECT_EQ(get_at<uint16_t>(b, l.eocd + 10), 2);
  EXPECT_EQ(get_at<uint32_t>(b, l.eocd + 12), l.cd_size);
  EXPECT_EQ(get_at<uint32_t>(b, l.eocd + 16), l.cd_offset);
}

TEST(ZipWriter, AlignsDataAndPredictsOffsets) {
  for (uint32_t alignment : {1u, 2u, 64u, 4096u, 32768u}) {
    MemorySink sink;
    ZipWriter w(sink, "x/", alignment);
    std::vector<uint64_t> predicted;
    for (int i = 0; i < 20; ++i) {
      std::string name = "data/" + std::to_string(i);
      std::string data(static_cast<size_t>(i * 37), static_cast<char>('a' + i));
      predicted.push_back(w.next_data_offset(name, data.size()));
      w.add(name, data);
    }
    w.finish();
    ZipReader r(memory_source(sink.take()), Limits{});
    for (size_t i = 0; i < predicted.size(); ++i) {
      EXPECT_TRUE(r.offset_is_computed(i)) << alignment << " " << i;
      EXPECT_EQ(r.data_offset(i), predicted[i]);
      EXPECT_EQ(predicted[i] % alignment, 0u);
      EXPECT_EQ(r.read_checked(i, true).size(), i * 37);
    }
  }
}

TEST(ZipWriter, StreamingMatchesWholeRecord) {
  std::string data(1000, 'q');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  auto whole = build_zip([&](ZipWriter& w) { w.add("rec", data); });
  MemorySink sink;
  ZipWriter w(sink, "archive/");
  w.begin("rec", data.size());
  w.write(as_span(std::string_view(data).substr(0, 1)));
  w.write({});
  w.write(as_span(std::string_view(data).substr(1, 600)));
  w.write(as_span(std::string_view(data).substr(601)));
  w.end();
  w.finish();
  EXPECT_TRUE(sink.bytes() == whole);
  EXPECT_EQ(w.written()[0].second, internal::crc32(as_span(data)));
}

TEST(ZipWriter, StreamingSizeMismatch) {
  MemorySink sink;
  ZipWriter w(sink, "a/");
  w.begin("r", 4);
  EXPECT_CKPT_ERROR(w.write(as_span("12345")), ErrorCode::kInvalidArgument);
  w.write(as_span("123"));
  EXPECT_CKPT_ERROR(w.end(), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.add("other", std::string_view("x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.finish(), ErrorCode::kInvalidArgument);
  w.write(as_span("4"));
  w.end();
  EXPECT_CKPT_ERROR(w.end(), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.write(as_span("x")), ErrorCode::kInvalidArgument);
}

TEST(ZipWriter, RejectsDuplicateNames) {
  MemorySink sink;
  ZipWriter w(sink, "a/");
  w.add("data/0", std::string_view("x"));
  EXPECT_CKPT_ERROR(w.add("data/0", std::string_view("y")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.begin("data/0", 0), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.add_deflated("data/0", as_span("yyyyyyyy")), ErrorCode::kInvalidArgument);
}

TEST(ZipWriter, RejectsBadNames) {
  MemorySink sink;
  ZipWriter w(sink, "");
  EXPECT_CKPT_ERROR(w.add("", std::string_view("x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.add("/etc/x", std::string_view("x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.add("a/../b", std::string_view("x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.add(std::string(70000, 'n'), std::string_view("x")),
                    ErrorCode::kInvalidArgument);
}

TEST(ZipWriter, RejectsWritesAfterFinish) {
  MemorySink sink;
  ZipWriter w(sink, "a/");
  w.add("r", std::string_view("x"));
  w.finish();
  EXPECT_CKPT_ERROR(w.add("s", std::string_view("x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.begin("s", 1), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(w.finish(), ErrorCode::kInvalidArgument);
}

TEST(ZipWriter, RejectsBadAlignment) {
  MemorySink sink;
  for (uint32_t a : {0u, 3u, 96u, 65536u, 1u << 20})
    EXPECT_CKPT_ERROR(ZipWriter(sink, "a/", a), ErrorCode::kInvalidArgument);
}

TEST(ZipWriter, EmptyArchive) {
  auto b = build_zip([](ZipWriter&) {});
  EXPECT_EQ(b.size(), 56u + 20u + 22u);
  ZipReader r(memory_source(b), Limits{});
  EXPECT_TRUE(r.entries().empty());
  EXPECT_EQ(r.prefix(), "");
}

TEST(ZipWriter, DeflatedRecords) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "def forward(self, x):\n    return x\n";
  auto b = build_zip([&](ZipWriter& w) {
    w.add_deflated("code/m.py", as_span(text));
    w.add_deflated("tiny", as_span("abc"));  // miniz stores records of <= 3 bytes
    w.add_deflated("level0", as_span(text), 0);
    w.add("data/0", std::string_view("12345678"));
  });
  ZipLayout l = zip_layout(b);
  EXPECT_EQ(get_at<uint16_t>(b, 4), 20);      // local: version needed
  EXPECT_EQ(get_at<uint16_t>(b, 6), 0x0808);  // local: flags
  EXPECT_EQ(get_at<uint16_t>(b, 8), 8);       // local: method
  EXPECT_EQ(get_at<uint16_t>(b, l.central[0] + 6), 20);
  EXPECT_EQ(get_at<uint16_t>(b, l.central[0] + 10), 8);
  EXPECT_EQ(get_at<uint16_t>(b, l.central[1] + 10), 0);
  EXPECT_EQ(get_at<uint16_t>(b, l.central[2] + 10), 0);

  ZipReader r(memory_source(b), Limits{});
  ASSERT_EQ(r.entries().size(), 4u);
  EXPECT_LT(r.entries()[0].compressed_size, text.size() / 10);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(r.offset_is_computed(i)) << i;
  EXPECT_EQ(r.read(0, true).str(), text);
  EXPECT_EQ(r.read_checked(0, true).str(), text);
  EXPECT_EQ(r.read(1, true).str(), "abc");
  EXPECT_EQ(r.read(2, true).str(), text);
  EXPECT_EQ(r.read_checked(3, true).str(), "12345678");
}

// A file sink that leaves holes where the bytes come from `zeros`, so a >4 GiB archive costs
// neither disk nor a scan of the bytes.
class SparseFileSink final : public ByteSink {
 public:
  SparseFileSink(std::string path, std::span<const std::byte> zeros)
      : path_(std::move(path)), zeros_(zeros) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw std::runtime_error("open " + path_);
  }
  ~SparseFileSink() override { ::close(fd_); }
  const std::string& name() const override { return path_; }
  void write(std::span<const std::byte> b) override {
    const bool hole =
        b.data() >= zeros_.data() && b.data() + b.size() <= zeros_.data() + zeros_.size();
    if (!hole) patch(pos_, b);
    pos_ += b.size();
  }
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> b) override {
    if (::pwrite(fd_, b.data(), b.size(), static_cast<off_t>(offset)) !=
        static_cast<ssize_t>(b.size()))
      throw std::runtime_error("pwrite");
  }
  uint64_t position() const override { return pos_; }
  void commit() override {
    if (::ftruncate(fd_, static_cast<off_t>(pos_)) != 0) throw std::runtime_error("ftruncate");
  }

 private:
  std::string path_;
  std::span<const std::byte> zeros_;
  int fd_ = -1;
  uint64_t pos_ = 0;
};

TEST(ZipWriter, Zip64PastFourGiB) {
  TempDir dir;
  const std::string path = dir.file("big.pt");
  const uint64_t big = 0xFFFFFFFFull + 7;  // saturates the 32-bit size field
  std::vector<std::byte> zeros(64 << 20);
  {
    SparseFileSink sink(path, zeros);
    ZipWriter w(sink, "big/");
    w.add("small", std::string_view("12345678"));
    w.begin("huge", big);
    for (uint64_t left = big; left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, zeros.size());
      w.write({zeros.data(), n});
      left -= n;
    }
    w.end();
    w.add("after", std::string_view("0123456789abcdef"));  // header offset > 4 GiB
    w.finish();
    sink.commit();
  }
  // The headers, read straight from the file.
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto pread_bytes = [&](uint64_t off, size_t n) {
    std::vector<std::byte> b(n);
    EXPECT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
    return b;
  };
  // "small": header at 0, data at 64, descriptor 16 B -> "huge" at 88.
  const uint64_t huge_at = 64 + 8 + 16;
  auto h = pread_bytes(huge_at, 64);
  EXPECT_EQ(get_at<uint16_t>(h, 26), 8);   // "big/huge"
  EXPECT_EQ(get_at<uint32_t>(h, 18), 0u);  // sizes 0 in the local copy
  EXPECT_EQ(get_at<uint32_t>(h, 22), 0u);
  EXPECT_EQ(get_at<uint16_t>(h, 38), 0x0001);  // zip64 extra
  EXPECT_EQ(get_at<uint16_t>(h, 40), 16);      // size + compressed size
  EXPECT_EQ(get_at<uint64_t>(h, 42), big);
  EXPECT_EQ(get_at<uint64_t>(h, 50), 0u);  // compressed size unknown there
  EXPECT_EQ(to_string({h.data() + 58, 2}), "FB");
  const uint64_t huge_data = internal::torch_data_offset(huge_at, 8, big, 64);
  const uint64_t after_at = huge_data + big + 24;  // 24-byte descriptor
  auto d = pread_bytes(huge_data + big, 24);
  EXPECT_EQ(get_at<uint32_t>(d, 0), internal::zipfmt::kDescriptorSig);
  EXPECT_EQ(get_at<uint64_t>(d, 8), big);
  EXPECT_EQ(get_at<uint64_t>(d, 16), big);
  auto a = pread_bytes(after_at, 64);
  EXPECT_EQ(get_at<uint32_t>(a, 0), internal::zipfmt::kLocalSig);
  EXPECT_EQ(get_at<uint16_t>(a, 30 + 9), 0x0001);  // after "big/after"
  EXPECT_EQ(get_at<uint16_t>(a, 30 + 9 + 2), 8);   // header offset only
  EXPECT_EQ(get_at<uint64_t>(a, 30 + 9 + 4), after_at);
  ::close(fd);

  // And the reader takes the zip64 directory apart.
  auto src = open_file_source(path);
  ZipReader r(src, Limits{});
  EXPECT_LE(src->stats().reads.load(), 2u);
  ASSERT_EQ(r.entries().size(), 3u);
  const auto& e = r.entries();
  EXPECT_EQ(e[1].size, big);
  EXPECT_EQ(e[1].compressed_size, big);
  EXPECT_EQ(e[1].header_offset, huge_at);
  EXPECT_EQ(e[2].header_offset, after_at);
  EXPECT_EQ(e[2].size, 16u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(r.offset_is_computed(i)) << i;
  EXPECT_EQ(r.data_offset(1), huge_data);
  EXPECT_EQ(r.data_offset(2), internal::torch_data_offset(after_at, 9, 16, 64));
  EXPECT_EQ(r.read_checked(2, true).str(), "0123456789abcdef");
  EXPECT_EQ(r.read(0, true).str(), "12345678");
  EXPECT_CKPT_ERROR(r.read(1, false, 1 << 20), ErrorCode::kLimitExceeded);
}

}  // namespace
}  // namespace ckpt::test
