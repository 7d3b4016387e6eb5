// Zip reader: a record's bytes (zip_reader.cc opens the directory). Stored records are read
// (or viewed) at their data offset; deflated ones are inflated as a stream (inflate_stream.h),
// into the caller's buffer or through one bounded buffer, with the CRC computed as they pass.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "ckpt/error.h"
#include "util/bytes.h"
#include "util/crc32.h"
#include "util/text.h"
#include "zip/inflate_stream.h"
#include "zip/zip_format.h"
#include "zip/zip_reader.h"
#include "zip/zip_reader_internal.h"

namespace ckpt::internal {

using namespace zipfmt;  // NOLINT: the record constants are this file's vocabulary
using zipimpl::fail;
using zipimpl::read_for;

std::optional<size_t> ZipReader::find(std::string_view name) const {
  return index_.find(name, [this](size_t i) { return entries_[i].name; });
}

bool ZipReader::offset_is_computed(size_t i) const { return i < computed_.size() && computed_[i]; }

uint64_t ZipReader::data_offset(size_t i) const {
  if (i >= entries_.size())
    throw Error(ErrorCode::kInvalidArgument, "entry index " + std::to_string(i) + " out of range",
                source_->name());
  if (computed_[i]) return entries_[i].data_offset;
  uint64_t v = cache_->offsets[i].load(std::memory_order_acquire);
  if (v != UINT64_MAX) return v;
  v = read_local_header(i);
  cache_->offsets[i].store(v, std::memory_order_release);
  return v;
}

// Checks the signature and name of entry i's local header at `p` (30 + name bytes available) and
// returns its extra-field length.
uint16_t ZipReader::local_extra_len(size_t i, const std::byte* p) const {
  const ZipEntry& e = entries_[i];
  const std::string& src = source_->name();
  if (load_le<uint32_t>(p) != kLocalSig)
    fail(ErrorCode::kCorrupt, "bad local header signature", src, e.name, e.header_offset);
  const uint16_t name_len = load_le<uint16_t>(p + kLocalNameLenOfs);
  if (name_len != e.name.size() || std::memcmp(p + kLocalSize, e.name.data(), name_len) != 0)
    fail(ErrorCode::kCorrupt, "local header name disagrees with the central directory", src, e.name,
         e.header_offset + kLocalNameLenOfs);
  return load_le<uint16_t>(p + kLocalExtraLenOfs);
}

uint64_t ZipReader::read_local_header(size_t i) const {
  const ZipEntry& e = entries_[i];
  const std::string& src = source_->name();
  // Validation guaranteed header + 30 + name + data <= end_limit_[i] <= file size.
  const Bytes h = read_for(*source_, e.name, e.header_offset, kLocalSize + e.name.size());
  const std::byte* p = h.data.data();
  const uint16_t name_len = static_cast<uint16_t>(e.name.size());
  const uint16_t extra_len = local_extra_len(i, p);
  const uint64_t data = e.header_offset + kLocalSize + name_len + extra_len;
  if (data + e.compressed_size > end_limit_[i])
    fail(ErrorCode::kCorrupt,
         "local extra field (" + std::to_string(extra_len) +
             " bytes) pushes the data past the next entry",
         src, e.name, e.header_offset + kLocalExtraLenOfs);
  return data;
}

void ZipReader::check_readable(size_t i, uint64_t max_size) const {
  if (i >= entries_.size())
    throw Error(ErrorCode::kInvalidArgument, "entry index " + std::to_string(i) + " out of range",
                source_->name());
  const ZipEntry& e = entries_[i];
  const std::string& src = source_->name();
  if (e.flags & kFlagEncrypted)
    fail(ErrorCode::kUnsupported, "encrypted zip entries are not supported", src, e.name,
         e.header_offset);
  if (e.method != kMethodStored && e.method != kMethodDeflate)
    fail(ErrorCode::kUnsupported,
         "compression method " + std::to_string(e.method) +
             " is not supported (only stored, deflate)",
         src, e.name, e.header_offset);
  if (e.size > max_size)
    fail(ErrorCode::kLimitExceeded,
         "entry of " + std::to_string(e.size) + " bytes exceeds the cap of " +
             std::to_string(max_size),
         src, e.name, e.header_offset);
  if (e.method == kMethodDeflate && e.size > limits_.max_inflated_bytes)
    fail(ErrorCode::kLimitExceeded,
         "entry inflates to " + std::to_string(e.size) +
             " bytes, more than limits.max_inflated_bytes (" +
             std::to_string(limits_.max_inflated_bytes) + ")",
         src, e.name, e.header_offset);
  if (e.method == kMethodStored && e.compressed_size != e.size)
    fail(ErrorCode::kCorrupt,
         "stored entry has compressed size " + std::to_string(e.compressed_size) + " but size " +
             std::to_string(e.size),
         src, e.name, e.header_offset);
}

void ZipReader::check_crc(size_t i, std::span<const std::byte> data) const {
  const ZipEntry& e = entries_[i];
  if (e.crc32 == 0) return;  // torch with compute_crc32=False writes 0
  const uint32_t got = crc32(data);
  if (got != e.crc32)
    throw crc_mismatch(source_->name(), std::string(e.name), e.header_offset, e.crc32, got);
}

void ZipReader::inflate_into(size_t i, uint64_t data_offset, std::span<std::byte> dst,
                             bool verify) const {
  const ZipEntry& e = entries_[i];
  InflateStream in(*source_, std::string(e.name), data_offset, e.compressed_size);
  uint32_t crc = 0;
  size_t done = 0;
  while (done < dst.size()) {
    const size_t n = in.read(dst.subspan(done));
    if (n == 0) break;
    if (verify) crc = crc32(crc, dst.subspan(done, n));
    done += n;
  }
  if (done < dst.size())
    fail(ErrorCode::kCorrupt,
         "deflate stream inflates to " + std::to_string(done) + " bytes, not the declared " +
             std::to_string(e.size),
         source_->name(), e.name, data_offset);
  std::byte extra[1];
  if (!in.finished() && in.read(extra) != 0)
    fail(ErrorCode::kCorrupt,
         "deflate stream inflates to more than the declared " + std::to_string(e.size) + " bytes",
         source_->name(), e.name, data_offset);
  if (verify && e.crc32 != 0 && crc != e.crc32)
    throw crc_mismatch(source_->name(), std::string(e.name), e.header_offset, e.crc32, crc);
}

Bytes ZipReader::inflate(size_t i, uint64_t data_offset, bool verify) const {
  const ZipEntry& e = entries_[i];
  // Sized by the directory and capped by check_readable(); never zero-filled, so that pages
  // the stream never reaches are never touched.
  std::shared_ptr<std::byte[]> out(new std::byte[std::max<uint64_t>(e.size, 1)]);
  inflate_into(i, data_offset, std::span<std::byte>(out.get(), e.size), verify);
  return Bytes{std::span<const std::byte>(out.get(), e.size), out};
}

void ZipReader::read_into(size_t i, std::span<std::byte> dst, bool verify) const {
  check_readable(i, UINT64_MAX);
  const ZipEntry& e = entries_[i];
  if (dst.size() != e.size)
    fail(ErrorCode::kCorrupt,
         "record holds " + std::to_string(e.size) + " bytes, not the " +
             std::to_string(dst.size()) + " expected",
         source_->name(), e.name, e.header_offset);
  const uint64_t off = data_offset(i);
  if (e.method != kMethodStored) return inflate_into(i, off, dst, verify);
  constexpr uint64_t kPiece = 4 << 20;
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e.size; done += kPiece) {
    const std::span<std::byte> piece = dst.subspan(done, std::min(kPiece, e.size - done));
    try {
      source_->read_into(off + done, piece);
    } catch (Error& err) {
      err.with_record(std::string(e.name));
      throw;
    }
    if (verify) crc = crc32(crc, piece);
  }
  if (verify && e.crc32 != 0 && crc != e.crc32)
    throw crc_mismatch(source_->name(), std::string(e.name), e.header_offset, e.crc32, crc);
}

void ZipReader::stream(size_t i, bool verify,
                       const std::function<void(std::span<const std::byte>)>& sink) const {
  check_readable(i, UINT64_MAX);
  const ZipEntry& e = entries_[i];
  const uint64_t off = data_offset(i);
  constexpr uint64_t kPiece = 1 << 20;
  uint32_t crc = 0;
  if (e.method == kMethodStored) {
    for (uint64_t done = 0; done < e.size; done += kPiece) {
      const Bytes b = read_for(*source_, e.name, off + done, std::min(kPiece, e.size - done));
      if (verify) crc = crc32(crc, b.data);
      sink(b.data);
    }
  } else {
    InflateStream in(*source_, std::string(e.name), off, e.compressed_size);
    std::unique_ptr<std::byte[]> buf(new std::byte[kPiece]);
    uint64_t done = 0;
    for (;;) {
      const size_t n = in.read(std::span<std::byte>(buf.get(), kPiece));
      if (n == 0) break;
      done += n;
      if (done > e.size)
        fail(ErrorCode::kCorrupt,
             "deflate stream inflates to more than the declared " + std::to_string(e.size) +
                 " bytes",
             source_->name(), e.name, off);
      const std::span<const std::byte> got(buf.get(), n);
      if (verify) crc = crc32(crc, got);
      sink(got);
    }
    if (done != e.size)
      fail(ErrorCode::kCorrupt,
           "deflate stream inflates to " + std::to_string(done) + " bytes, not the declared " +
               std::to_string(e.size),
           source_->name(), e.name, off);
  }
  if (verify && e.crc32 != 0 && crc != e.crc32)
    throw crc_mismatch(source_->name(), std::string(e.name), e.header_offset, e.crc32, crc);
}

std::optional<Bytes> ZipReader::held(uint64_t offset, uint64_t len) const {
  for (const auto& [start, b] : held_)
    if (offset >= start && len <= b.size() && offset - start <= b.size() - len)
      return Bytes{b.data.subspan(offset - start, len), b.owner};
  return std::nullopt;
}

Bytes ZipReader::read_range(std::string_view record, uint64_t offset, uint64_t len) const {
  if (auto h = held(offset, len)) return *h;
  return read_for(*source_, record, offset, len);
}

Bytes ZipReader::read(size_t i, bool verify, uint64_t max_size) const {
  check_readable(i, max_size);
  const uint64_t off = data_offset(i);
  if (entries_[i].method != kMethodStored) return inflate(i, off, verify);
  Bytes b = read_range(entries_[i].name, off, entries_[i].size);
  if (verify) check_crc(i, b.data);
  return b;
}

Bytes ZipReader::read_checked(size_t i, bool verify, uint64_t max_size) const {
  check_readable(i, max_size);
  const ZipEntry& e = entries_[i];
  if (e.method != kMethodStored || !computed_[i]) return read(i, verify, max_size);
  const uint64_t head = e.data_offset - e.header_offset;
  const Bytes b = read_range(e.name, e.header_offset, head + e.size);
  Bytes out{b.data.subspan(head, e.size), b.owner};
  check_local_header(i, b.data);
  if (verify) check_crc(i, out.data);
  return out;
}

void ZipReader::check_local_header(size_t i, std::span<const std::byte> from_header) const {
  const ZipEntry& e = entries_[i];
  const std::string& src = source_->name();
  const uint64_t head = e.data_offset - e.header_offset;
  if (from_header.size() < head || head < kLocalSize)
    fail(ErrorCode::kCorrupt, "local header does not fit before the computed data offset", src,
         e.name, e.header_offset);
  const std::byte* p = from_header.data();
  const uint16_t name_len = static_cast<uint16_t>(e.name.size());
  const uint16_t extra_len = local_extra_len(i, p);
  if (kLocalSize + name_len + extra_len != head)
    fail(ErrorCode::kCorrupt,
         "local header puts the data at " +
             std::to_string(e.header_offset + kLocalSize + name_len + extra_len) +
             ", not at the computed " + std::to_string(e.data_offset),
         src, e.name, e.header_offset + kLocalExtraLenOfs);
}

std::vector<Bytes> ZipReader::read_many(std::span<const size_t> which, uint64_t max_gap) const {
  std::vector<Bytes> out(which.size());
  std::vector<size_t> order;  // positions in `which` of stored entries with computed offsets
  for (size_t k = 0; k < which.size(); ++k) {
    size_t i = which[k];
    check_readable(i, UINT64_MAX);
    if (entries_[i].method == kMethodStored && computed_[i])
      order.push_back(k);
    else
      out[k] = read(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries_[which[a]].header_offset < entries_[which[b]].header_offset;
  });
  for (size_t g = 0; g < order.size();) {
    // A group: entries whose gaps are at most max_gap, read as one range.
    size_t h = g + 1;
    uint64_t start = entries_[which[order[g]]].header_offset;
    uint64_t end = entries_[which[order[g]]].data_offset + entries_[which[order[g]]].size;
    while (h < order.size() && entries_[which[order[h]]].header_offset <= end + max_gap) {
      end = std::max(end, entries_[which[order[h]]].data_offset + entries_[which[order[h]]].size);
      ++h;
    }
    const Bytes b = read_range(entries_[which[order[g]]].name, start, end - start);
    for (size_t k = g; k < h; ++k) {
      size_t i = which[order[k]];
      const ZipEntry& e = entries_[i];
      check_local_header(i, b.data.subspan(e.header_offset - start));
      out[order[k]] = Bytes{b.data.subspan(e.data_offset - start, e.size), b.owner};
    }
    g = h;
  }
  return out;
}

}  // namespace ckpt::internal
