#pragma once
// TorchScript debug info (code/<file>.py.debug_pkl): for byte offsets of the stored source, the
// range of original Python source it was generated from. Two pickled layouts (protocol 2):
//
//   string table (torch >= 1.12, what 1.13 writes):
//     ("FORMAT_WITH_STRING_TABLE", text_table: tuple[str], records)
//     text_table[0] == ""; every distinct source line and file name appears once.
//   per range (older):
//     records
//   records = tuple of (byte_offset: int, source_range, tag: int)   (tag absent in the oldest)
//   source_range = (source, start: int, end: int)     start/end: byte offsets into source's text
//   source (string table) = (line_indices: List[int] via torch.jit._pickle.build_intlist,
//                            filename_index: int, starting_line_no: int); null = ([], 0, 0)
//   source (per range)    = (text: str, filename: str | None, starting_line_no: int)
//
// Records are sorted by byte_offset; the one in effect at an offset is the last one at or before
// it. See docs/formats/torch.md "TorchScript" → "debug_pkl".

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/options.h"

namespace ckpt::internal {

struct DebugSource {
  std::string text;
  std::optional<std::string> filename;
  int64_t starting_line = 0;  // 1-based line of text's first line in filename
  bool null = false;          // the string-table format's ([], 0, 0)
};

struct DebugRecord {
  int64_t byte_offset = 0;
  size_t source = 0;  // index into DebugInfo::sources
  int64_t start = 0, end = 0;
  std::optional<int64_t> tag;
};

struct DebugInfo {
  bool string_table = false;
  std::vector<DebugSource> sources;  // distinct source objects, in first-use order
  std::vector<DebugRecord> records;
};

struct DebugPklOptions {
  std::string source, record;  // for errors
  Limits limits;
};

// Parses either layout. Throws Error{kCorrupt} (wrong tuple shapes, string index out of range,
// offsets outside the source text), kUnsupported (globals other than torch.jit._pickle's), and the
// unpickler's errors.
DebugInfo parse_debug_pkl(std::span<const std::byte> data, const DebugPklOptions& options);

// The string-table pickle of `info` (what torch >= 1.12 writes; torch.jit.load reads it).
std::string write_debug_pkl_table(const DebugInfo& info);

// Where the code at stored-source offsets [begin, end) came from: the first record with a
// non-null source among the one in effect at `begin` and those starting before `end`. Returns
// (file, 1-based line), or nullopt.
std::optional<std::pair<std::string, int64_t>> debug_origin(const DebugInfo& info, int64_t begin,
                                                            int64_t end);

}  // namespace ckpt::internal
