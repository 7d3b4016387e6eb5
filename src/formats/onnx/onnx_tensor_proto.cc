// A TensorProto's fields (onnx_tensor_proto.h).

#include "formats/onnx/onnx_tensor_proto.h"

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {

[[noreturn]] void corrupt(const std::string& file, const std::string& msg, uint64_t at) {
  throw Error(ErrorCode::kCorrupt, msg, file, {}, at);
}

}  // namespace

TensorProtoFields read_tensor_proto(std::span<const uint8_t> b, uint64_t base, uint64_t file_end,
                                    uint64_t max_dims, const std::string& file) {
  TensorProtoFields t;
  t.ext_at = base;
  onnx::Reader r(b, base, file_end, "a TensorProto");
  onnx::Field f;
  while (r.next(f)) {
    switch (f.number) {
      case 1:
        if (f.wire == onnx::kLen) {
          if (!onnx::for_each_packed_varint(f.bytes, [&](uint64_t v) {
                if (t.dims.size() <= max_dims) t.dims.push_back(static_cast<int64_t>(v));
              }))
            corrupt(file, "malformed packed dims", f.offset);
        } else if (f.wire == onnx::kVarint) {
          t.dims.push_back(static_cast<int64_t>(f.value));
        }
        if (t.dims.size() > max_dims)
          throw Error(ErrorCode::kLimitExceeded,
                      "more than " + std::to_string(max_dims) + " dims (Limits::max_dims)", file,
                      {}, f.offset);
        break;
      case 2:
        if (f.wire == onnx::kVarint) t.data_type = static_cast<int64_t>(f.value);
        break;
      case 3:
        t.segment = true;
        break;
      case 6:
        t.has_strings = true;
        break;
      case 8:
        if (f.wire == onnx::kLen) t.name = std::string(f.str());
        break;
      case 9:
        if (f.wire != onnx::kLen) corrupt(file, "raw_data is not length-delimited", f.tag_offset);
        if (t.raw) corrupt(file, "a second raw_data field", f.tag_offset);
        t.raw = f;
        break;
      case 4:
      case 5:
      case 7:
      case 10:
      case 11:
        t.typed_seen.emplace(f.number, f.tag_offset);
        break;
      case 13: {
        if (f.wire != onnx::kLen) corrupt(file, "external_data is not a message", f.tag_offset);
        onnx::Reader e(f.bytes, f.offset, file_end, "a StringStringEntryProto");
        onnx::Field g;
        std::string k, v;
        while (e.next(g)) {
          if (g.wire != onnx::kLen) continue;
          if (g.number == 1) k = std::string(g.str());
          if (g.number == 2) v = std::string(g.str());
        }
        t.ext.emplace_back(std::move(k), std::move(v));
        t.ext_at = f.offset;
        break;
      }
      case 14:
        if (f.wire == onnx::kVarint) t.external = f.value == 1;
        break;
      default:
        break;
    }
  }
  return t;
}

uint64_t parse_decimal(const std::string& s, const char* key, const std::string& tensor,
                       uint64_t at) {
  if (s.empty() || s.size() > 20)
    throw Error(ErrorCode::kCorrupt,
                std::string("external data ") + key + " \"" + s + "\" is not a decimal number", {},
                tensor, at);
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10)
      throw Error(
          ErrorCode::kCorrupt,
          std::string("external data ") + key + " \"" + s + "\" is not a decimal number below 2^64",
          {}, tensor, at);
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

OnnxPrepacked parse_prepacked(const std::string& tensor, const std::string& location,
                              const std::string& key, const std::string& value, uint64_t base,
                              uint64_t ext_at, const std::string& file) {
  auto malformed = [&](const std::string& msg) {
    throw Error(ErrorCode::kCorrupt, msg, file, tensor, base);
  };
  OnnxPrepacked p;
  p.tensor = tensor;
  p.entry = key;
  p.location = location;
  // KEY|off;len;ck|off;len;ck...
  size_t bar = value.find('|');
  if (bar == std::string::npos || bar == 0)
    malformed("pre-packed entry \"" + key + "\" = \"" + value +
              "\" is not KEY|offset;length;checksum");
  p.key = value.substr(0, bar);
  size_t at = bar + 1;
  while (at <= value.size()) {
    size_t next = value.find('|', at);
    std::string grp = value.substr(at, next == std::string::npos ? std::string::npos : next - at);
    size_t s1 = grp.find(';'), s2 = s1 == std::string::npos ? s1 : grp.find(';', s1 + 1);
    if (s2 == std::string::npos)
      malformed("pre-packed entry \"" + key + "\" has a buffer \"" + grp +
                "\" that is not offset;length;checksum");
    OnnxPrepackedBuffer buf;
    buf.offset = parse_decimal(grp.substr(0, s1), "pre-pack offset", tensor, ext_at);
    buf.length = parse_decimal(grp.substr(s1 + 1, s2 - s1 - 1), "pre-pack length", tensor, ext_at);
    buf.checksum = grp.substr(s2 + 1);
    p.buffers.push_back(std::move(buf));
    if (next == std::string::npos) break;
    at = next + 1;
  }
  return p;
}

}  // namespace ckpt::internal
