// ckpt verify FILE: check every CRC32 (or the format's hashes); non-zero exit naming the bad record.

#include <cstdio>

#include "common.h"

namespace ckpt::cli {

void add_verify(CLI::App& app) {
  struct Opts {
    std::string file;
    Common common;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("verify", "check every record's CRC32 (tensorizer: its hashes)");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  add_common(*cmd, o->common);
  cmd->callback([o] {
    double t0 = now_seconds();
    Checkpoint c = open_checkpoint(o->file, o->common);
    size_t n = c.verify();
    double dt = now_seconds() - t0;
    size_t total = c.records().empty() ? c.storages().size() : c.records().size();
    std::printf("OK: %zu of %zu %s checked (%s, %.3f s)\n", n, total,
                c.records().empty() ? "storages" : "records", format_name(c.format()), dt);
  });
}

}  // namespace ckpt::cli
