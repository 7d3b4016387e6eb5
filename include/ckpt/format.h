#pragma once
// Format: which kind of file (or, for kTorchDcp, folder) a checkpoint is, and RecordInfo: one
// entry of its container.
// Plain values; safe to share between threads.

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/tensor.h"

namespace ckpt {

enum class Format {
  kTorchZip,
  kTorchLegacy,
  kTorchScript,
  kSafetensors,
  kTensorizer,
  kOnnx,
  kTorchDcp
};  // a torch.distributed.checkpoint folder
// "torch-zip", "torch-legacy", "torchscript", "safetensors", "tensorizer", "onnx", "torch-dcp".
const char* format_name(Format format) noexcept;

// What the rest of the library and its tools ask of a format, answered by one table (one row per
// format, src/util/format.cc): code asks for the capability, never for the format.
struct FormatTraits {
  const char* name;  // format_name()
  bool tree_values;  // a pickled object tree whose non-tensor values are data (torch zip, legacy)
  bool script;       // a TorchScript archive (code, constants, its module's state dict)
  bool zip_records;  // a zip whose records carry CRC32s (torch zip, TorchScript)
  bool stores_checksums;  // the file can store checksums of its tensor bytes
  bool metadata;          // a string map beside the tensors (safetensors' __metadata__)
  bool graph;             // an ONNX graph (initializers, external data, pre-packed blobs)
};
const FormatTraits& format_traits(Format format) noexcept;

// One entry of a container (zip record, legacy storage), for `info` and `verify`.
struct RecordInfo {
  std::string name;
  uint64_t header_offset = 0;
  uint64_t data_offset = kNoOffset;  // kNoOffset until known
  uint64_t size = 0;                 // uncompressed
  uint64_t compressed_size = 0;
  std::optional<uint32_t> crc32;  // nullopt where the file stores 0 / none
  bool deflated = false;
};

}  // namespace ckpt
