// ckpt rewrite IN OUT [--debug keep|table|strip] [--align N]: writes a TorchScript archive again,
// record for record, converting or dropping its debug info and re-aligning its records.
// ckpt rewrite IN.onnx OUT.onnx [--external-data F] [--align N] [--align-threshold S]
// [--size-threshold S] [--inline] [--drop-prepacked] [--weights W]: an ONNX model with its
// initializers moved to an aligned external-data file (or back inline), the graph otherwise
// byte-identical (ckpt/onnx.h).

#include <cstdio>

#include "common.h"
#include "progress.h"

namespace ckpt::cli {

namespace {

struct RewriteOptions {
  std::string in, out, debug = "keep";
  uint64_t align = 0;  // 0: the format's default (64 TorchScript, 4096 ONNX)
  std::string external_data, weights;
  uint64_t align_threshold = 1ull << 20, size_threshold = 1024;
  bool inline_all = false, drop_prepacked = false;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
};

// An ONNX model: initializers moved to an aligned external-data file or back inline.
void rewrite_onnx(const RewriteOptions& o) {
  OnnxRewriteOptions ro;
  ro.external_data = o.external_data;
  ro.inline_all = o.inline_all;
  ro.align = o.align ? o.align : 4096;
  ro.align_threshold = o.align_threshold;
  ro.size_threshold = o.size_threshold;
  ro.drop_prepacked = o.drop_prepacked;
  ro.weights = o.weights;
  OnnxRewriteReport r = onnx_rewrite(o.in, o.out, ro);
  std::printf("wrote %s (%llu bytes): %zu tensors, %zu inline, %zu external", o.out.c_str(),
              static_cast<unsigned long long>(r.model_bytes), r.tensors, r.inlined, r.external);
  if (!r.data_path.empty())
    std::printf(" in %s (%llu bytes)", r.data_path.c_str(),
                static_cast<unsigned long long>(r.data_bytes));
  std::printf("\n");
  if (!o.weights.empty()) std::printf("replaced: %zu initializers\n", r.replaced);
  if (r.prepacked_carried || r.prepacked_dropped)
    std::printf("pre-packed blobs: %zu carried, %zu dropped\n", r.prepacked_carried,
                r.prepacked_dropped);
}

// A TorchScript archive: written again, record for record.
void rewrite_torchscript(const RewriteOptions& o, Checkpoint in) {
  TorchScriptArchive a = TorchScriptArchive::from(std::move(in));
  TorchScriptRewriteOptions ro;
  ro.debug = o.debug == "table"   ? TorchScriptRewriteOptions::Debug::kTable
             : o.debug == "strip" ? TorchScriptRewriteOptions::Debug::kStrip
                                  : TorchScriptRewriteOptions::Debug::kKeep;
  ro.alignment = o.align ? static_cast<uint32_t>(o.align) : 64;
  ProgressLine line(o.progress);
  ro.progress = line.fn();
  TorchScriptRewriteReport r = a.rewrite(o.out, ro);
  line.end_line();
  std::printf("wrote %s: %zu of %zu records\n", o.out.c_str(), r.records_out, r.records_in);
  if (ro.debug == TorchScriptRewriteOptions::Debug::kTable) {
    long long saved =
        static_cast<long long>(r.debug_bytes_before) - static_cast<long long>(r.debug_bytes_after);
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
}

void run_rewrite(const RewriteOptions& o) {
  Checkpoint in = open_checkpoint(o.in, o.common);
  if (format_traits(in.format()).graph) return rewrite_onnx(o);
  if (!o.external_data.empty() || o.inline_all || o.drop_prepacked || !o.weights.empty())
    throw Error(ErrorCode::kInvalidArgument,
                "--external-data, --inline, --drop-prepacked and --weights are for ONNX models",
                o.in);
  rewrite_torchscript(o, std::move(in));
}

}  // namespace

void add_rewrite(CLI::App& app) {
  auto o = std::make_shared<RewriteOptions>();
  auto* cmd = app.add_subcommand(
      "rewrite",
      "TorchScript: write the archive again (convert/strip debug info, re-align); ONNX: move "
      "initializers to an aligned external-data file or back inline, replace weights");
  cmd->add_option("IN", o->in, "TorchScript archive or ONNX model")->required();
  cmd->add_option("OUT", o->out, "output archive or model")->required();
  cmd->add_option("--debug", o->debug,
                  "keep: debug_pkl as is; table: convert per-range debug_pkl to the string-table "
                  "format; strip: drop debug_pkl records")
      ->check(CLI::IsMember({"keep", "table", "strip"}));
  cmd->add_option(
      "--align", o->align,
      "data alignment of every record, power of two (default 64, torch's; 4096 for "
      "page-aligned tensors); ONNX: of large initializers and pre-packs (default 4096)");
  cmd->add_option("--external-data", o->external_data,
                  "ONNX: the external-data file, inside OUT's folder (default OUT.data)");
  cmd->add_option("--align-threshold", o->align_threshold,
                  "ONNX: initializers of at least this size are aligned (default 1MiB)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--size-threshold", o->size_threshold,
                  "ONNX: smaller initializers stay inline (default 1024)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_flag("--inline", o->inline_all, "ONNX: every initializer back into the .onnx");
  cmd->add_flag("--drop-prepacked", o->drop_prepacked,
                "ONNX: drop onnxruntime's pre-packed blobs (valid only on the machine kind that "
                "made them)");
  cmd->add_option("--weights", o->weights,
                  "ONNX: a checkpoint (any format) whose tensors replace initializers by name "
                  "(dtype and shape must match; their pre-packs are dropped)");
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_rewrite(*o); });
}

}  // namespace ckpt::cli
