#pragma once
// A TensorProto's fields as the ONNX reader (onnx_reader.cc) takes them: dims, data type, name
// and where its data is (raw_data, typed fields, external data), read with the offset-keeping
// wire reader (onnx_wire.h); and the decimal numbers and onnxruntime's pre-packed entries of its
// external data. Nothing here reads past the message's bytes; errors name the file, the tensor
// and the byte offset.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/onnx_types.h"
#include "formats/onnx/onnx_wire.h"

namespace ckpt::internal {

struct TensorProtoFields {
  std::vector<int64_t> dims;
  int64_t data_type = 0;
  std::string name;
  std::optional<onnx::Field> raw;           // raw_data
  std::map<uint32_t, uint64_t> typed_seen;  // typed field (float_data...) → first tag offset
  bool external = false;                    // data_location = EXTERNAL
  bool has_strings = false, segment = false;
  std::vector<std::pair<std::string, std::string>> ext;  // external_data key/value entries
  uint64_t ext_at = 0;  // offset of the last external_data entry (the message's when none)
};

// The fields of the TensorProto `b` (at `base` in `file`, which ends at `file_end`). More than
// `max_dims` dims: Error{kLimitExceeded}; malformed fields: Error{kCorrupt}.
TensorProtoFields read_tensor_proto(std::span<const uint8_t> b, uint64_t base, uint64_t file_end,
                                    uint64_t max_dims, const std::string& file);

// An external-data offset or length (`key`): a decimal number below 2^64, else Error{kCorrupt}
// naming `tensor` at `at`.
uint64_t parse_decimal(const std::string& s, const char* key, const std::string& tensor,
                       uint64_t at);

// The `prepacked*` external-data entry `key` = `value` of `tensor`, "KEY|off;len;ck|off;len;ck...":
// a malformed entry is Error{kCorrupt} at `base` (the TensorProto), a bad number at `ext_at`.
OnnxPrepacked parse_prepacked(const std::string& tensor, const std::string& location,
                              const std::string& key, const std::string& value, uint64_t base,
                              uint64_t ext_at, const std::string& file);

}  // namespace ckpt::internal
