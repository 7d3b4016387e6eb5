#pragma once
// TorchScript archives (torch.jit.save): the module tree, the stored source (code/), its debug
// info (code/*.debug_pkl), tensor constants (constants.pkl + constants/), extra files (extra/),
// and a rewrite that keeps everything torch.jit.load needs. See docs/formats/torch.md
// "TorchScript".

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/torchscript_types.h"

namespace ckpt {

namespace internal {
struct TorchScriptModel;
}

// A handle like Checkpoint (copies share state, every method is const and thread-safe); the code
// texts and lists it returns stay valid while the archive or a copy lives.
class TorchScriptArchive {
 public:
  // Opens a TorchScript archive. Reads the metadata records and the code/ sources (inflating
  // deflated ones, capped by Limits::max_inflated_bytes). Throws Error: kCorrupt for a torch zip
  // that is no TorchScript archive (no constants.pkl) or malformed records, plus everything
  // Checkpoint::open throws.
  static TorchScriptArchive open(const std::string& path, const OpenOptions& options = {});
  // The archive behind a checkpoint opened as Format::kTorchScript. Throws
  // Error{kInvalidArgument} for any other format. Shares the checkpoint's state.
  static TorchScriptArchive from(const Checkpoint& checkpoint);

  // Parameters, buffers and constants ("constants.0") are the checkpoint's tensors; root() is the
  // module tree (objects of class __torch__.*).
  const Checkpoint& checkpoint() const { return checkpoint_; }
  // The tensor constants tuple from constants.pkl (kTensor nodes index checkpoint().tensors()).
  const ValuePtr& constants() const;
  const std::vector<TorchScriptCodeFile>& code_files() const;
  // Finds a code file by a qualified name ("__torch__.MyModule", "__torch__.torch.nn.modules.
  // linear.Linear", or a module qualifier) or a path ("code/__torch__/x.py", "__torch__/x.py").
  // A qualified name must be a module qualifier or name a class or function its file defines.
  // Throws Error{kNotFound} (naming what exists), or Error{kInvalidArgument} for a path with ".."
  // or an absolute path.
  const TorchScriptCodeFile& find_code(std::string_view name) const;
  // The stored source of a code file (see find_code()).
  const std::string& code(std::string_view name) const;
  // The debug_pkl format of a code file (kNone without one). Reads and parses the record.
  TorchScriptDebugFormat debug_format(std::string_view name) const;
  // Each stored line with its original file and line. Reads and parses the debug_pkl: Error
  // {kCorrupt} for malformed debug info (string index out of range, bad tuples); lines carry no
  // origin when the file has no debug_pkl.
  std::vector<TorchScriptSourceLine> source_lines(std::string_view name) const;
  // Names under extra/ and their contents (Error{kNotFound} for an unknown name).
  std::vector<std::string> extra_files() const;
  std::string extra_file(std::string_view name) const;
  // True when the archive also holds mobile bytecode (bytecode.pkl, _save_for_lite_interpreter).
  bool has_bytecode() const;
  // The module's state dict: (name, tensor index) for every parameter and buffer, by module path
  // ("encoder.layers.0.linear.weight"), tied tensors under each of their names. When the code
  // lists no __parameters__/__buffers__ for a class, all its tensor attributes count.
  const std::vector<std::pair<std::string, size_t>>& state_dict() const;

  // Writes the archive again: every record in the input's order under the same folder, stored
  // records stored and deflated ones re-deflated (libdeflate; the content is equal, the
  // compressed bytes need not be), debug_pkl records per options. Without options the output
  // of a rewrite rewrites to identical bytes. Throws Error.
  TorchScriptRewriteReport rewrite(const std::string& path,
                                   const TorchScriptRewriteOptions& options = {}) const;

 private:
  TorchScriptArchive(Checkpoint c, std::shared_ptr<const internal::TorchScriptModel> m)
      : checkpoint_(std::move(c)), model_(std::move(m)) {}
  Checkpoint checkpoint_;
  std::shared_ptr<const internal::TorchScriptModel> model_;
};

}  // namespace ckpt
