#pragma once
// ONNX vocabulary: an initializer's place and onnxruntime's pre-packed blobs, as the
// ONNX reader (src/formats/onnx) records them. Plain values. The functions are in ckpt/onnx.h.

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

// One buffer of a pre-packed blob: `offset;length;checksum` in onnxruntime's entry.
struct OnnxPrepackedBuffer {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string checksum;  // as written ("0" from onnxruntime; a SHA-256 hex from ckpt rewrite)
};

// One `prepacked*` external_data entry of an initializer: "KEY|off;len;ck|off;len;ck...".
struct OnnxPrepacked {
  std::string tensor;    // the initializer's name
  std::string entry;     // the external_data key ("prepacked_0")
  std::string key;       // the kernel's key ("MatMul+2761210482415319408")
  std::string location;  // the file the buffers are in (the initializer's location)
  std::vector<OnnxPrepackedBuffer> buffers;
};

// Where an initializer's bytes are.
struct OnnxTensorPlace {
  std::string tensor;
  std::string how;       // "raw_data", "external", "float_data", "int32_data", ...
  std::string location;  // for external data
  uint64_t offset = 0;   // absolute in its file (raw_data in the .onnx, external in `location`)
  uint64_t length = 0;
  std::string checksum;  // external data's "checksum" key, if any
};

}  // namespace ckpt
