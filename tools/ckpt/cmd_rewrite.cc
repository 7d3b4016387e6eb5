// ckpt rewrite IN OUT [--debug keep|table|strip] [--align N]: writes a TorchScript archive again,
// record for record, converting or dropping its debug info and re-aligning its records.

#include <cstdio>

#include "common.h"
#include "progress.h"

namespace ckpt::cli {

void add_rewrite(CLI::App& app) {
  struct Opts {
    std::string in, out, debug = "keep";
    uint32_t align = 64;
    Common common;
    ProgressMode progress = ProgressMode::kAuto;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "rewrite", "TorchScript: write the archive again (convert/strip debug info, re-align)");
  cmd->add_option("IN", o->in, "TorchScript archive")->required();
  cmd->add_option("OUT", o->out, "output archive")->required();
  cmd->add_option("--debug", o->debug,
                  "keep: debug_pkl as is; table: convert per-range debug_pkl to the string-table "
                  "format; strip: drop debug_pkl records")
      ->check(CLI::IsMember({"keep", "table", "strip"}));
  cmd->add_option("--align", o->align,
                  "data alignment of every record, power of two (default 64, torch's; 4096 for "
                  "page-aligned tensors)");
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] {
    TorchScriptArchive a = TorchScriptArchive::from(open_checkpoint(o->in, o->common));
    TorchScriptRewriteOptions ro;
    ro.debug = o->debug == "table"   ? TorchScriptRewriteOptions::Debug::kTable
               : o->debug == "strip" ? TorchScriptRewriteOptions::Debug::kStrip
                                     : TorchScriptRewriteOptions::Debug::kKeep;
    ro.alignment = o->align;
    ProgressLine line(o->progress);
    ro.progress = line.fn();
    TorchScriptRewriteReport r = a.rewrite(o->out, ro);
    line.end_line();
    std::printf("wrote %s: %zu of %zu records\n", o->out.c_str(), r.records_out, r.records_in);
    if (ro.debug == TorchScriptRewriteOptions::Debug::kTable) {
      long long saved = static_cast<long long>(r.debug_bytes_before) -
                        static_cast<long long>(r.debug_bytes_after);
      long long saved_stored = static_cast<long long>(r.debug_stored_before) -
                               static_cast<long long>(r.debug_stored_after);
      std::printf(
          "debug_pkl: %zu converted to the string-table format; %llu -> %llu bytes (saved %lld), "
          "deflated %llu -> %llu bytes (saved %lld)\n",
          r.debug_converted, static_cast<unsigned long long>(r.debug_bytes_before),
          static_cast<unsigned long long>(r.debug_bytes_after), saved,
          static_cast<unsigned long long>(r.debug_stored_before),
          static_cast<unsigned long long>(r.debug_stored_after), saved_stored);
    } else if (ro.debug == TorchScriptRewriteOptions::Debug::kStrip) {
      std::printf("debug_pkl: %zu records dropped (%llu bytes, %llu deflated)\n", r.debug_stripped,
                  static_cast<unsigned long long>(r.debug_bytes_before),
                  static_cast<unsigned long long>(r.debug_stored_before));
    }
  });
}

}  // namespace ckpt::cli
