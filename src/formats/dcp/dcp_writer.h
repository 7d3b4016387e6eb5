#pragma once
// The DCP writer (include/ckpt/dcp.h): a state dict flattened the way DCP's default planner
// flattens it, its items spread over the data files, and the `.metadata` pickle that indexes
// them. dcp_writer.cc plans and writes the data files; dcp_metadata_writer.cc builds the
// pickle. docs/formats/dcp.md, "torch.distributed.checkpoint folders (DCP)", **Writing**.
//
// Thread-safety: a writer is used by one thread at a time (formats/writer.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/dtype.h"
#include "ckpt/value.h"
#include "formats/writer.h"

namespace ckpt::internal {

// One written item: a chunk of a tensor, or a bytes item (torch.save of a value).
struct DcpWrittenItem {
  size_t entry = 0;              // index into DcpWrittenState::entries
  std::vector<int64_t> offsets;  // the chunk's box (tensor items)
  std::vector<int64_t> sizes;
  std::string file;     // "__<rank>_0.distcp"
  uint64_t offset = 0;  // where its bytes start in the file
  uint64_t length = 0;
};

// One key of the flattened state dict.
struct DcpWrittenEntry {
  std::string fqn;
  std::vector<ValuePtr> path;  // its path in the nested dict (strings; ints for list positions)
  bool is_bytes = false;
  DType dtype = DType::kFloat32;  // tensor items
  std::vector<int64_t> size;
  bool requires_grad = false;
};

struct DcpWrittenState {
  std::vector<DcpWrittenEntry> entries;  // in the order of the traversal
  std::vector<DcpWrittenItem> items;     // in the order written (file by file)
};

// The `.metadata` pickle of what was written (protocol 2: Python reads it as torch's own).
std::string dcp_metadata_pickle(const DcpWrittenState& state);

// The DCP writer: object_tree, several_files. Throws Error{kInvalidArgument} for options out of
// range (DcpSaveOptions::files).
std::unique_ptr<Writer> make_dcp_writer(const DcpSaveOptions& options);

}  // namespace ckpt::internal
