// Streaming inflate (ISA-L igzip, raw deflate): compressed pieces of kPiece bytes in, output
// wherever the caller points it.

#include "zip/inflate_stream.h"

#include <isa-l/igzip_lib.h>

#include <algorithm>

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {
constexpr uint64_t kPiece = 1 << 20;  // compressed bytes per read
}  // namespace

InflateStream::InflateStream(const ByteSource& source, std::string record, uint64_t offset,
                             uint64_t compressed)
    : source_(source),
      record_(std::move(record)),
      offset_(offset),
      end_(offset + compressed),
      next_(offset),
      state_(std::make_unique<::inflate_state>()) {
  isal_inflate_init(state_.get());
  state_->crc_flag = ISAL_DEFLATE;
}

InflateStream::~InflateStream() = default;

size_t InflateStream::read(std::span<std::byte> out) {
  if (finished_ || out.empty()) return 0;
  ::inflate_state& s = *state_;
  // avail_out is 32-bit: hand out at most 1 GiB per call and loop.
  size_t written = 0;
  while (written < out.size() && !finished_) {
    const size_t room = std::min<size_t>(out.size() - written, 1u << 30);
    s.next_out = reinterpret_cast<uint8_t*>(out.data() + written);
    s.avail_out = static_cast<uint32_t>(room);
    if (s.avail_in == 0) {
      if (next_ >= end_)
        throw Error(ErrorCode::kCorrupt,
                    "deflate stream ends before its last block (after " +
                        std::to_string(end_ - offset_) + " compressed bytes)",
                    source_.name(), record_, end_);
      const uint64_t n = std::min(kPiece, end_ - next_);
      try {
        piece_ = source_.read(next_, n);
      } catch (Error& e) {
        e.with_record(record_);
        throw;
      }
      s.next_in = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(piece_.data.data()));
      s.avail_in = static_cast<uint32_t>(n);
      next_ += n;
    }
    const uint64_t in_before = s.avail_in;
    const int r = isal_inflate(&s);
    const size_t got = room - s.avail_out;
    written += got;
    produced_ += got;
    if (r < 0 || (r != ISAL_DECOMP_OK && r != ISAL_END_INPUT && r != ISAL_OUT_OVERFLOW))
      throw Error(ErrorCode::kCorrupt, "corrupt deflate stream (igzip error " + std::to_string(r) + ")",
                  source_.name(), record_, next_ - s.avail_in);
    if (s.block_state == ISAL_BLOCK_FINISH) finished_ = true;
    // No progress with input left and room left would loop forever: never seen, but refuse.
    if (got == 0 && s.avail_in == in_before && s.avail_in != 0 && !finished_)
      throw Error(ErrorCode::kCorrupt, "deflate stream makes no progress", source_.name(),
                  record_, next_ - s.avail_in);
  }
  return written;
}

}  // namespace ckpt::internal
