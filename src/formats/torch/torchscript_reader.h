#pragma once
// TorchScript archives (torch.jit.save) on top of the torch zip reader.
//
// Layout (docs/formats/torch.md "TorchScript"), all under one folder,
// in the order torch 1.13 writes them:
//   extra/<name>            user extra files (stored)
//   data/<key>              storages of the module's tensors (stored, 64-byte aligned)
//   data.pkl                the module tree: __torch__.<qualname> objects rebuilt by BUILD with
//                           their attribute dict (or their __getstate__ value)
//   code/<qual/path>.py     source per qualifier; deflated when > 200 bytes
//   code/<...>.py.debug_pkl debug info for that source (debug_pkl.h); deflated likewise
//   constants/<key>         storages of the tensor constants (stored)
//   constants.pkl           tuple of the tensor constants the code refers to as CONSTANTS.cN
//   bytecode.pkl            only with _save_for_lite_interpreter (mobile bytecode)
//   version                 "3\n" ... (or .data/version)
// Code records are read (inflated, capped by Limits::max_inflated_bytes) at open: they say which
// attributes are parameters and buffers (__parameters__ / __buffers__ lines) and how
// __setstate__ maps a state tuple to attribute names. debug_pkl records are read on demand.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/torchscript_types.h"
#include "formats/open.h"
#include "formats/torch/torch_unpickle.h"
#include "zip/zip_reader.h"

namespace ckpt::internal {

struct TorchScriptModel final : FormatExtension {
  std::shared_ptr<ZipReader> zip;
  std::string prefix;  // "archive/"
  Limits limits;
  std::vector<TorchScriptCodeFile> files;
  std::vector<size_t> code_entry;                     // per file: zip entry of the .py
  std::vector<std::optional<size_t>> debug_entry;     // per file: zip entry of the .debug_pkl
  std::vector<std::string> code_text;                 // per file
  std::vector<std::pair<std::string, size_t>> extra;  // name under extra/, zip entry
  ValuePtr constants;
  std::vector<std::pair<std::string, size_t>> state_dict;
  bool bytecode = false;
};

// Reads constants.pkl and appends its storages (key "constants/<k>", record preset to
// "<prefix>constants/<k>") and tensors to `tp`; returns the constants tuple with tensor indices
// into the combined table. Throws Error (kCorrupt for a missing constants.pkl).
ValuePtr add_torchscript_constants(const ZipReader& zip, TorchPickle& tp,
                                   const OpenOptions& options);

// After the torch layer has built `data` (module tensors first, then `module_tensors`..end the
// constants): reads code/, names tensors by module path ("encoder.layers.0.linear.weight") and
// constants "constants.N", sets TensorInfo::type ("param", "buffer", "constant"), and fills
// TorchScript properties. Throws Error (kCorrupt for code names that escape the archive folder,
// inflate errors from the zip layer).
std::shared_ptr<TorchScriptModel> finish_torchscript(std::shared_ptr<ZipReader> zip,
                                                     CheckpointModel& data, size_t module_tensors,
                                                     ValuePtr constants);

// Writes the archive again (TorchScriptArchive::rewrite, which documents it). Throws Error.
TorchScriptRewriteReport rewrite_torchscript(const TorchScriptModel& m, const std::string& path,
                                             const TorchScriptRewriteOptions& options);

// A relative record path that stays inside its folder: no empty, "." or ".." components, no
// backslashes, not absolute.
bool safe_relative(std::string_view p);

// Bytes of a record, with a size cap (kLimitExceeded past `max`).
Bytes read_record(const ZipReader& zip, size_t entry, uint64_t max);

}  // namespace ckpt::internal
