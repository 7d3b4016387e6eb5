#pragma once
// Transforms (include/ckpt/transform.h) between the content a conversion builds and its writer:
// apply_transforms maps the content's description (names, dtypes, shapes; which input tensors
// make each output tensor) and, when any output's bytes differ from an input's, puts a feed in
// front of the content's feed that computes each output tensor's bytes from its inputs' bytes
// when the writer asks for them (one output tensor held at a time). docs/design/writers.md,
// "Writers", **Transforms**.

#include <string>

#include "ckpt/convert.h"
#include "ckpt/transform.h"
#include "formats/writer.h"

namespace ckpt::internal {

// Rewrites `content` through `recipe` for writer `w`. Everything that cannot apply is refused
// here (Error{kInvalidArgument} naming `in` and the tensor), before the output exists. Fills
// r.transforms, r.tensors and r.tensor_bytes.
void apply_transforms(const TransformRecipe& recipe, const Writer& w, const std::string& in,
                      WriteContent& content, ConvertReport& r);

// `name` through the recipe's rename rules (in order).
std::string renamed(const TransformRecipe& recipe, std::string name);

// Tied weights to a writer that neither shares nor copies bytes (safetensors without
// copy_shared): of entries that are all of one storage as one view, all but the first in sorted
// order are removed from `flat` (safetensors' _remove_duplicate_names) and listed in
// r.aliases_dropped as (removed, kept). Entries that share only part of a storage stay (and are
// refused).
void drop_aliases(const Checkpoint& c, FlatStateDict& flat, ConvertReport& r);

// After flat_content: r.aliases_dropped into the metadata ({removed: kept}, an existing key
// kept), then the transforms when there are any.
void finish_flat_content(const TransformRecipe& recipe, const Writer& w, const std::string& in,
                         WriteContent& content, ConvertReport& r);

}  // namespace ckpt::internal
