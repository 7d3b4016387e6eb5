#pragma once
// ONNX models: what ckpt knows of an opened .onnx beyond its tensors — each
// initializer's external-data place and onnxruntime's pre-packed blobs — and the rewrite that
// moves initializers out to (or back from) an aligned external-data file.
// Format facts: docs/formats/onnx.md "ONNX"; design: docs/design/decisions.md "ONNX".
// Thread-safe: these functions keep no state; onnx_prepacked/onnx_places read an open
// Checkpoint, which concurrent callers may share.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/onnx_types.h"

namespace ckpt {

// The pre-packed blobs of an ONNX checkpoint, in file order of their initializers; empty for
// other formats.
std::vector<OnnxPrepacked> onnx_prepacked(const Checkpoint& c);
// Every tensor's place (ONNX checkpoints; empty for other formats).
std::vector<OnnxTensorPlace> onnx_places(const Checkpoint& c);

// ckpt rewrite for ONNX: writes the model again with its initializers moved to an external-data
// file (or back inline), large ones aligned for memory mapping, and every other field's bytes
// copied as they are. Both files are written atomically (temporary + rename).
struct OnnxRewriteOptions {
  // The external-data file; its name relative to OUT's folder becomes each initializer's
  // `location` (it must be inside that folder). Empty: OUT + ".data".
  std::string external_data;
  bool inline_all = false;                // every initializer back into raw_data
  uint64_t align = 4096;                  // offset alignment of large tensors and pre-packs
  uint64_t align_threshold = 1ull << 20;  // tensors of at least this many bytes are aligned
  uint64_t size_threshold = 1024;         // smaller tensors stay inline (raw_data)
  bool drop_prepacked = false;            // drop onnxruntime's pre-packed blobs
  // A checkpoint (any format) whose tensors replace initializers of the same name: dtype and
  // shape must match (Error{kInvalidArgument} naming the tensor). Replaced weights lose their
  // pre-packs (stale).
  std::string weights;
};

struct OnnxRewriteReport {
  size_t tensors = 0;   // initializers and Constant tensors seen
  size_t external = 0;  // initializers written to the external-data file
  size_t inlined = 0;   // initializers written as raw_data
  size_t replaced = 0;  // initializers replaced from `weights`
  size_t prepacked_carried = 0;
  size_t prepacked_dropped = 0;
  uint64_t model_bytes = 0;
  uint64_t data_bytes = 0;  // size of the external-data file (0 when none was written)
  std::string data_path;    // the external-data file written, if any
};

// Verifies the input first (Checkpoint::verify: external-data SHA-1 checksums, pre-pack
// checksums): a model that fails is Error{kCorrupt} and nothing is written, since the output
// would carry no checksum to show the damage.
OnnxRewriteReport onnx_rewrite(const std::string& in, const std::string& out,
                               const OnnxRewriteOptions& options);

}  // namespace ckpt
