#pragma once
// A protobuf wire-format reader that keeps byte offsets (docs/design/decisions.md, "ONNX"):
// ONNX's ModelProto is read field by field from the file's bytes, so an initializer's raw_data is a
// range of the file (a zero-copy storage) and a rewrite can copy every other field's bytes as
// they are. Nothing in it trusts a length: every varint is bounded to 10 bytes, every
// length-delimited field must fit in its parent, groups (wire types 3, 4) and field number 0 are
// refused. Errors are Error{kCorrupt} (kTruncated when a field passes the end of the file)
// naming the absolute byte offset.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/error.h"

namespace ckpt::internal::onnx {

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

struct Field {
  uint32_t number = 0;
  uint8_t wire = 0;
  uint64_t value = 0;              // varint / fixed value
  std::span<const uint8_t> bytes;  // kLen payload
  uint64_t tag_offset = 0;         // absolute offset of the tag
  uint64_t offset = 0;             // absolute offset of the payload (kLen) or value
  uint64_t end = 0;                // absolute offset just past the field

  std::string_view str() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
};

// Reads a message: `buf` holds its bytes, `base` is the absolute offset of buf[0] in the file,
// `file_end` the absolute size of the whole message tree's source (a field that passes it is
// truncated, one that passes only its parent is corrupt).
class Reader {
 public:
  Reader(std::span<const uint8_t> buf, uint64_t base, uint64_t file_end, std::string what)
      : buf_(buf), base_(base), file_end_(file_end), what_(std::move(what)) {}

  bool done() const { return pos_ >= buf_.size(); }

  // Reads the next field; false at the end of the message.
  bool next(Field& f) {
    if (pos_ >= buf_.size()) return false;
    f.tag_offset = base_ + pos_;
    uint64_t tag = varint("a field tag");
    f.wire = static_cast<uint8_t>(tag & 7);
    if ((tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
      fail("field number " + std::to_string(tag >> 3) + " in " + what_, f.tag_offset);
    f.number = static_cast<uint32_t>(tag >> 3);
    f.bytes = {};
    switch (f.wire) {
      case kVarint:
        f.offset = base_ + pos_;
        f.value = varint("a varint field");
        break;
      case kFixed64:
        f.offset = base_ + pos_;
        f.value = fixed(8);
        break;
      case kFixed32:
        f.offset = base_ + pos_;
        f.value = fixed(4);
        break;
      case kLen: {
        uint64_t n = varint("a length");
        f.offset = base_ + pos_;
        if (n > buf_.size() - pos_) {
          bool cut = base_ + buf_.size() >= file_end_;
          throw Error(cut ? ErrorCode::kTruncated : ErrorCode::kCorrupt,
                      "field " + std::to_string(f.number) + " of " + what_ + " claims " +
                          std::to_string(n) + " bytes but " + std::to_string(buf_.size() - pos_) +
                          " remain" + (cut ? " in the file" : " in its message"),
                      {}, {}, f.offset);
        }
        f.bytes = buf_.subspan(pos_, static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n);
        break;
      }
      default:
        fail("wire type " + std::to_string(f.wire) + " (groups are not used by ONNX) in " + what_,
             f.tag_offset);
    }
    f.end = base_ + pos_;
    return true;
  }

  [[noreturn]] void fail(const std::string& msg, uint64_t at) const {
    throw Error(ErrorCode::kCorrupt, msg, {}, {}, at);
  }

 private:
  uint64_t varint(const char* what) {
    uint64_t v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= buf_.size()) {
        bool cut = base_ + buf_.size() >= file_end_;
        throw Error(cut ? ErrorCode::kTruncated : ErrorCode::kCorrupt,
                    std::string("the message ends inside ") + what + " in " + what_, {}, {},
                    base_ + pos_);
      }
      uint8_t b = buf_[pos_++];
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if (!(b & 0x80)) return v;
    }
    fail(std::string("a varint longer than 10 bytes (") + what + ") in " + what_, base_ + pos_);
  }
  uint64_t fixed(size_t n) {
    if (buf_.size() - pos_ < n) {
      bool cut = base_ + buf_.size() >= file_end_;
      throw Error(cut ? ErrorCode::kTruncated : ErrorCode::kCorrupt,
                  "the message ends inside a fixed-size field in " + what_, {}, {}, base_ + pos_);
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{buf_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }

  std::span<const uint8_t> buf_;
  uint64_t base_;
  uint64_t file_end_;
  std::string what_;
  size_t pos_ = 0;
};

// Decodes the varints of a packed field; false (at `bad`) on a malformed or overlong one.
template <class Fn>
bool for_each_packed_varint(std::span<const uint8_t> b, Fn&& fn) {
  size_t i = 0;
  while (i < b.size()) {
    uint64_t v = 0;
    int k = 0;
    for (;; ++k) {
      if (k == 10 || i >= b.size()) return false;
      uint8_t c = b[i++];
      v |= uint64_t{c & 0x7fu} << (7 * k);
      if (!(c & 0x80)) break;
    }
    fn(v);
  }
  return true;
}

// Appends a varint to out.
inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_tag(std::string& out, uint32_t number, uint8_t wire) {
  put_varint(out, (uint64_t{number} << 3) | wire);
}
inline void put_len(std::string& out, uint32_t number, std::string_view payload) {
  put_tag(out, number, kLen);
  put_varint(out, payload.size());
  out.append(payload);
}

}  // namespace ckpt::internal::onnx
