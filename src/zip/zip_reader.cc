// Zip reader. Byte layouts: zip_format.h; torch's layout: docs/formats/torch.md "torch.save zip"
// (**Zip layout**, **Reading**).
//
// Open: one read of the tail (end record, zip64 locator and end record, and often the whole
// central directory), then at most one more read for a directory the tail did not cover. Every
// count, size and offset is checked against the file and the limits before it is used.
//
// Data offsets: torch pads each local header with an "FB" extra field so that the data lands on
// an aligned offset, and writes records back to back. Given the next record's header offset (or
// the directory's), the data offset of a record follows without reading its local header, and
// the padding formula tells whether the guess is right. Other writers fall back to one cached
// read of the local header.

#include "zip/zip_reader.h"

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
#include "zip/zip_reader_internal.h"

namespace ckpt::internal {

using namespace zipfmt;  // NOLINT: the record constants are this file's vocabulary
using zipimpl::fail;
using zipimpl::read_for;

namespace {

// The tail read covers the largest end-record comment plus both zip64 records, and a central
// directory of a few thousand records, so that most checkpoints open in one read.
constexpr uint64_t kTailRead = 256 << 10;
static_assert(kTailRead >= kMaxComment + kEndSize + kZip64LocatorSize + kZip64EndSize);

// Bytes read before the directory when the directory needs a read of its own.
constexpr uint64_t kDirectorySlack = 4096;

// Where the end records say the central directory is.
struct Directory {
  uint64_t count = 0, size = 0, offset = 0;
  uint64_t end_limit = 0;  // the directory must end at or before this offset
};

}  // namespace

uint64_t torch_data_offset(uint64_t header_offset, size_t name_len, uint64_t size,
                           uint32_t alignment) noexcept {
  uint64_t start = header_offset + kLocalSize + name_len + kFbHeaderSize;
  if (torch_needs_zip64(header_offset, size)) {
    start += 4;  // zip64 extra header
    if (size >= kMax32) start += 16;
    if (header_offset >= kMax32) start += 8;
  }
  return round_up(start, alignment);
}

ZipReader::ZipReader(SourcePtr source, const Limits& limits)
    : source_(std::move(source)), limits_(limits) {
  if (!source_) throw Error(ErrorCode::kInvalidArgument, "ZipReader needs a source");
  const std::string& src = source_->name();
  const uint64_t file_size = source_->size();
  if (file_size < kEndSize) {
    if (file_size > 0) {
      std::byte head[kEndSize];
      source_->read_into(0, std::span<std::byte>(head, file_size));
      fail_without_end(std::span<const std::byte>(head, file_size));
    }
    fail_without_end({});
  }

  const uint64_t tail_len = std::min(file_size, kTailRead);
  const uint64_t tail_off = file_size - tail_len;
  const Bytes tail = source_->read(tail_off, tail_len);
  held_.push_back({tail_off, tail});
  const std::byte* t = tail.data.data();

  // The last end-record signature whose comment fits in the file. Scanning from the end finds
  // the real record before any signature-like bytes inside an earlier comment.
  const size_t last = tail_len - kEndSize;
  const size_t first = last > kMaxComment ? last - kMaxComment : 0;
  std::optional<size_t> eocd;
  for (size_t p = last + 1; p-- > first;) {
    if (load_le<uint32_t>(t + p) == kEndSig &&
        p + kEndSize + load_le<uint16_t>(t + p + 20) <= tail_len) {
      eocd = p;
      break;
    }
  }
  if (!eocd) fail_without_end(tail_off == 0 ? tail.data : std::span<const std::byte>());
  const std::byte* e = t + *eocd;
  const uint64_t eocd_abs = tail_off + *eocd;

  Directory dir;
  uint32_t disk = load_le<uint16_t>(e + 4), cd_disk = load_le<uint16_t>(e + 6);
  uint64_t on_disk = load_le<uint16_t>(e + 8);
  dir.count = load_le<uint16_t>(e + 10);
  dir.size = load_le<uint32_t>(e + 12);
  dir.offset = load_le<uint32_t>(e + 16);
  dir.end_limit = eocd_abs;

  // Zip64: the locator sits right before the end record and points at the zip64 end record,
  // whose 64-bit fields replace the saturated classic ones (torch always writes both).
  if (*eocd >= kZip64LocatorSize && load_le<uint32_t>(e - kZip64LocatorSize) == kZip64LocatorSig) {
    const std::byte* loc = e - kZip64LocatorSize;
    const uint64_t loc_abs = eocd_abs - kZip64LocatorSize;
    const uint64_t z_off = load_le<uint64_t>(loc + 8);
    if (loc_abs < kZip64EndSize || z_off > loc_abs - kZip64EndSize)
      fail(ErrorCode::kCorrupt,
           "zip64 end record offset " + std::to_string(z_off) + " is out of range", src, {},
           loc_abs + 8);
    Bytes z_read;
    const std::byte* z;
    if (z_off >= tail_off) {
      z = t + (z_off - tail_off);
    } else {  // an extensible data sector pushed it out of the tail: rare
      z_read = source_->read(z_off, kZip64EndSize);
      z = z_read.data.data();
    }
    if (load_le<uint32_t>(z) != kZip64EndSig)
      fail(ErrorCode::kCorrupt, "bad zip64 end record signature", src, {}, z_off);
    const uint64_t rec_size = load_le<uint64_t>(z + 4);
    if (rec_size < kZip64EndSize - 12 || rec_size > loc_abs - z_off - 12)
      fail(ErrorCode::kCorrupt, "zip64 end record size " + std::to_string(rec_size) + " is invalid",
           src, {}, z_off + 4);
    disk = load_le<uint32_t>(z + 16);
    cd_disk = load_le<uint32_t>(z + 20);
    on_disk = load_le<uint64_t>(z + 24);
    dir.count = load_le<uint64_t>(z + 32);
    dir.size = load_le<uint64_t>(z + 40);
    dir.offset = load_le<uint64_t>(z + 48);
    dir.end_limit = z_off;
  }
  if (disk != 0 || cd_disk != 0 || on_disk != dir.count)
    fail(ErrorCode::kUnsupported, "multi-disk zip archives are not supported", src, {}, eocd_abs);

  if (dir.count > limits_.max_records)
    fail(ErrorCode::kLimitExceeded,
         std::to_string(dir.count) + " zip entries exceed limits.max_records (" +
             std::to_string(limits_.max_records) + ")",
         src, {}, eocd_abs);
  auto cd_end = checked_add(dir.offset, dir.size);
  if (!cd_end || *cd_end > dir.end_limit)
    fail(ErrorCode::kCorrupt,
         "central directory (" + std::to_string(dir.size) + " bytes at " +
             std::to_string(dir.offset) + ") passes its end record at " +
             std::to_string(dir.end_limit),
         src, {}, eocd_abs);
  if (dir.count > dir.size / kCentralSize)
    fail(ErrorCode::kCorrupt,
         std::to_string(dir.count) + " entries cannot fit in a central directory of " +
             std::to_string(dir.size) + " bytes",
         src, {}, eocd_abs);
  if (dir.size > limits_.max_metadata_bytes)
    fail(ErrorCode::kLimitExceeded,
         "central directory of " + std::to_string(dir.size) +
             " bytes exceeds limits.max_metadata_bytes",
         src, {}, dir.offset);

  if (dir.offset >= tail_off) {
    parse_directory(tail.data.subspan(dir.offset - tail_off, dir.size), dir.offset, dir.count);
  } else {
    // Start a little before the directory so that the small records torch writes last (version,
    // .data/serialization_id) come with it and need no read of their own.
    const uint64_t start = dir.offset > kDirectorySlack ? dir.offset - kDirectorySlack : 0;
    const Bytes cd = source_->read(start, dir.offset + dir.size - start);
    held_.push_back({start, cd});
    parse_directory(cd.data.subspan(dir.offset - start), dir.offset, dir.count);
  }
  validate_and_compute(dir.offset);

  if (!entries_.empty()) {
    const std::string_view n0 = entries_[0].name;
    const size_t slash = n0.find('/');
    if (slash != std::string_view::npos) {
      const std::string_view p = n0.substr(0, slash + 1);
      if (std::all_of(entries_.begin(), entries_.end(),
                      [&](const ZipEntry& x) { return x.name.starts_with(p); }))
        prefix_ = std::string(p);
    }
  }
  if (std::find(computed_.begin(), computed_.end(), 0) != computed_.end())
    cache_ = std::make_shared<ZipOffsetCache>(entries_.size());
}

// No end record. A cut file (the end records come last, so any cut loses them) is told from
// one that is no zip at all by its start: a zip starts with a local header. The local headers
// are then walked to the record, the central directory or the end record the file ends in;
// torch writes its sizes only in data descriptors, so a record of unknown size ends at the first
// descriptor whose size matches the bytes before it (searched in place in a mapped file, 1 MiB
// at a time otherwise: this error path may read the whole file). Everything here throws.
void ZipReader::fail_without_end(std::span<const std::byte> head) const {
  const std::string& src = source_->name();
  const uint64_t file_size = source_->size();
  const std::byte* mem = source_->memory();
  std::byte sig_buf[4];
  if (head.empty() && file_size > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(4, file_size));
    source_->read_into(0, std::span<std::byte>(sig_buf, n));
    head = std::span<const std::byte>(sig_buf, n);
  }
  if (file_size == 0) fail(ErrorCode::kTruncated, "empty file (0 bytes)", src, {}, 0);
  static constexpr unsigned char kLocalMagic[4] = {'P', 'K', 3, 4};
  const size_t m = std::min<size_t>(head.size(), 4);
  const bool zip_start = m > 0 && std::memcmp(head.data(), kLocalMagic, m) == 0;
  if (!zip_start)
    fail(ErrorCode::kCorrupt,
         file_size < kEndSize
             ? "not a zip file: " + std::to_string(file_size) + " bytes cannot hold an end record"
             : std::string("no end-of-central-directory record, and the file does not start with "
                           "a local header: not a zip file"),
         src, {}, file_size < kEndSize ? 0 : file_size);
  if (file_size < 4)
    fail(ErrorCode::kTruncated,
         "the file ends after " + std::to_string(file_size) + " bytes, inside a zip local header",
         src, {}, 0);

  // Reads `len` bytes at `off` (both inside the file).
  auto at = [&](uint64_t off, uint64_t len) -> Bytes {
    if (mem) return Bytes{std::span<const std::byte>(mem + off, len), nullptr};
    return source_->read(off, len);
  };
  const auto ends = [&](std::string what, const std::string& record, uint64_t offset) {
    fail(ErrorCode::kTruncated,
         "the file ends (" + std::to_string(file_size) + " bytes) " + what +
             "; no end-of-central-directory record",
         src, record, offset);
  };
  uint64_t pos = 0;
  std::string last;  // the last record whose bytes are all in the file
  for (uint64_t k = 0;; ++k) {
    if (pos == file_size)
      ends("after " + std::to_string(k) + " records, where the central directory should start",
           last, pos);
    if (file_size - pos < 4) ends("inside a header", last, pos);
    const uint32_t sig = load_le<uint32_t>(at(pos, 4).data.data());
    if (sig == kCentralSig || sig == kZip64EndSig || sig == kZip64LocatorSig || sig == kEndSig)
      fail_in_directory(pos, k);
    if (sig != kLocalSig)
      fail(ErrorCode::kCorrupt,
           "no end-of-central-directory record, and no local header where record " +
               std::to_string(k) + " should start",
           src, last, pos);
    if (file_size - pos < kLocalSize)
      ends("inside the local header of record " + std::to_string(k), {}, pos);
    const Bytes h = at(pos, kLocalSize);
    const std::byte* p = h.data.data();
    const uint16_t flags = load_le<uint16_t>(p + 6);
    uint64_t csize = load_le<uint32_t>(p + 18), size = load_le<uint32_t>(p + 22);
    const uint16_t name_len = load_le<uint16_t>(p + kLocalNameLenOfs);
    const uint16_t extra_len = load_le<uint16_t>(p + kLocalExtraLenOfs);
    if (file_size - pos - kLocalSize < name_len)
      ends("inside the local header of record " + std::to_string(k), {}, pos);
    const std::string name(
        reinterpret_cast<const char*>(at(pos + kLocalSize, name_len).data.data()), name_len);
    if (file_size - pos - kLocalSize - name_len < extra_len)
      ends("inside the local header", name, pos);
    const uint64_t data = pos + kLocalSize + name_len + extra_len;
    bool zip64 = false;
    if (extra_len > 0) {  // a zip64 extra replaces saturated sizes (local: size, then csize)
      const Bytes ex = at(pos + kLocalSize + name_len, extra_len);
      for (size_t q = 0; q + 4 <= ex.size();) {
        const uint16_t id = load_le<uint16_t>(ex.data.data() + q);
        const uint16_t len = load_le<uint16_t>(ex.data.data() + q + 2);
        if (len > ex.size() - q - 4) break;
        if (id == kZip64ExtraId) {
          zip64 = true;
          if (len >= 16 && size == kMax32 && csize == kMax32) {
            size = load_le<uint64_t>(ex.data.data() + q + 4);
            csize = load_le<uint64_t>(ex.data.data() + q + 12);
          }
        }
        q += 4 + len;
      }
    }
    const bool descriptor = (flags & kFlagDescriptor) != 0;
    if (descriptor && csize == 0) {
      // The size is in the descriptor after the data: find the first one that agrees with it
      // (a mapped file is searched in place, another source 1 MiB at a time).
      const uint64_t dsize = zip64 ? kDescriptorSize64 : kDescriptorSize32;
      std::optional<uint64_t> found;
      constexpr uint64_t kChunk = 1 << 20;
      for (uint64_t q = data; !found && file_size - q >= dsize;) {
        const uint64_t len = mem ? file_size - q : std::min(file_size - q, kChunk + dsize - 1);
        const Bytes win = at(q, len);
        const std::byte* w = win.data.data();
        for (uint64_t i = 0; i + dsize <= len;) {
          const void* hit = std::memchr(w + i, 'P', len - dsize + 1 - i);
          if (!hit) break;
          i = static_cast<uint64_t>(static_cast<const std::byte*>(hit) - w);
          if (load_le<uint32_t>(w + i) == kDescriptorSig &&
              (zip64 ? load_le<uint64_t>(w + i + 8) : load_le<uint32_t>(w + i + 8)) ==
                  q + i - data) {
            found = q + i;
            break;
          }
          ++i;
        }
        q += len - dsize + 1;
      }
      if (!found) ends("inside the data of this record", name, data);
      pos = *found + dsize;
    } else {
      if (file_size - data < csize)
        ends("inside the data of this record (" + std::to_string(csize) + " bytes at " +
                 std::to_string(data) + ")",
             name, data);
      pos = data + csize;
      if (descriptor) {
        uint64_t dsize = zip64 ? kDescriptorSize64 : kDescriptorSize32;
        if (file_size - pos >= 4 && load_le<uint32_t>(at(pos, 4).data.data()) != kDescriptorSig)
          dsize -= 4;  // the descriptor's signature is optional
        if (file_size - pos < dsize) ends("inside the data descriptor of this record", name, pos);
        pos += dsize;
      }
    }
    last = name;
  }
}

// fail_without_end() past the local records: the central directory starts at `pos`. The file
// is cut when it ends inside the directory or the end records; when they are all there, the
// end record was not found because it is damaged (kCorrupt).
void ZipReader::fail_in_directory(uint64_t pos, uint64_t records) const {
  const std::string& src = source_->name();
  const uint64_t file_size = source_->size();
  auto at = [&](uint64_t off, uint64_t len) { return source_->read(off, len); };
  const auto ends = [&](const std::string& what, uint64_t offset) {
    fail(ErrorCode::kTruncated,
         "the file ends (" + std::to_string(file_size) + " bytes) " + what + ", after " +
             std::to_string(records) + " records; no end-of-central-directory record",
         src, {}, offset);
  };
  uint64_t entries = 0;
  for (;; ++entries) {
    if (file_size - pos < 4) break;
    if (load_le<uint32_t>(at(pos, 4).data.data()) != kCentralSig) break;
    if (file_size - pos < kCentralSize)
      ends("inside central directory entry " + std::to_string(entries), pos);
    const Bytes h = at(pos, kCentralSize);
    const uint64_t len = kCentralSize + load_le<uint16_t>(h.data.data() + 28) +
                         load_le<uint16_t>(h.data.data() + 30) +
                         load_le<uint16_t>(h.data.data() + 32);
    if (file_size - pos < len)
      ends("inside central directory entry " + std::to_string(entries), pos);
    pos += len;
  }
  for (;;) {
    if (pos == file_size) ends("after the central directory, where its end record should be", pos);
    if (file_size - pos < 4) ends("inside the end records", pos);
    const uint32_t sig = load_le<uint32_t>(at(pos, 4).data.data());
    if (sig == kZip64EndSig) {
      if (file_size - pos < kZip64EndSize) ends("inside the zip64 end record", pos);
      const uint64_t size = load_le<uint64_t>(at(pos + 4, 8).data.data());
      if (size > file_size - pos - 12) ends("inside the zip64 end record", pos);
      pos += 12 + size;
    } else if (sig == kZip64LocatorSig) {
      if (file_size - pos < kZip64LocatorSize) ends("inside the zip64 end locator", pos);
      pos += kZip64LocatorSize;
    } else if (sig == kEndSig) {
      if (file_size - pos < kEndSize) ends("inside the end-of-central-directory record", pos);
      const uint16_t comment = load_le<uint16_t>(at(pos + 20, 2).data.data());
      if (file_size - pos - kEndSize < comment)
        ends("inside the end-of-central-directory record's comment", pos);
      // Whole, but too far from the end for the search from the end to find it.
      fail(ErrorCode::kCorrupt,
           "the end-of-central-directory record is followed by " +
               std::to_string(file_size - pos - kEndSize - comment) +
               " bytes that belong to no part of the zip",
           src, {}, pos);
    } else {
      fail(ErrorCode::kCorrupt,
           "no end-of-central-directory record: bad signature after " + std::to_string(entries) +
               " central directory entries",
           src, {}, pos);
    }
  }
}

void ZipReader::parse_directory(std::span<const std::byte> cd, uint64_t cd_offset, uint64_t count) {
  const std::string& src = source_->name();
  // One bounds check per header and one per variable part instead of one per field: this loop
  // runs once per record (20,000 for a 20,000-tensor checkpoint).
  auto truncated = [&](size_t pos, size_t need) {
    fail(ErrorCode::kTruncated,
         "need " + std::to_string(need) + " bytes, " + std::to_string(cd.size() - pos) + " remain",
         src, {}, cd_offset + pos);
  };
  const std::byte* const base = cd.data();
  const size_t end = cd.size();
  size_t pos = 0;
  entries_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = cd_offset + pos;
    if (end - pos < kCentralSize) truncated(pos, kCentralSize);
    const std::byte* h = base + pos;
    if (load_le<uint32_t>(h) != kCentralSig)
      fail(ErrorCode::kCorrupt, "bad central directory signature (entry " + std::to_string(i) + ")",
           src, {}, at);
    ZipEntry& e = entries_[i];
    // Offsets in the 46-byte header (zip_format.h): flags 8, method 10, crc 16, sizes 20 and 24,
    // name/extra/comment lengths 28/30/32, local header offset 42.
    e.flags = load_le<uint16_t>(h + 8);
    e.method = load_le<uint16_t>(h + 10);
    e.crc32 = load_le<uint32_t>(h + 16);
    const uint32_t csize32 = load_le<uint32_t>(h + 20), size32 = load_le<uint32_t>(h + 24);
    const uint16_t name_len = load_le<uint16_t>(h + 28), extra_len = load_le<uint16_t>(h + 30);
    const uint16_t comment_len = load_le<uint16_t>(h + 32);
    const uint32_t offset32 = load_le<uint32_t>(h + 42);
    pos += kCentralSize;
    // Each part is checked in turn, so that the error names the first one that does not fit.
    if (end - pos < name_len) truncated(pos, name_len);
    e.name = std::string_view(reinterpret_cast<const char*>(base + pos), name_len);
    pos += name_len;
    const uint64_t extra_at = cd_offset + pos;
    if (end - pos < extra_len) truncated(pos, extra_len);
    const std::span<const std::byte> extra(base + pos, extra_len);
    pos += extra_len;
    if (end - pos < comment_len) truncated(pos, comment_len);
    pos += comment_len;

    e.size = size32;
    e.compressed_size = csize32;
    e.header_offset = offset32;
    // The zip64 extra holds, in this order, only the fields whose 32-bit copy is saturated.
    const bool need_size = size32 == kMax32, need_csize = csize32 == kMax32,
               need_offset = offset32 == kMax32;
    if (need_size || need_csize || need_offset) {
      bool found = false;
      size_t p = 0;
      while (p + 4 <= extra.size()) {
        const uint16_t id = load_le<uint16_t>(extra.data() + p);
        const uint16_t len = load_le<uint16_t>(extra.data() + p + 2);
        if (len > extra.size() - p - 4)
          fail(ErrorCode::kCorrupt, "extra field passes the end of its entry", src, e.name,
               extra_at + p);
        if (id == kZip64ExtraId) {
          const std::byte* f = extra.data() + p + 4;
          const size_t want = 8 * (need_size + need_csize + need_offset);
          if (len < want)
            fail(ErrorCode::kCorrupt,
                 "zip64 extra field has " + std::to_string(len) + " bytes, needs " +
                     std::to_string(want),
                 src, e.name, extra_at + p);
          if (need_size) e.size = load_le<uint64_t>(f), f += 8;
          if (need_csize) e.compressed_size = load_le<uint64_t>(f), f += 8;
          if (need_offset) e.header_offset = load_le<uint64_t>(f);
          found = true;
          break;
        }
        p += 4 + len;
      }
      if (!found)
        fail(ErrorCode::kCorrupt, "saturated size or offset without a zip64 extra field", src,
             e.name, at);
    }
    if (const char* problem = name_problem(e.name))
      fail(ErrorCode::kCorrupt, problem, src, e.name, at);
  }
}

void ZipReader::validate_and_compute(uint64_t cd_offset) {
  const std::string& src = source_->name();
  const size_t n = entries_.size();

  // A hash index by name (a sort of 20,000 names cost a sixth of opening such a checkpoint).
  index_.reset(n);
  const auto name_of = [this](size_t i) { return entries_[i].name; };
  for (size_t i = 0; i < n; ++i) {
    const ZipEntry& e = entries_[i];
    if (index_.insert(e.name, i, name_of))
      fail(ErrorCode::kCorrupt, "duplicate entry name", src, e.name, e.header_offset);
  }

  // Writers append entries in file order, so the directory is usually sorted already: then the
  // k-th entry by offset is entry k, and no permutation is built.
  std::vector<size_t> by_offset;
  if (!std::is_sorted(entries_.begin(), entries_.end(), [](const ZipEntry& a, const ZipEntry& b) {
        return a.header_offset < b.header_offset;
      })) {
    by_offset.resize(n);
    std::iota(by_offset.begin(), by_offset.end(), size_t{0});
    std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
      return entries_[a].header_offset < entries_[b].header_offset;
    });
  }
  auto nth = [&](size_t k) { return by_offset.empty() ? k : by_offset[k]; };
  end_limit_.assign(n, cd_offset);
  computed_.assign(n, 0);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = nth(k);
    ZipEntry& e = entries_[i];
    // The least an entry can occupy: a local header with the same name, no extra, its data.
    auto min_end = checked_add(e.header_offset, kLocalSize + e.name.size());
    if (min_end) min_end = checked_add(*min_end, e.compressed_size);
    if (!min_end || *min_end > cd_offset)
      fail(ErrorCode::kCorrupt,
           "entry (" + std::to_string(e.compressed_size) +
               " bytes) passes the start of the central directory at " + std::to_string(cd_offset),
           src, e.name, e.header_offset);
    const uint64_t next = k + 1 < n ? entries_[nth(k + 1)].header_offset : cd_offset;
    if (*min_end > next)
      fail(ErrorCode::kCorrupt,
           "entry overlaps entry '" + std::string(entries_[nth(k + 1)].name) + "'", src, e.name,
           next);
    end_limit_[i] = next;

    const uint64_t d =
        (e.flags & kFlagDescriptor) && e.compressed_size != 0
            ? (torch_needs_zip64(e.header_offset, e.size) ? kDescriptorSize64 : kDescriptorSize32)
            : 0;
    if (next < e.compressed_size + d) continue;  // no room for a descriptor: not torch's layout
    const uint64_t guess = next - e.compressed_size - d;
    // torch_data_offset() for each power-of-two alignment up to 32768: the data must start in
    // [start, start + alignment) on a multiple of the alignment.
    const uint64_t start = torch_data_offset(e.header_offset, e.name.size(), e.size, 1);
    if (guess >= start && guess - start < 32768) {
      for (uint64_t a = 1; a <= 32768; a <<= 1) {
        if (align_up(start, a) == guess) {
          e.data_offset = guess;
          computed_[i] = 1;
          break;
        }
      }
    }
  }
}

}  // namespace ckpt::internal
