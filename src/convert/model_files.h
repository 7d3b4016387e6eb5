#pragma once
// The files beside a model folder's weights that serving needs (config, generation config,
// tokenizer), copied into an output folder by convert() (include/ckpt/convert.h).

#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"

namespace ckpt::internal {

// When `c` was opened from a local folder and `out_path` is a local folder other than it, copies
// the folder's model files that exist into it (from its huggingface/ subfolder when it has no
// config.json and that has: verl's layout), each through a temporary and a rename, and names
// them in `report` (model_files_from, model_files_copied). Throws Error{kIo} naming the file
// when one cannot be copied (its temporary removed).
void copy_model_files(const Checkpoint& c, const std::string& out_path, ConvertReport& report);

}  // namespace ckpt::internal
