#pragma once
// The ONNX reader's state beyond the neutral model (FormatExtension): each tensor's place and
// the pre-packed blobs, for onnx_prepacked()/onnx_places() and the rewrite.

#include <string>
#include <vector>

#include "ckpt/onnx_types.h"
#include "model/checkpoint_model.h"

namespace ckpt::internal {

struct OnnxExtension : FormatExtension {
  std::vector<OnnxTensorPlace> places;  // one per tensor, same order
  std::vector<OnnxPrepacked> prepacked;
};

// Resolves an external-data location against the model's folder, refusing absolute paths,
// empty ones and `..` components (Error{kCorrupt} naming the tensor). Pure.
std::string onnx_external_path(const std::string& model_dir, const std::string& location,
                               const std::string& tensor);

// The folder external data is relative to: the source's (file) name's parent, "." for a bare
// file name, "" for a source without a file ("<memory>").
std::string onnx_model_dir(const std::string& source_name);

}  // namespace ckpt::internal
