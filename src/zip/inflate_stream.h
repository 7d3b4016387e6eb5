#pragma once
// Streaming inflate of one deflated zip entry (ISA-L, else zlib): the compressed bytes are read a
// piece at a time and the output goes wherever the caller points it, so that neither side is ever
// held whole. Used to inflate straight into a tensor, to check a CRC with a bounded buffer, and to
// see a record's first bytes before the rest is inflated.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ckpt/source.h"

namespace ckpt::internal {

class InflateStream {
 public:
  // Inflates the raw deflate stream at [offset, offset + compressed) of `source`; `record` names
  // it in errors. Keeps `source` by reference: it must outlive the stream. Not thread-safe (one
  // stream per thread).
  InflateStream(const ByteSource& source, std::string record, uint64_t offset, uint64_t compressed);
  ~InflateStream();
  InflateStream(const InflateStream&) = delete;
  InflateStream& operator=(const InflateStream&) = delete;

  // Inflates into `out` until it is full or the stream ends; returns the bytes written (0 only
  // when the stream has ended or `out` is empty). Throws Error{kCorrupt} for a corrupt stream or
  // one that needs more compressed bytes than it has, naming the record and the offset reached;
  // I/O errors of the source name the record.
  size_t read(std::span<std::byte> out);
  // The deflate stream's final block has been inflated.
  bool finished() const { return finished_; }
  // Bytes produced so far.
  uint64_t produced() const { return produced_; }

 private:
  const ByteSource& source_;
  std::string record_;
  uint64_t offset_, end_, next_;  // compressed range, and where the next piece starts
  Bytes piece_;                   // the compressed piece being inflated
  struct State;                   // the inflater (inflate_stream.cc)
  std::unique_ptr<State> state_;
  bool finished_ = false;
  uint64_t produced_ = 0;
};

}  // namespace ckpt::internal
