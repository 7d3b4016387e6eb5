// ckpt verify FILE: check every CRC32 (or the format's hashes); non-zero exit naming the bad record.

#include <cstdio>

#include "common.h"
#include "progress.h"

namespace ckpt::cli {

void add_verify(CLI::App& app) {
  struct Opts {
    std::string file;
    Common common;
    ProgressMode progress = ProgressMode::kAuto;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("verify", "check every record's CRC32 (tensorizer: its hashes)");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] {
    double t0 = now_seconds();
    Checkpoint c = open_checkpoint(o->file, o->common);
    ProgressLine line(o->progress);
    size_t n = c.verify(line.fn());
    line.end_line();
    double dt = now_seconds() - t0;
    size_t total = c.records().empty() ? c.storages().size() : c.records().size();
    const char* what = c.records().empty() ? "storages" : "records";
    if (n == 0) {
      // Nothing was checked: saying OK would pass a corrupted file through a CI gate.
      const bool has_checksums =
          c.format() == Format::kTorchZip || c.format() == Format::kTorchScript ||
          c.format() == Format::kTensorizer;
      std::fprintf(stderr, "ckpt: not verified: %s: %s; 0 of %zu %s checked [not_verified]\n",
                   o->file.c_str(),
                   total == 0          ? "it holds nothing to check"
                   : has_checksums     ? "its records were written without checksums"
                                       : (std::string(format_name(c.format())) +
                                          " files store no checksums")
                                             .c_str(),
                   total, what);
      throw ExitStatus{kNotVerifiedExit};
    }
    std::printf("OK: %zu of %zu %s checked (%s, %.3f s)\n", n, total, what,
                format_name(c.format()), dt);
  });
}

}  // namespace ckpt::cli
