#pragma once
// Writing torch.save checkpoints (the zip format torch has used since 1.6; torch.load and
// torch.load(weights_only=True) read what this writes). Thread-safety: the functions may run on
// several threads at once for different outputs; they read the tensors' bytes while writing, so
// those must not change meanwhile.

#include <string>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/tensor.h"
#include "ckpt/value.h"

namespace ckpt {

// Writes a torch.save zip checkpoint of `root`, whose kTensor nodes index into `tensors`. Tensors
// whose storage() is the same object share one storage record. Atomic per options. Throws Error.
void save_torch(const std::string& path, const ConstValuePtr& root,
                const std::vector<Tensor>& tensors, const SaveOptions& options = {});
// Same, into any sink (not committed: the caller commits, as for every save_* function).
void save_torch(ByteSink& sink, const ConstValuePtr& root, const std::vector<Tensor>& tensors,
                const SaveOptions& options = {});
// A state dict: an OrderedDict of name -> tensor, the way model.state_dict() saves.
ValuePtr state_dict_value(const std::vector<Tensor>& tensors);

}  // namespace ckpt
