#pragma once
// Sharding (ConvertOptions::max_shard_size), a decorator of the write pipeline: the plan of which
// flat entry goes into which shard, the names of a set, and the writer that writes each shard
// with the format's writer and then the index (src/convert/shards.cc). The files are a
// ShardFiles output (shard_files.h).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "formats/writer.h"

namespace ckpt::internal {

// DIR/STEM.EXT (or DIR/STEM.EXT.index.json) -> DIR/STEM-0000k-of-0000n.EXT and
// DIR/STEM.EXT.index.json.
struct ShardNames {
  std::string one_file;  // the output's name without ".index.json": the one file of a set of one
  std::filesystem::path dir;
  std::string stem, ext, index;                 // index: the index's file name
  std::string shard(size_t k, size_t n) const;  // shard k (0-based) of n: its file name
};
ShardNames shard_names(const std::string& out_path, const WriterCaps& caps);

// Entries in order into the current shard until the next would pass `max`; bytes shared with
// an earlier entry go where that entry went.
struct ShardPlan {
  std::vector<size_t> shard_of;  // per flat entry
  size_t shards = 0;
  uint64_t total = 0;  // the bytes the shards store (shared bytes once where the writer shares)
};
ShardPlan plan_shards(const Checkpoint& c, const FlatStateDict& flat, const WriterCaps& caps,
                      uint64_t max);
// The same over the tensors a writer is handed (a transformed content: each tensor its own
// bytes, none shared), by their element bytes (meta tensors cost nothing).
ShardPlan plan_content_shards(const std::vector<Tensor>& tensors, uint64_t max);

// `inner` writing each shard of `plan` into the file names.shard(k, n) of its output, then the
// index (names.index: {"metadata": {"total_size"}, "weight_map": {tensor: shard}}, sorted).
std::unique_ptr<Writer> shard_writer(std::unique_ptr<Writer> inner, ShardPlan plan,
                                     ShardNames names);

}  // namespace ckpt::internal
