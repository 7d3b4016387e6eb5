// onnx_prepacked / onnx_places (include/ckpt/onnx.h): the ONNX reader's extension, read through
// CheckpointAccess.

#include "api/checkpoint_impl.h"
#include "ckpt/onnx.h"
#include "formats/onnx/onnx_model.h"

namespace ckpt {

namespace {
const internal::OnnxExtension* onnx_extension(const Checkpoint& c) {
  if (!format_traits(c.format()).graph) return nullptr;
  return dynamic_cast<const internal::OnnxExtension*>(
      internal::CheckpointAccess::model(c).extension.get());
}
}  // namespace

std::vector<OnnxPrepacked> onnx_prepacked(const Checkpoint& c) {
  const auto* e = onnx_extension(c);
  return e ? e->prepacked : std::vector<OnnxPrepacked>{};
}

std::vector<OnnxTensorPlace> onnx_places(const Checkpoint& c) {
  const auto* e = onnx_extension(c);
  return e ? e->places : std::vector<OnnxTensorPlace>{};
}

}  // namespace ckpt
