// Where an ONNX model's external data lives: the model's folder, and a location checked to stay
// inside it (src/formats/onnx/onnx_model.h).

#include <filesystem>
#include <string>

#include "ckpt/error.h"
#include "formats/onnx/onnx_model.h"

namespace ckpt::internal {

std::string onnx_model_dir(const std::string& source_name) {
  if (source_name.empty() || source_name[0] == '<') return {};  // "<memory>": no folder
  std::filesystem::path p(source_name);
  std::string d = p.parent_path().string();
  return d.empty() ? "." : d;
}

std::string onnx_external_path(const std::string& model_dir, const std::string& location,
                               const std::string& tensor) {
  if (location.empty())
    throw Error(ErrorCode::kCorrupt, "external data without a location", {}, tensor);
  if (location.find('\0') != std::string::npos)
    throw Error(ErrorCode::kCorrupt, "external data location holds a NUL byte", {}, tensor);
  std::filesystem::path loc(location);
  if (loc.is_absolute() || location[0] == '/' || location[0] == '\\')
    throw Error(ErrorCode::kCorrupt,
                "external data location \"" + location +
                    "\" is absolute (it must be relative to the model's folder)",
                {}, tensor);
  for (const auto& part : loc)
    if (part == "..")
      throw Error(ErrorCode::kCorrupt,
                  "external data location \"" + location +
                      "\" has a `..` component (it must stay inside the model's folder)",
                  {}, tensor);
  if (location.find('\\') != std::string::npos && location.find("..") != std::string::npos)
    throw Error(ErrorCode::kCorrupt,
                "external data location \"" + location + "\" has a `..` component", {}, tensor);
  return (std::filesystem::path(model_dir) / loc).string();
}

}  // namespace ckpt::internal
