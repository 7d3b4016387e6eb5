// The target formats of a conversion: their names, the format an output path's extension names,
// and the format a target's options belong to.

#include <filesystem>
#include <string>

#include "ckpt/convert.h"
#include "ckpt/error.h"

namespace ckpt {

const char* convert_format_name(ConvertFormat format) noexcept {
  switch (format) {
    case ConvertFormat::kAuto:
      return "auto";
    case ConvertFormat::kTorch:
      return "pt";
    case ConvertFormat::kSafetensors:
      return "safetensors";
    case ConvertFormat::kTensorizer:
      return "tensorizer";
    case ConvertFormat::kDcp:
      return "dcp";
  }
  return "?";
}

ConvertFormat parse_convert_format(std::string_view name) {
  if (name == "pt" || name == "torch") return ConvertFormat::kTorch;
  if (name == "safetensors") return ConvertFormat::kSafetensors;
  if (name == "tensorizer") return ConvertFormat::kTensorizer;
  if (name == "dcp") return ConvertFormat::kDcp;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown output format '" + std::string(name) +
                  "': the format must be pt, safetensors, tensorizer or dcp");
}

const char* meta_tensors_name(MetaTensors m) noexcept {
  switch (m) {
    case MetaTensors::kRefuse:
      return "refuse";
    case MetaTensors::kZeros:
      return "zeros";
    case MetaTensors::kSkip:
      return "skip";
  }
  return "?";
}

MetaTensors parse_meta_tensors(std::string_view name) {
  if (name == "refuse") return MetaTensors::kRefuse;
  if (name == "zeros") return MetaTensors::kZeros;
  if (name == "skip") return MetaTensors::kSkip;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown meta tensor policy '" + std::string(name) + "': zeros, skip or refuse");
}

ConvertFormat target_format(const ConvertTarget& target) noexcept {
  switch (target.index()) {
    case 1:
      return ConvertFormat::kTorch;
    case 2:
      return ConvertFormat::kSafetensors;
    case 3:
      return ConvertFormat::kTensorizer;
    case 4:
      return ConvertFormat::kDcp;
  }
  return ConvertFormat::kAuto;
}

ConvertTarget default_target(ConvertFormat format) noexcept {
  switch (format) {
    case ConvertFormat::kTorch:
      return PtTarget{};
    case ConvertFormat::kSafetensors:
      return SafetensorsTarget{};
    case ConvertFormat::kTensorizer:
      return TensorizerTarget{};
    case ConvertFormat::kDcp:
      return DcpTarget{};
    case ConvertFormat::kAuto:
      break;
  }
  return std::monostate{};
}

ConvertFormat convert_format_for_path(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".safetensors") return ConvertFormat::kSafetensors;
  if (ext == ".tensors") return ConvertFormat::kTensorizer;
  if (ext == ".pt" || ext == ".pth" || ext == ".bin" || ext == ".ckpt") return ConvertFormat::kTorch;
  throw Error(ErrorCode::kInvalidArgument,
              "cannot tell the output format from '" + ext +
                  "' (.pt .pth .bin .ckpt, .safetensors, .tensors); name it "
                  "(pt, safetensors, tensorizer or dcp)",
              path);
}

}  // namespace ckpt
