#pragma once
// `ckpt convert`'s transform flags (--rename, --strip-prefix, --add-prefix, --keep, --drop,
// --cast, --dequantize, --split, --fuse, --transpose, --recipe): docs/cli.md, "Converting for
// serving".

#include <CLI/CLI.hpp>
#include <memory>

#include "ckpt/convert.h"

namespace ckpt::cli {

class TransformFlags;

// Adds the flags to `cmd`. The result reads them after parsing.
std::shared_ptr<TransformFlags> add_transform_flags(CLI::App& cmd);

// The recipe the flags give (--recipe first, then the flags; rename rules in command-line
// order). Throws Error{kInvalidArgument} for a malformed rule or recipe.
TransformRecipe transform_recipe(const TransformFlags& flags);

// The convert report's transforms on stderr: what each rule did, a warning for each rule that
// matched nothing, the aliases left out of a safetensors file.
void print_transform_report(const ConvertReport& r);

}  // namespace ckpt::cli
