#pragma once
// Zip writer that produces torch's exact layout (PyTorchStreamWriter + miniz in zip64 mode):
// stored entries; local header with version-needed 0 (20 when deflated), flags 0x0808 (0x0800 for
// empty records), fixed DOS time/date (deterministic output), crc and sizes 0; zip64 local extra
// only when size or header offset >= 0xFFFFFFFF; the "FB" padding extra ('F','B', u16 len, 'Z'*len)
// aligning data to `alignment`; data descriptor (16 bytes, or 24 with zip64) after non-empty data;
// central directory without the FB extra; zip64 end record + locator + end record.
// See docs/formats/torch.md "torch.save zip", **Zip layout**.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt/sink.h"

namespace ckpt::internal {

class ZipWriter {
 public:
  // `prefix` is the folder ("archive/"), prepended to every record name. alignment: power of two
  // in [1, 65536). Throws Error{kInvalidArgument} otherwise.
  ZipWriter(ByteSink& sink, std::string prefix, uint32_t alignment = 64);

  // A whole stored record. CRC32 computed. Duplicate names: Error{kInvalidArgument}.
  void add(std::string_view name, std::span<const std::byte> data);
  void add(std::string_view name, std::string_view data);
  // A record streamed in pieces: begin with its exact size, write pieces (CRC computed as they
  // pass), end. Error{kInvalidArgument} if the pieces do not add up to `size`.
  void begin(std::string_view name, uint64_t size);
  void write(std::span<const std::byte> piece);
  void end();
  // For callers that compute the CRC themselves (on another thread, while the bytes are being
  // written): pieces passed to write_unchecked() are not checksummed here, and end(crc) takes the
  // caller's CRC of the whole record. Same size checks as write()/end().
  void write_unchecked(std::span<const std::byte> piece);
  void end(uint32_t crc);
  // Like write_unchecked(), through ByteSink::write_sliced(): the sink may write the slices from
  // two threads, calling `visit` on each just before (where the caller takes its CRC).
  void write_sliced(std::span<const std::byte> piece, size_t slice,
                    const ByteSink::SliceVisitor& visit);
  // A deflated record (TorchScript code/ and debug_pkl records), compressed with libdeflate
  // (zlib in a build without it).
  void add_deflated(std::string_view name, std::span<const std::byte> data, int level = 6);

  // Data offset the next record of this name and size would get (for planning).
  uint64_t next_data_offset(std::string_view name, uint64_t size) const;
  // Where a stored record of this name and size whose header starts at `header_offset` ends
  // (past its descriptor): chained from position(), the extent of a run of records.
  uint64_t stored_end(std::string_view name, uint64_t size, uint64_t header_offset) const;
  uint64_t position() const { return sink_.position(); }
  // Writes the central directory and end records. No record may be added after.
  void finish();

  // Names (without prefix) and CRC32s of records written so far, in order.
  const std::vector<std::pair<std::string, uint32_t>>& written() const { return written_; }

 private:
  // What the central directory needs about one record.
  struct Central {
    std::string name;  // full name, with the prefix
    uint64_t header_offset = 0, size = 0, compressed_size = 0;
    uint32_t crc = 0;
    uint16_t method = 0, flags = 0;
  };
  std::string full_name(std::string_view name) const;
  void check_piece(std::span<const std::byte> piece) const;
  void start_record(std::string full, uint64_t size, uint16_t method);
  void end_record(uint32_t crc, uint64_t compressed_size);

  ByteSink& sink_;
  std::string prefix_;
  uint32_t alignment_;
  std::vector<Central> central_;
  std::unordered_set<std::string> names_;  // full names, for the duplicate check
  std::vector<std::pair<std::string, uint32_t>> written_;
  // state of the record being streamed
  bool open_ = false;
  uint64_t open_size_ = 0, open_written_ = 0;
  uint32_t open_crc_ = 0;
  bool finished_ = false;

 public:
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;
};

}  // namespace ckpt::internal
