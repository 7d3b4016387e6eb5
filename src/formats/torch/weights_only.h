#pragma once
// The globals torch 2.x's `torch.load(weights_only=True)` accepts by default (its unpickler's
// allow-list, without user additions): what `OpenOptions::strict` accepts, name for name.
// docs/formats/torch.md, "torch.save zip", **Pickle**, lists them and says where the list comes
// from.

#include <string_view>

namespace ckpt::internal {

// module.name as the pickle names it after the Python 2 renames (__builtin__ -> builtins).
// Thread-safe (no state).
bool torch_weights_only_global(std::string_view module, std::string_view name) noexcept;

}  // namespace ckpt::internal
