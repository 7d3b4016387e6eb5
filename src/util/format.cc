#include "ckpt/format.h"

namespace ckpt {
namespace {

// clang-format off
// One row per Format, in the enum's order.
constexpr FormatTraits kTraits[] = {
  //  name            tree   script  zip    checks  meta   graph
  {"torch-zip",       true,  false,  true,  true,   false, false},
  {"torch-legacy",    true,  false,  false, false,  false, false},
  {"torchscript",     false, true,   true,  true,   false, false},
  {"safetensors",     false, false,  false, false,  true,  false},
  {"tensorizer",      false, false,  false, true,   false, false},
  {"onnx",            false, false,  false, false,  false, true},
  {"torch-dcp",       false, false,  false, false,  false, false},
};
// clang-format on
static_assert(sizeof(kTraits) / sizeof(kTraits[0]) == static_cast<size_t>(Format::kTorchDcp) + 1,
              "one row per format");

}  // namespace

const FormatTraits& format_traits(Format format) noexcept {
  return kTraits[static_cast<size_t>(format)];
}

const char* format_name(Format format) noexcept { return format_traits(format).name; }

}  // namespace ckpt
