// Format detection: the first bytes name the format; every opener reads metadata only.

#include "formats/open.h"

#include <cstring>
#include <new>
#include <span>
#include <string>
#include <string_view>

#include "util/bytes.h"

namespace ckpt::internal {
namespace {

// A legacy torch file begins with its magic number pickled as an int, in the encoding of the
// protocol torch.save was given: protocols 2 and 3 PROTO then LONG1 of 10 bytes (LONG4 from
// other picklers); 4 and 5 the same inside a FRAME; 0 and 1 the decimal text of LONG
// ("L1195...L\n", or INT from other picklers). These patterns check the encoding, not the
// number (the reader checks that): a damaged magic number is a corrupt legacy file, not an
// unknown format. Returns 2 when the n bytes hold the whole pattern, 1 when they are a prefix of
// it, 0 otherwise.
int legacy_magic_head(const unsigned char* h, size_t n) {
  auto digits = [&](size_t from, size_t len) {
    for (size_t i = from; i < std::min(n, len); ++i)
      if (h[i] < '0' || h[i] > '9') return 0;
    return n >= len ? 2 : 1;
  };
  if (n == 0) return 0;
  if (h[0] == 'L' || h[0] == 'I') return digits(1, 16);
  if (h[0] != 0x80) return 0;
  if (n < 2) return 1;
  size_t at = 2;  // the LONG1 opcode
  if (h[1] == 4 || h[1] == 5) {
    if (n < 3) return 1;
    if (h[2] == 0x95) at = 11;  // FRAME and its 8-byte length
  } else if (h[1] != 2 && h[1] != 3) {
    return 0;
  }
  if (n <= at) return 1;
  // LONG1 with its 1-byte length 10, or (from other picklers) LONG4 with its 4-byte length 10.
  static constexpr unsigned char kLong1[] = {0x8a, 0x0a};
  static constexpr unsigned char kLong4[] = {0x8b, 0x0a, 0, 0, 0};
  std::span<const unsigned char> want = kLong1;
  if (h[at] == 0x8b) want = kLong4;
  for (size_t i = 0; i < want.size(); ++i) {
    if (n <= at + i) return 1;
    if (h[at + i] != want[i]) return 0;
  }
  return 2;
}

// For a file too short for any format's fixed header (an empty one too): the header its bytes
// begin, if any. Such a file was cut, not written so: truncated rather than of unknown format.
// A safetensors file begins with its header size, a u64 that opening caps at 100,000,000: any
// few bytes whose value stays below the cap can begin one.
const char* cut_header(const unsigned char* h, size_t n) {
  auto prefix = [&](std::string_view magic) {
    return n < magic.size() && std::memcmp(h, magic.data(), n) == 0;
  };
  if (prefix(std::string_view("PK\x03\x04", 4))) return "a zip local header";
  if (legacy_magic_head(h, n) == 1) return "a legacy torch file's magic number";
  if (prefix("|TZR|")) return "a tensorizer file's magic";
  if (n < 8) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{h[i]} << (8 * i);
    if (v <= 100'000'000) return "a safetensors file's 8-byte header size";
  }
  return nullptr;
}

// An ONNX ModelProto as onnx and onnxruntime serialize it begins with ir_version (field 1, a
// varint: tag 0x08, a small value), then another field of the ModelProto (producer_name 0x12,
// producer_version 0x1a, domain 0x22, model_version 0x28, doc_string 0x32, graph 0x3a,
// opset_import 0x42). A file named *.onnx goes to the ONNX reader whatever it begins with, so a
// damaged one is reported by it.
bool onnx_head(const unsigned char* h, size_t n, const std::string& name) {
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".onnx") == 0) return true;
  if (n < 3 || h[0] != 0x08 || h[1] == 0 || h[1] >= 0x80) return false;
  switch (h[2]) {
    case 0x12:
    case 0x1a:
    case 0x22:
    case 0x28:
    case 0x32:
    case 0x3a:
    case 0x42:
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace {

std::shared_ptr<CheckpointModel> open_model_of(SourcePtr source, const OpenOptions& options,
                                               const OpenHooks& hooks) {
  if (source->size() == 0)
    throw Error(ErrorCode::kTruncated, "empty file (0 bytes)", source->name(), {}, 0);
  std::byte head[16] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof head, source->size()));
  std::shared_ptr<CheckpointModel> data;
  std::optional<Error> zip_error;
  if (source->memory()) {
    std::memcpy(head, source->memory(), n);
  } else {
    // Try the zip layout first: its first read (the tail) is one the zip reader needs anyway,
    // so a torch zip opens in at most three reads. Other formats pay one read more.
    try {
      data = open_torch_zip(source, options, hooks);
    } catch (const Error& e) {
      // A read that failed (a remote source after its retries) is no format's refusal.
      if (e.code() == ErrorCode::kIo || e.code() == ErrorCode::kAuth) throw;
      zip_error = e;
    }
    if (!data) source->read_into(0, std::span<std::byte>(head, n));
  }
  auto h = reinterpret_cast<const unsigned char*>(head);
  try {
    if (data) {
      // opened as a zip above
    } else if (n >= 4 && h[0] == 'P' && h[1] == 'K' && h[2] == 3 && h[3] == 4) {
      if (zip_error) throw *zip_error;
      data = open_torch_zip(source, options, hooks);
    } else if (legacy_magic_head(h, n) == 2) {
      data = open_torch_legacy(source, options);
    } else if (n >= 5 && std::memcmp(h, "|TZR|", 5) == 0) {
      data = open_tensorizer(source, options);
    } else if ((n >= 9 && (h[8] == '{' || h[8] == ' ')) ||
               (n == 8 && load_le<uint64_t>(head) <= 100'000'000)) {
      // (8 bytes: a header size without its header; the opener says it is cut)
      data = open_safetensors(source, options);
    } else if (onnx_head(h, n, source->name())) {
      data = open_onnx(source, options);
    } else if (n >= 8 && std::memcmp(h, "PYTORCH1", 8) == 0) {
      throw Error(ErrorCode::kUnsupported, "pre-1.0 PYTORCH1 archives are not supported",
                  source->name());
    } else if (const char* cut = cut_header(h, n)) {
      throw Error(ErrorCode::kTruncated,
                  "the file ends after " + std::to_string(n) + " bytes, inside " + cut, {}, {}, n);
    } else {
      throw Error(ErrorCode::kUnsupported,
                  "unknown format (not a torch zip, legacy torch file, safetensors, tensorizer "
                  "or ONNX file)",
                  source->name(), {}, 0);
    }
    data->finalize();
  } catch (Error& e) {
    e.with_source(source->name());
    throw;
  }
  return data;
}

}  // namespace

std::shared_ptr<CheckpointModel> open_model(SourcePtr source, const OpenOptions& options,
                                            const OpenHooks& hooks) {
  try {
    return open_model_of(source, options, hooks);
  } catch (const std::bad_alloc&) {
    // Whatever a hostile file made the reader allocate: a typed error that names the file.
    throw Error(ErrorCode::kLimitExceeded, "out of memory reading the file's metadata",
                source->name());
  }
}

}  // namespace ckpt::internal
