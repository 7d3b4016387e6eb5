#pragma once
// Small writes gathered into one buffer, so that a file sink sees few, large writes; a piece of
// `limit` bytes or more goes straight from the caller's memory (after what is gathered). Used by
// the safetensors and tensorizer writers between their headers and tensor data.

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "ckpt/sink.h"

namespace ckpt::internal {

class Gather {
 public:
  static constexpr size_t kDefaultLimit = size_t{1} << 20;

  explicit Gather(ByteSink& sink, size_t limit = kDefaultLimit) : sink_(sink), limit_(limit) {}
  Gather(const Gather&) = delete;
  Gather& operator=(const Gather&) = delete;

  // Appends `b` after everything written before (the sink sees the same bytes in the same order
  // as with direct writes, once flush() has run).
  void write(std::span<const std::byte> b) {
    if (b.size() >= limit_) {
      flush();
      sink_.write(b);
      return;
    }
    if (buf_.size() + b.size() > limit_) flush();
    buf_.insert(buf_.end(), b.begin(), b.end());
  }
  void write(std::string_view s) {
    write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }
  // Writes what is gathered. Call before using the sink directly (position(), patch(), commit()):
  // the destructor does not flush (a sink write may throw).
  void flush() {
    if (!buf_.empty()) sink_.write(buf_);
    buf_.clear();
  }
  // Bytes gathered and not yet written.
  size_t pending() const noexcept { return buf_.size(); }

 private:
  ByteSink& sink_;
  size_t limit_;
  std::vector<std::byte> buf_;
};

}  // namespace ckpt::internal
