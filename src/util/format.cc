#include "ckpt/format.h"

namespace ckpt {

const char* format_name(Format format) noexcept {
  switch (format) {
    case Format::kTorchZip:
      return "torch-zip";
    case Format::kTorchLegacy:
      return "torch-legacy";
    case Format::kTorchScript:
      return "torchscript";
    case Format::kSafetensors:
      return "safetensors";
    case Format::kTensorizer:
      return "tensorizer";
    case Format::kOnnx:
      return "onnx";
    case Format::kTorchDcp:
      return "torch-dcp";
  }
  return "unknown";
}

}  // namespace ckpt
