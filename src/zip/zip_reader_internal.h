#pragma once
// What zip_reader.cc (the directory) and zip_records.cc (a record's bytes) share.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ckpt/error.h"
#include "ckpt/source.h"
#include "util/bytes.h"

namespace ckpt::internal {

struct ZipOffsetCache {
  explicit ZipOffsetCache(size_t n) : offsets(new std::atomic<uint64_t>[n]) {
    for (size_t i = 0; i < n; ++i) offsets[i].store(UINT64_MAX, std::memory_order_relaxed);
  }
  // UINT64_MAX until the local header was read. Two threads may both read it; they store the
  // same value, so a lock would only add contention.
  std::unique_ptr<std::atomic<uint64_t>[]> offsets;
};

namespace zipimpl {

[[noreturn]] inline void fail(ErrorCode code, std::string message, const std::string& source,
                              std::string_view record, uint64_t offset) {
  throw Error(code, std::move(message), source, std::string(record), offset);
}

// A read on behalf of an entry: I/O errors name the entry too.
inline Bytes read_for(const ByteSource& src, std::string_view record, uint64_t offset,
                      uint64_t len) {
  try {
    return src.read(offset, len);
  } catch (Error& e) {
    e.with_record(std::string(record));
    throw;
  }
}

}  // namespace zipimpl
}  // namespace ckpt::internal
