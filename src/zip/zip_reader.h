#pragma once
// Zip reader for torch archives and zips made by other tools.
//
// Byte layout (APPNOTE 6.3.x; torch specifics in docs/formats/torch.md "torch.save zip", **Zip
// layout**): [local header 30 B + name + extra + data (+ data descriptor)]*,
// central directory (46 B + name + extra + comment per entry), optional zip64 end record (56 B)
// and locator (20 B), end record (22 B + comment).
//
// Opening reads the tail (end records) and the central directory: one read when the tail read
// already covers the directory, else two. It never reads a local header at open.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/source.h"
#include "util/name_index.h"

namespace ckpt::internal {

struct ZipEntry {
  std::string_view name;              // full name as stored ("archive/data/0"): a view into the
                                      // directory bytes the ZipReader holds, valid while it lives
  uint64_t header_offset = 0;         // local header offset
  uint64_t data_offset = UINT64_MAX;  // set at open when computed, else UINT64_MAX (see
                                      // ZipReader::data_offset())
  uint64_t compressed_size = 0;
  uint64_t size = 0;    // uncompressed
  uint32_t crc32 = 0;   // 0 may mean "not computed" (torch compute_crc32=False)
  uint16_t method = 0;  // 0 stored, 8 deflate
  uint16_t flags = 0;   // general purpose flags
};

class ZipReader {
 public:
  // Reads and validates the end records and central directory. Throws Error: kTruncated for a
  // file that starts like a zip but ends before its end record (an empty file too; the error
  // names the record or directory the file ends in), kCorrupt (no end record in a file that
  // does not start with a local header, bad signatures, entries out of range or overlapping,
  // duplicate names, names with ".." components or absolute paths), kLimitExceeded (more than
  // limits.max_records).
  ZipReader(SourcePtr source, const Limits& limits);
  // Entry names are views into held_: moving keeps them valid (the bytes do not move).
  ZipReader(ZipReader&&) = default;
  ZipReader& operator=(ZipReader&&) = default;
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const ByteSource& source() const { return *source_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // Index of the entry with this full name.
  std::optional<size_t> find(std::string_view name) const;
  // Same, trying entry `hint` first: no hashing when names are looked up in directory order.
  // (Not torch's storages: it writes their records in the string order of their keys, 0, 1, 10,
  // 100, ...; the torch opener finds those by number.)
  std::optional<size_t> find(std::string_view name, size_t hint) const {
    if (hint < entries_.size() && entries_[hint].name == name) return hint;
    return find(name);
  }
  // The folder every entry lives under, with its trailing '/' ("archive/"), or "" if entries are
  // not all under one folder.
  const std::string& prefix() const { return prefix_; }

  // Data offset of entry i. Computed without I/O when the layout allows it (entries are
  // contiguous and each entry's data offset agrees with torch's padding formula for a power-of-two
  // alignment, given the next entry's header offset); else one read of the local header (cached;
  // thread-safe). Throws Error{kCorrupt} when the local header disagrees with the directory.
  uint64_t data_offset(size_t i) const;
  // True if data_offset(i) needs no I/O.
  bool offset_is_computed(size_t i) const;

  // The uncompressed bytes of entry i: a view into the source for stored entries of mapped
  // sources, else a fresh buffer; deflated entries are inflated (InflateStream) with a cap of
  // limits.max_inflated_bytes (kLimitExceeded past it). Verifies CRC32 if `verify` and the stored
  // CRC is not 0 (kCorrupt on mismatch, naming the entry). `max_size` caps entry size
  // (kLimitExceeded) before anything is allocated.
  Bytes read(size_t i, bool verify = false, uint64_t max_size = UINT64_MAX) const;

  // Entry i's uncompressed bytes written straight into `dst`, which must be exactly the entry's
  // size (else kCorrupt): stored entries are read into it in pieces, deflated ones inflated into
  // it as their compressed bytes stream in (1 MiB at a time), the CRC computed on the way when
  // `verify`. Nothing the size of the entry is allocated. Same errors as read().
  void read_into(size_t i, std::span<std::byte> dst, bool verify) const;
  // Entry i's uncompressed bytes handed to `sink` in pieces of at most 1 MiB (views valid for
  // the call), the CRC checked at the end when `verify` (after the last piece: a sink that keeps
  // the bytes must not trust them before stream() returns). Memory: one piece. Same errors as
  // read(), and whatever `sink` throws.
  void stream(size_t i, bool verify,
              const std::function<void(std::span<const std::byte>)>& sink) const;

  // Reads local header + data of a stored entry in one read of [header_offset, data end) and
  // checks that the local header agrees with the computed data offset (used for the first record
  // read so that computed offsets are validated at no extra read). Same contract as read().
  Bytes read_checked(size_t i, bool verify = false, uint64_t max_size = UINT64_MAX) const;

  // The uncompressed bytes of several entries with as few reads as possible: stored entries with
  // computed offsets whose gaps are at most `max_gap` bytes are read as one range (none at all
  // when the bytes were already read at open: the tail, the directory), and each one's local
  // header is checked on the way; other entries are read one by one. Same errors as read().
  std::vector<Bytes> read_many(std::span<const size_t> entries, uint64_t max_gap = 64 << 10) const;

 private:
  [[noreturn]] void fail_without_end(std::span<const std::byte> head) const;
  [[noreturn]] void fail_in_directory(uint64_t pos, uint64_t records) const;
  void parse_directory(std::span<const std::byte> cd, uint64_t cd_offset, uint64_t count);
  void validate_and_compute(uint64_t cd_offset);
  uint64_t read_local_header(size_t i) const;
  std::optional<Bytes> held(uint64_t offset, uint64_t len) const;
  Bytes read_range(std::string_view record, uint64_t offset, uint64_t len) const;
  void check_local_header(size_t i, std::span<const std::byte> from_header) const;
  uint16_t local_extra_len(size_t i, const std::byte* p) const;
  Bytes inflate(size_t i, uint64_t data_offset, bool verify) const;
  void inflate_into(size_t i, uint64_t data_offset, std::span<std::byte> dst, bool verify) const;
  void check_crc(size_t i, std::span<const std::byte> data) const;
  void check_readable(size_t i, uint64_t max_size) const;

  SourcePtr source_;
  Limits limits_;
  std::vector<ZipEntry> entries_;
  std::vector<std::pair<uint64_t, Bytes>> held_;  // (offset, bytes) read at open, served again
  std::vector<uint8_t> computed_;
  std::vector<uint64_t> end_limit_;  // where entry i's bytes must end: next header or the directory
  NameIndex index_;                  // name -> entry
  std::string prefix_;
  // Local-header offsets resolved lazily, for entries whose offset was not computed (null when
  // every offset was); shared_ptr so that ZipReader stays movable with an incomplete type.
  std::shared_ptr<struct ZipOffsetCache> cache_;
};

// torch's data offset for a record whose local header is at `header_offset` (the getOffset
// formula of caffe2/serialize/inline_container.cc, restated): start = header_offset + 30 +
// name_len + 4 (FB extra header), plus 4 + 16/8 for zip64 extras when size or header_offset
// >= 0xFFFFFFFF; data = round_up(start, alignment).
uint64_t torch_data_offset(uint64_t header_offset, size_t name_len, uint64_t size,
                           uint32_t alignment) noexcept;

}  // namespace ckpt::internal
