#pragma once
// Shared pieces of the fuzz targets: limits small enough that a fuzzer-made file cannot ask for
// more memory than libFuzzer's -rss_limit_mb, and the one exception a parser may throw.
//
// A target must return normally or throw ckpt::Error; anything else (another exception, a
// sanitizer report, an abort) is a finding.

#include <cstddef>
#include <cstdint>
#include <span>

#include "ckpt/error.h"
#include "ckpt/options.h"

namespace ckpt::fuzz {

// Small limits keep each execution fast; the checks they drive are the same as with the
// defaults, which are only larger numbers.
inline Limits fuzz_limits() {
  Limits l;
  l.max_metadata_bytes = 16 << 20;
  l.max_tensors = 1 << 16;
  l.max_pickle_memo = 1 << 16;
  l.max_pickle_stack = 1 << 16;
  l.max_inflated_bytes = 64 << 20;
  l.max_records = 1 << 16;
  return l;
}

inline std::span<const std::byte> as_span(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

}  // namespace ckpt::fuzz
