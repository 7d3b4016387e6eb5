// Streaming inflate (ISA-L igzip, raw deflate; zlib's inflate in a build without ISA-L,
// ckpt_features.h): compressed pieces of kPiece bytes in, output wherever the caller points it.

#include "zip/inflate_stream.h"

#include "ckpt_features.h"
#if CKPT_HAVE_ISAL
#include <isa-l/igzip_lib.h>
#else
#include <zlib.h>
#endif

#include <algorithm>

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {
constexpr uint64_t kPiece = 1 << 20;  // compressed bytes per read
}  // namespace

#if CKPT_HAVE_ISAL
struct InflateStream::State {
  ::inflate_state s{};  // zeroed: isal_inflate_init does not set every field
  State() {
    isal_inflate_init(&s);
    s.crc_flag = ISAL_DEFLATE;
  }
  // One step; false for a corrupt stream. Sets `finished` at the final block's end.
  bool step(bool& finished) {
    const int r = isal_inflate(&s);
    error = r;
    if (r < 0 || (r != ISAL_DECOMP_OK && r != ISAL_END_INPUT && r != ISAL_OUT_OVERFLOW))
      return false;
    finished = s.block_state == ISAL_BLOCK_FINISH;
    return true;
  }
  std::string what() const { return "igzip error " + std::to_string(error); }
  int error = 0;
};
#else
struct InflateStream::State {
  z_stream s{};
  State() {
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) throw std::bad_alloc();
  }
  ~State() { inflateEnd(&s); }
  bool step(bool& finished) {
    const int r = inflate(&s, Z_NO_FLUSH);
    error = r;
    // Z_BUF_ERROR: no progress possible this call (the caller refuses a stream that stalls).
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR) return false;
    finished = r == Z_STREAM_END;
    return true;
  }
  std::string what() const {
    return std::string("zlib error ") + std::to_string(error) +
           (s.msg ? std::string(": ") + s.msg : "");
  }
  int error = 0;
};
#endif

InflateStream::InflateStream(const ByteSource& source, std::string record, uint64_t offset,
                             uint64_t compressed)
    : source_(source),
      record_(std::move(record)),
      offset_(offset),
      end_(offset + compressed),
      next_(offset),
      state_(std::make_unique<State>()) {}

InflateStream::~InflateStream() = default;

size_t InflateStream::read(std::span<std::byte> out) {
  if (finished_ || out.empty()) return 0;
  auto& s = state_->s;
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
    const bool ok = state_->step(finished_);
    const size_t got = room - s.avail_out;
    written += got;
    produced_ += got;
    if (!ok)
      throw Error(ErrorCode::kCorrupt, "corrupt deflate stream (" + state_->what() + ")",
                  source_.name(), record_, next_ - s.avail_in);
    // No progress with input left and room left would loop forever: never seen, but refuse.
    if (got == 0 && s.avail_in == in_before && s.avail_in != 0 && !finished_)
      throw Error(ErrorCode::kCorrupt, "deflate stream makes no progress", source_.name(), record_,
                  next_ - s.avail_in);
  }
  return written;
}

}  // namespace ckpt::internal
