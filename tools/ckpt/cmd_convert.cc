// ckpt convert IN... OUT [--to pt|safetensors|tensorizer|dcp] [--max-shard-size SIZE] [--align N]
// [--copy-shared] [--digests] [--meta zeros|skip] [--dcp-files N]
// [--encrypt-key FILE | --encrypt-password-file FILE] [--decrypt-key FILE |
// --decrypt-password-file FILE]
// Reads any supported checkpoint and writes the target format (from OUT's extension unless --to
// says; a DCP folder always by --to dcp) with ckpt::convert (include/ckpt/convert.h). The flags
// only become the library's settings: which format owns which setting, and the refusal of a
// setting for a format without it, are the library's (parse_target). Non-tensor values that the
// target cannot hold (safetensors, tensorizer) are reported on stderr, never silently dropped.
// On a terminal, conversions that take a while show a one-line progress bar on stderr.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "ckpt/digest.h"
#include "common.h"
#include "progress.h"
#include "transform_flags.h"

namespace ckpt::cli {
namespace {

// The largest --budget-mb: its bytes must fit 64 bits.
constexpr double kMaxBudgetMb = static_cast<double>(UINT64_MAX >> 20);

// What the flags say, before anything is opened.
struct ConvertFlags {
  std::vector<std::string> in;  // one checkpoint, an index, or shards
  std::string out, to, encrypt_key, encrypt_password_file, max_shard_size, meta;
  uint32_t align = 0;
  double budget_mb = 0;    // 0: not given
  uint32_t dcp_files = 0;  // 0: not given
  bool copy_shared = false;
  bool digests = false;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
  std::shared_ptr<TransformFlags>
      transforms;  // --rename, --cast, --dequantize... (transform_flags.h)
};

TargetSettings settings_of(const ConvertFlags& f) {
  TargetSettings s;
  s.alignment = f.align;
  s.copy_shared = f.copy_shared;
  if (!f.meta.empty()) s.meta = parse_meta_tensors(f.meta);
  s.store_digests = f.digests;
  s.encryption.key_file = f.encrypt_key;
  s.encryption.password_file = f.encrypt_password_file;
  s.dcp_files = f.dcp_files;
  return s;
}

// The library's options; refuses what the target cannot do before anything is opened.
ConvertOptions options_of(const ConvertFlags& f) {
  ConvertOptions co;
  co.target = parse_target(f.to.empty() ? f.out : f.to, settings_of(f));
  for (const std::string* secret : {&f.encrypt_key, &f.encrypt_password_file})
    if (!secret->empty()) warn_if_readable_by_others(*secret);
  co.limits = limits_of(f.common);
  co.remote = remote_options(f.common);
  if (f.transforms) co.transforms = transform_recipe(*f.transforms);
  if (f.budget_mb > 0) co.memory_budget = static_cast<uint64_t>(f.budget_mb * 1048576.0);
  if (!f.max_shard_size.empty()) {
    try {
      co.max_shard_size = parse_byte_size(f.max_shard_size);
    } catch (const Error& e) {
      std::fprintf(stderr, "--max-shard-size: %s\n", e.message().c_str());
      throw ExitStatus{kUsageExit};
    }
  }
  return co;
}

// Notes on what the output could not hold, on stderr.
void print_notes(const ConvertFlags& f, const ConvertReport& r) {
  const char* target = convert_format_name(r.format);
  if (!r.metadata_not_written.empty()) {
    std::string keys;
    for (const auto& k : r.metadata_not_written) keys += (keys.empty() ? "" : ", ") + k;
    std::fprintf(stderr,
                 "ckpt: note: %s has no place for the safetensors __metadata__; not written: %s\n",
                 target, keys.c_str());
  }
  const auto& dropped = r.not_written;
  if (!dropped.empty()) {
    std::fprintf(stderr, "ckpt: note: %s cannot hold non-tensor values; not written (%zu):\n",
                 target, dropped.size());
    for (size_t i = 0; i < dropped.size() && i < 20; ++i)
      std::fprintf(stderr, "  %s\n", dropped[i].c_str());
    if (dropped.size() > 20) std::fprintf(stderr, "  ... and %zu more\n", dropped.size() - 20);
  }
  if (!r.copied_shared.empty() && !f.copy_shared)  // copies the user did not ask for
    std::fprintf(stderr,
                 "ckpt: note: %s cannot express shared or tied tensors; %zu written as separate "
                 "copies (first: %s, shares with %s)\n",
                 target, r.copied_shared.size(), r.copied_shared[0].first.c_str(),
                 r.copied_shared[0].second.c_str());
  if (!r.meta_zeroed.empty() || !r.meta_skipped.empty()) {
    const auto& names = r.meta_zeroed.empty() ? r.meta_skipped : r.meta_zeroed;
    std::fprintf(stderr, "ckpt: note: %zu meta tensors (no bytes) %s (first: %s)\n", names.size(),
                 r.meta_zeroed.empty() ? "left out" : "written as zeros", names[0].c_str());
  }
  if (r.digests_stored)
    std::fprintf(stderr, "ckpt: stored %zu tensor SHA-256 digests in __metadata__ \"%s\"\n",
                 r.digests_stored, kSafetensorsDigestKey);
  if (r.key_file_written)
    std::fprintf(stderr, "ckpt: wrote a new random key to %s\n", f.encrypt_key.c_str());
}

// The summary line on stdout: the bytes written (headers and padding included), not the source's.
void print_summary(const ConvertFlags& f, const ConvertReport& r, double seconds) {
  const char* target = convert_format_name(r.format);
  std::string what = f.out + " (" + target + ")";
  if (!r.index.empty())
    what = std::to_string(r.files.size()) + " shards and " + r.index + " (" + target + ")";
  else if (target_format_info(r.format).folder)
    what = f.out + " (" + target + ", " + std::to_string(r.files.size()) + " files)";
  std::printf("wrote %s: %zu tensors (%s of data), %s (%llu bytes) in %.3f s\n", what.c_str(),
              r.tensors, human_bytes(r.tensor_bytes).c_str(), human_bytes(r.bytes_written).c_str(),
              static_cast<unsigned long long>(r.bytes_written), seconds);
}

// A model folder converted into a model folder: the files beside the weights that serving needs
// (config, generation config, tokenizer), which convert() copied (ConvertReport).
void print_model_files(const ConvertReport& r) {
  if (r.model_files_copied.empty()) return;
  std::string copied;
  for (const std::string& name : r.model_files_copied)
    copied += (copied.empty() ? "" : ", ") + name;
  std::printf("copied from %s: %s\n", r.model_files_from.c_str(), copied.c_str());
}

void run_convert(ConvertFlags& f) {
  f.common.download_whole = true;  // every byte is read: a server without ranges is no obstacle
  const double t0 = now_seconds();
  if (f.out.empty()) {
    if (f.in.size() < 2) {
      std::fprintf(stderr, "ckpt: OUT is required (see ckpt --help)\n");
      throw ExitStatus{kUsageExit};
    }
    f.out = f.in.back();
    f.in.pop_back();
  }
  ConvertOptions co = options_of(f);
  Checkpoint c = open_checkpoint(f.in, f.common);
  ProgressLine line(f.progress);
  co.progress = line.fn();
  if (is_url(f.out)) {
    // A signal aborts the upload: the writer polls the flag through the progress callback.
    defer_interrupts();
    co.progress = [draw = co.progress](uint64_t done, uint64_t total) {
      if (int sig = interrupted_by()) throw ExitStatus{128 + sig};
      if (draw) draw(done, total);
    };
    co.progress_interval = std::chrono::milliseconds(50);
  }
  ConvertReport r = convert(c, f.out, co);
  line.finish(r.bytes_written);
  print_transform_report(r);
  print_notes(f, r);
  print_model_files(r);
  print_summary(f, r, now_seconds() - t0);
}

}  // namespace

void add_convert(CLI::App& app) {
  auto f = std::make_shared<ConvertFlags>();
  auto* cmd =
      app.add_subcommand("convert", "convert a checkpoint to pt, safetensors, tensorizer or dcp");
  cmd->add_option("IN", f->in, "input checkpoint, shard index, or shard files")->required();
  // IN takes every argument (several shard files); the last one is OUT.
  cmd->add_option("OUT", f->out,
                  "output file (.pt/.pth/.bin, .safetensors, .tensors), or folder (--to dcp)");
  cmd->add_option("--to", f->to,
                  "output format: pt, safetensors, tensorizer, or dcp (a "
                  "torch.distributed.checkpoint folder)");
  cmd->add_option("--max-shard-size", f->max_shard_size,
                  "pt/safetensors: write shards of at most SIZE tensor bytes (500MB, 5GB, "
                  "10GiB) and an index, as Hugging Face does (default: one file)");
  cmd->add_option("--align", f->align,
                  "pt/safetensors: alignment of tensor data (pt: default 64; safetensors: "
                  "default 8)");
  cmd->add_flag("--copy-shared", f->copy_shared,
                "safetensors: write tensors that share storage as separate copies");
  cmd->add_flag("--digests", f->digests,
                "safetensors: store every tensor's SHA-256 in __metadata__ (checked by verify)");
  cmd->add_option("--meta", f->meta,
                  "safetensors: write meta tensors (no bytes) as zeros, or skip them; without "
                  "it they are refused (pt and tensorizer keep them as meta tensors)")
      ->check(CLI::IsMember({"zeros", "skip"}));
  cmd->add_option("--dcp-files", f->dcp_files,
                  "dcp: write N data files __<rank>_0.distcp as N ranks would (each tensor's "
                  "rows split as Shard(0) splits them; default 1)")
      ->check(CLI::Range(1u, 4096u));
  auto* ek = cmd->add_option("--encrypt-key", f->encrypt_key,
                             "tensorizer: encrypt with the key in FILE (hex); a new random key is "
                             "written there if FILE does not exist");
  cmd->add_option("--encrypt-password-file", f->encrypt_password_file,
                  "tensorizer: encrypt with a key derived (Argon2id) from the password in FILE")
      ->excludes(ek);
  char budget_help[200];
  std::snprintf(budget_help, sizeof budget_help,
                "input that is not mapped (a DCP folder, a URL, a compressed file): MiB of tensor "
                "data read ahead of the writer (default 128, at most %.0f; a larger tensor is "
                "held alone)",
                kMaxBudgetMb);
  cmd->add_option("--budget-mb", f->budget_mb, budget_help)
      ->check(more_than(0))
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char b[96];
            std::snprintf(b, sizeof b, "must be at most %.0f (MiB, 16 EiB), not ", kMaxBudgetMb);
            try {
              return std::stod(v) > kMaxBudgetMb ? b + v : std::string();
            } catch (...) {
              return {};  // more_than says what is wrong
            }
          },
          "MiB"));
  add_common(*cmd, f->common);
  add_progress_flags(*cmd, f->progress);
  f->transforms = add_transform_flags(*cmd);
  cmd->callback([f] { run_convert(*f); });
}

}  // namespace ckpt::cli
