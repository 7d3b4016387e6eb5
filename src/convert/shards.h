#pragma once
// convert() to shards plus an index (ConvertOptions::max_shard_size): src/convert/shards.cc.

#include <string>

#include "ckpt/convert.h"

namespace ckpt::internal {

// `o.target` is resolved (not std::monostate) and o.max_shard_size > 0.
ConvertReport convert_sharded(const Checkpoint& c, const std::string& out_path,
                              const ConvertOptions& o);

}  // namespace ckpt::internal
