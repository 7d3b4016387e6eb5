#pragma once
// `ckpt load FILE --rank R --world N --plan PLAN`: the dry run of a rank's load.

#include <string>
#include <vector>

#include "common.h"

namespace ckpt::cli {

struct RankDryRun {
  int rank = 0, world = 1;
  std::string plan_file;  // empty: every tensor replicated
  bool json = false;
};

// Prints each tensor's box and byte ranges for the rank, and the bytes it would read.
void print_rank_plan(const std::vector<std::string>& files, const Common& common,
                     const RankDryRun& run);

}  // namespace ckpt::cli
