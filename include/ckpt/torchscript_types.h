#pragma once
// Plain types of TorchScript archives (ckpt/torchscript.h): code files, source lines with their
// debug origins, rewrite options and report. Values; safe to share between threads.

#include <cstdint>
#include <string>

#include "ckpt/options.h"

namespace ckpt {

// One source file under code/.
struct TorchScriptCodeFile {
  std::string path;       // relative to code/: "__torch__/torch/nn/modules/linear.py"
  std::string qualifier;  // the Python-like module it defines: "__torch__.torch.nn.modules.linear"
  uint64_t size = 0;      // uncompressed bytes
  bool deflated = false;
  bool has_debug = false;  // a .debug_pkl record sits beside it
};

// One line of stored source with where the code it holds came from (per its debug_pkl).
struct TorchScriptSourceLine {
  uint32_t line = 0;          // 1-based line in the stored file
  std::string text;           // without the newline
  std::string original_file;  // empty when the debug info says nothing for this line
  int64_t original_line = 0;  // 1-based line in original_file; 0 when unknown
};

enum class TorchScriptDebugFormat { kNone, kStringTable, kPerRange };

struct TorchScriptRewriteOptions {
  enum class Debug { kKeep, kTable, kStrip };
  // kKeep: debug_pkl records as they are; kTable: per-range (old) records re-encoded in the
  // string-table format; kStrip: no debug_pkl records (torch.jit.load does not need them).
  Debug debug = Debug::kKeep;
  uint32_t alignment = 64;  // data alignment of every record (torch uses 64); power of two
  bool atomic = true;
  bool fsync = true;
  // Bytes of the input's records copied so far, of all of them (options.h: ProgressFn).
  ProgressFn progress;
};

struct TorchScriptRewriteReport {
  size_t records_in = 0, records_out = 0;
  size_t debug_converted = 0;  // per-range debug_pkl records re-encoded
  size_t debug_stripped = 0;
  // Uncompressed and stored (deflated) bytes of the debug_pkl records that were converted or
  // stripped, before and after.
  uint64_t debug_bytes_before = 0, debug_bytes_after = 0;
  uint64_t debug_stored_before = 0, debug_stored_after = 0;
};

}  // namespace ckpt
