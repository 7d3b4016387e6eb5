#pragma once
// Helpers for the zip tests: building archives with ZipWriter, locating and patching fields.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/sink.h"
#include "ckpt/source.h"
#include "zip/zip_format.h"
#include "zip/zip_writer.h"

namespace ckpt::test {

inline std::string zip_fixture(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path() / ".." / "data" / "zip" / name).string();
}

inline std::vector<std::byte> build_zip(const std::function<void(internal::ZipWriter&)>& fill,
                                        const std::string& prefix = "archive/",
                                        uint32_t alignment = 64) {
  MemorySink sink;
  internal::ZipWriter w(sink, prefix, alignment);
  fill(w);
  w.finish();
  return sink.take();
}

template <typename T>
T get_at(const std::vector<std::byte>& b, uint64_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <typename T>
void put_at(std::vector<std::byte>& b, uint64_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

// Where the records of an archive written by ZipWriter (always zip64 end records, no comment)
// are.
struct ZipLayout {
  uint64_t eocd = 0, locator = 0, zip64_end = 0;
  uint64_t cd_offset = 0, cd_size = 0, count = 0;
  std::vector<uint64_t> central;  // offset of each central header
  std::vector<uint64_t> local;    // local header offset of each entry, in directory order
};

inline ZipLayout zip_layout(const std::vector<std::byte>& b) {
  ZipLayout l;
  l.eocd = b.size() - internal::zipfmt::kEndSize;
  l.locator = l.eocd - internal::zipfmt::kZip64LocatorSize;
  l.zip64_end = get_at<uint64_t>(b, l.locator + 8);
  l.count = get_at<uint64_t>(b, l.zip64_end + 32);
  l.cd_size = get_at<uint64_t>(b, l.zip64_end + 40);
  l.cd_offset = get_at<uint64_t>(b, l.zip64_end + 48);
  uint64_t p = l.cd_offset;
  for (uint64_t i = 0; i < l.count; ++i) {
    l.central.push_back(p);
    l.local.push_back(get_at<uint32_t>(b, p + 42));
    p += 46 + get_at<uint16_t>(b, p + 28) + get_at<uint16_t>(b, p + 30) +
         get_at<uint16_t>(b, p + 32);
  }
  return l;
}

inline std::span<const std::byte> as_span(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace ckpt::test
