// Zip writer in torch's exact layout (PyTorchStreamWriter over miniz in zip64 mode). Per record:
//   local header 30 B (needed 0|20, flags 0x0808|0x0800, method, time 0, date 0, crc/sizes 0)
//   name, [zip64 extra: 0001 len, u64 size + u64 0 if size >= 4G, u64 header offset if >= 4G],
//   FB extra ("FB", u16 n, 'Z' * n) that puts the data at torch_data_offset(),
//   data, [descriptor 08074b50 crc csize size: u32s (16 B), u64s (24 B) with zip64; not if empty]
// Then central headers (made by 0, needed 0|20, no FB extra, zip64 extra where a field
// saturates), zip64 end record (made by 0x031E, needed 45), zip64 locator, end record.
// Byte layouts: zip_format.h; the facts: docs/formats/torch.md "torch.save zip", **Zip layout**,
// checked against a file written by torch 1.13 (tests/data/zip/).

#include "zip/zip_writer.h"

// libdeflate compresses when it is found, else zlib (ckpt_features.h).
#include "ckpt_features.h"
#if CKPT_HAVE_LIBDEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include <algorithm>
#include <memory>

#include "ckpt/error.h"
#include "util/bytes.h"
#include "util/crc32.h"
#include "zip/zip_format.h"
#include "zip/zip_reader.h"

namespace ckpt::internal {

using namespace zipfmt;  // NOLINT: the record constants are this file's vocabulary

namespace {

// torch 1.13 writes DOS time 0 and date 0 in every header (its miniz is built without time
// support); doing the same keeps our output deterministic and byte-identical to torch's.
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = 0;
// miniz: "version made by" 0 in central headers; 0x031E (Unix, 3.0) and version needed 45
// (zip64) in the zip64 end record.
constexpr uint16_t kZip64MadeBy = 0x031E;
constexpr uint16_t kZip64Needed = 45;
constexpr uint16_t kNeededDeflate = 20;

std::span<const std::byte> bytes_of(const std::string& s) { return as_bytes(s); }

// zip64 extra field as miniz writes it: sizes when the size saturates, the header offset when it
// does. `compressed_size` is 0 in the local copy (miniz does not know it yet there).
void append_zip64_extra(std::string& out, uint64_t header_offset, uint64_t size,
                        uint64_t compressed_size) {
  if (!torch_needs_zip64(header_offset, size)) return;
  const bool big_size = size >= kMax32, big_offset = header_offset >= kMax32;
  append_le<uint16_t>(out, kZip64ExtraId);
  append_le<uint16_t>(out, static_cast<uint16_t>(8 * (2 * big_size + big_offset)));
  if (big_size) {
    append_le<uint64_t>(out, size);
    append_le<uint64_t>(out, compressed_size);
  }
  if (big_offset) append_le<uint64_t>(out, header_offset);
}

uint32_t clamp32(uint64_t v) { return static_cast<uint32_t>(std::min<uint64_t>(v, kMax32)); }

}  // namespace

ZipWriter::ZipWriter(ByteSink& sink, std::string prefix, uint32_t alignment)
    : sink_(sink), prefix_(std::move(prefix)), alignment_(alignment) {
  // The padding length is a u16, so an alignment of 64 KiB could need 65535+ bytes of it.
  if (!is_pow2(alignment) || alignment >= 65536)
    throw Error(
        ErrorCode::kInvalidArgument,
        "zip alignment must be a power of two below 65536, got " + std::to_string(alignment),
        sink_.name());
}

ZipWriter::~ZipWriter() = default;

std::string ZipWriter::full_name(std::string_view name) const {
  const std::string& dst = sink_.name();
  if (finished_)
    throw Error(ErrorCode::kInvalidArgument, "record added after finish()", dst, std::string(name));
  if (open_)
    throw Error(ErrorCode::kInvalidArgument,
                "record started while '" + central_.back().name + "' is still open", dst,
                std::string(name));
  std::string full = prefix_ + std::string(name);
  if (name.empty() || full.size() > kMax16)
    throw Error(ErrorCode::kInvalidArgument,
                "record name must have 1 to 65535 bytes with its folder", dst, full);
  if (const char* problem = name_problem(full))
    throw Error(ErrorCode::kInvalidArgument, problem, dst, full);
  if (names_.count(full))
    throw Error(ErrorCode::kInvalidArgument, "duplicate record name", dst, full);
  return full;
}

void ZipWriter::start_record(std::string full, uint64_t size, uint16_t method) {
  const uint64_t h = sink_.position();
  std::string z64;
  append_zip64_extra(z64, h, size, 0);
  const uint64_t data_at = torch_data_offset(h, full.size(), size, alignment_);
  const uint64_t pad = data_at - (h + kLocalSize + full.size() + z64.size() + kFbHeaderSize);
  const uint16_t flags = size > 0 ? (kFlagDescriptor | kFlagUtf8) : kFlagUtf8;

  std::string hdr;
  hdr.reserve(kLocalSize + full.size() + z64.size() + kFbHeaderSize + pad);
  append_le<uint32_t>(hdr, kLocalSig);
  append_le<uint16_t>(hdr, method == kMethodDeflate ? kNeededDeflate : 0);
  append_le<uint16_t>(hdr, flags);
  append_le<uint16_t>(hdr, method);
  append_le<uint16_t>(hdr, kDosTime);
  append_le<uint16_t>(hdr, kDosDate);
  append_le<uint32_t>(hdr, 0);  // crc, compressed and uncompressed size: in the descriptor
  append_le<uint32_t>(hdr, 0);
  append_le<uint32_t>(hdr, 0);
  append_le<uint16_t>(hdr, static_cast<uint16_t>(full.size()));
  append_le<uint16_t>(hdr, static_cast<uint16_t>(z64.size() + kFbHeaderSize + pad));
  hdr += full;
  hdr += z64;
  hdr += "FB";
  append_le<uint16_t>(hdr, static_cast<uint16_t>(pad));
  hdr.append(pad, 'Z');
  sink_.write(bytes_of(hdr));

  names_.insert(full);
  Central c;
  c.name = std::move(full);
  c.header_offset = h;
  c.size = size;
  c.method = method;
  c.flags = flags;
  central_.push_back(std::move(c));
}

void ZipWriter::end_record(uint32_t crc, uint64_t compressed_size) {
  Central& c = central_.back();
  c.crc = crc;
  c.compressed_size = compressed_size;
  if (c.size > 0) {
    std::string d;
    append_le<uint32_t>(d, kDescriptorSig);
    append_le<uint32_t>(d, crc);
    if (torch_needs_zip64(c.header_offset, c.size)) {
      append_le<uint64_t>(d, compressed_size);
      append_le<uint64_t>(d, c.size);
    } else {
      append_le<uint32_t>(d, static_cast<uint32_t>(compressed_size));
      append_le<uint32_t>(d, static_cast<uint32_t>(c.size));
    }
    sink_.write(bytes_of(d));
  }
  written_.emplace_back(c.name.substr(prefix_.size()), crc);
}

void ZipWriter::add(std::string_view name, std::span<const std::byte> data) {
  begin(name, data.size());
  write(data);
  end();
}

void ZipWriter::add(std::string_view name, std::string_view data) { add(name, as_bytes(data)); }

void ZipWriter::begin(std::string_view name, uint64_t size) {
  start_record(full_name(name), size, kMethodStored);
  open_ = true;
  open_size_ = size;
  open_written_ = 0;
  open_crc_ = 0;
}

void ZipWriter::write(std::span<const std::byte> piece) {
  write_unchecked(piece);  // checks and writes; the piece is still in cache for its CRC
  // An empty span must not reach the CRC (libdeflate answered a null pointer with 0).
  if (!piece.empty()) open_crc_ = crc32(open_crc_, piece);
}

void ZipWriter::check_piece(std::span<const std::byte> piece) const {
  if (!open_) throw Error(ErrorCode::kInvalidArgument, "write() without begin()", sink_.name());
  if (piece.size() > open_size_ - open_written_)
    throw Error(ErrorCode::kInvalidArgument,
                "pieces pass the declared size of " + std::to_string(open_size_) + " bytes",
                sink_.name(), central_.back().name, sink_.position());
}

void ZipWriter::write_unchecked(std::span<const std::byte> piece) {
  check_piece(piece);
  if (piece.empty()) return;
  sink_.write(piece);
  open_written_ += piece.size();
}

void ZipWriter::write_sliced(std::span<const std::byte> piece, size_t slice,
                             const ByteSink::SliceVisitor& visit) {
  check_piece(piece);
  if (piece.empty()) return;
  sink_.write_sliced(piece, slice, visit);
  open_written_ += piece.size();
}

void ZipWriter::end(uint32_t crc) {
  open_crc_ = crc;
  end();
}

void ZipWriter::end() {
  if (!open_) throw Error(ErrorCode::kInvalidArgument, "end() without begin()", sink_.name());
  if (open_written_ != open_size_)
    throw Error(ErrorCode::kInvalidArgument,
                "record ended after " + std::to_string(open_written_) + " of its declared " +
                    std::to_string(open_size_) + " bytes",
                sink_.name(), central_.back().name, sink_.position());
  open_ = false;
  end_record(open_crc_, open_size_);
}

namespace {

// Raw deflate of `data` at `level` (libdeflate 1-12, zlib 1-9) into `out`; 0 when it fails.
size_t deflate_raw(std::span<const std::byte> data, int level, std::unique_ptr<std::byte[]>& out) {
#if CKPT_HAVE_LIBDEFLATE
  struct Free {
    void operator()(libdeflate_compressor* c) const { libdeflate_free_compressor(c); }
  };
  std::unique_ptr<libdeflate_compressor, Free> comp(
      libdeflate_alloc_compressor(std::clamp(level, 1, 12)));
  if (!comp) throw std::bad_alloc();
  const size_t bound = libdeflate_deflate_compress_bound(comp.get(), data.size());
  out.reset(new std::byte[bound]);
  return libdeflate_deflate_compress(comp.get(), data.data(), data.size(), out.get(), bound);
#else
  z_stream z{};
  if (deflateInit2(&z, std::clamp(level, 1, 9), Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK)
    throw std::bad_alloc();
  const size_t bound = deflateBound(&z, data.size());
  out.reset(new std::byte[bound]);
  z.next_out = reinterpret_cast<Bytef*>(out.get());
  size_t in_left = data.size(), out_left = bound;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data.data()));
  int r = Z_OK;
  // avail_in and avail_out are 32-bit: feed and drain at most 1 GiB a call.
  while (r == Z_OK) {
    const uInt in = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
    const uInt room = static_cast<uInt>(std::min<size_t>(out_left, 1u << 30));
    z.avail_in = in;
    z.avail_out = room;
    r = deflate(&z, in == in_left ? Z_FINISH : Z_NO_FLUSH);
    in_left -= in - z.avail_in;
    out_left -= room - z.avail_out;
  }
  deflateEnd(&z);
  return r == Z_STREAM_END ? bound - out_left : 0;
#endif
}

}  // namespace

void ZipWriter::add_deflated(std::string_view name, std::span<const std::byte> data, int level) {
  if (level < 0) level = 6;  // miniz: a negative level means the default
  // miniz stores records of 3 bytes or less, and everything at level 0.
  if (data.size() <= 3 || level == 0) return add(name, data);
  std::string full = full_name(name);

  std::unique_ptr<std::byte[]> out;
  const size_t csize = deflate_raw(data, level, out);
  if (csize == 0) throw Error(ErrorCode::kIo, "deflate failed", sink_.name(), full);
  // miniz decides on zip64 by the uncompressed size only; a compressed size that saturates
  // while the size does not cannot be written in its layout.
  if (csize >= kMax32 && data.size() < kMax32)
    throw Error(ErrorCode::kUnsupported, "deflated record grew past 4 GiB", sink_.name(), full);
  const uint32_t crc = crc32(data);
  start_record(std::move(full), data.size(), kMethodDeflate);
  sink_.write(std::span<const std::byte>(out.get(), csize));
  end_record(crc, csize);
}

uint64_t ZipWriter::next_data_offset(std::string_view name, uint64_t size) const {
  return torch_data_offset(sink_.position(), prefix_.size() + name.size(), size, alignment_);
}

uint64_t ZipWriter::stored_end(std::string_view name, uint64_t size, uint64_t header_offset) const {
  const uint64_t data_at =
      torch_data_offset(header_offset, prefix_.size() + name.size(), size, alignment_);
  if (size == 0) return data_at;  // no descriptor after an empty record
  return data_at + size +
         (torch_needs_zip64(header_offset, size) ? kDescriptorSize64 : kDescriptorSize32);
}

void ZipWriter::finish() {
  if (finished_) throw Error(ErrorCode::kInvalidArgument, "finish() called twice", sink_.name());
  if (open_)
    throw Error(ErrorCode::kInvalidArgument, "finish() while a record is open", sink_.name(),
                central_.back().name);
  // miniz puts the directory at offset 0 when there are no records.
  const uint64_t cd_offset = central_.empty() ? 0 : sink_.position();
  std::string out;
  for (const Central& c : central_) {
    std::string z64;
    append_zip64_extra(z64, c.header_offset, c.size, c.compressed_size);
    append_le<uint32_t>(out, kCentralSig);
    append_le<uint16_t>(out, 0);  // made by
    append_le<uint16_t>(out, c.method == kMethodDeflate ? kNeededDeflate : 0);
    append_le<uint16_t>(out, c.flags);
    append_le<uint16_t>(out, c.method);
    append_le<uint16_t>(out, kDosTime);
    append_le<uint16_t>(out, kDosDate);
    append_le<uint32_t>(out, c.crc);
    append_le<uint32_t>(out, clamp32(c.compressed_size));
    append_le<uint32_t>(out, clamp32(c.size));
    append_le<uint16_t>(out, static_cast<uint16_t>(c.name.size()));
    append_le<uint16_t>(out, static_cast<uint16_t>(z64.size()));
    append_le<uint16_t>(out, 0);  // comment
    append_le<uint16_t>(out, 0);  // disk
    append_le<uint16_t>(out, 0);  // internal attributes
    append_le<uint32_t>(out, 0);  // external attributes
    append_le<uint32_t>(out, clamp32(c.header_offset));
    out += c.name;
    out += z64;
  }
  const uint64_t cd_size = out.size();
  const uint64_t n = central_.size();
  const uint64_t z64_end_at = sink_.position() + cd_size;

  append_le<uint32_t>(out, kZip64EndSig);
  append_le<uint64_t>(out, kZip64EndSize - 12);  // size of the rest of the record
  append_le<uint16_t>(out, kZip64MadeBy);
  append_le<uint16_t>(out, kZip64Needed);
  append_le<uint32_t>(out, 0);  // this disk
  append_le<uint32_t>(out, 0);  // directory's disk
  append_le<uint64_t>(out, n);
  append_le<uint64_t>(out, n);
  append_le<uint64_t>(out, cd_size);
  append_le<uint64_t>(out, cd_offset);

  append_le<uint32_t>(out, kZip64LocatorSig);
  append_le<uint32_t>(out, 0);  // disk of the zip64 end record
  append_le<uint64_t>(out, z64_end_at);
  append_le<uint32_t>(out, 1);  // disks

  append_le<uint32_t>(out, kEndSig);
  append_le<uint16_t>(out, 0);
  append_le<uint16_t>(out, 0);
  append_le<uint16_t>(out, static_cast<uint16_t>(std::min<uint64_t>(n, kMax16)));
  append_le<uint16_t>(out, static_cast<uint16_t>(std::min<uint64_t>(n, kMax16)));
  append_le<uint32_t>(out, clamp32(cd_size));
  append_le<uint32_t>(out, clamp32(cd_offset));
  append_le<uint16_t>(out, 0);  // comment

  sink_.write(bytes_of(out));
  finished_ = true;
}

}  // namespace ckpt::internal
