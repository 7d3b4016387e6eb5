// ckpt convert IN... OUT [--to pt|safetensors|tensorizer|dcp] [--max-shard-size SIZE] [--align N]
// [--copy-shared] [--digests] [--meta zeros|skip] [--dcp-files N]
// [--encrypt-key FILE | --encrypt-password-file FILE] [--decrypt-key FILE |
// --decrypt-password-file FILE]
// Reads any supported checkpoint and writes the target format (from OUT's extension unless --to
// says; a DCP folder always by --to dcp) with ckpt::convert (include/ckpt/convert.h). Non-tensor values that the target cannot
// hold (safetensors, tensorizer) are reported on stderr, never silently dropped. On a terminal,
// conversions that take a while show a one-line progress bar on stderr.

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ckpt/convert.h"
#include "ckpt/digest.h"
#include "common.h"
#include "progress.h"
#include "transform_flags.h"

namespace ckpt::cli {
namespace {

ConvertFormat target_of(const std::string& to, const std::string& out) {
  if (!to.empty()) {
    if (to == "pt" || to == "torch" || to == "safetensors" || to == "tensorizer" || to == "dcp")
      return parse_convert_format(to);
    throw Error(ErrorCode::kInvalidArgument, "--to must be pt, safetensors, tensorizer or dcp");
  }
  try {
    return convert_format_for_path(out);
  } catch (const Error&) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot tell the output format from '" +
                    std::filesystem::path(out).extension().string() +
                    "'; use --to pt|safetensors|tensorizer|dcp",
                out);
  }
}

}  // namespace

void add_convert(CLI::App& app) {
  struct Opts {
    std::vector<std::string> in;  // one checkpoint, an index, or shards
    std::string out, to, encrypt_key, encrypt_password_file, max_shard_size, meta;
    uint32_t align = 0;
    double budget_mb = 0;
    uint32_t dcp_files = 0;  // 0: not given
    bool copy_shared = false;
    bool digests = false;
    Common common;
    ProgressMode progress = ProgressMode::kAuto;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      app.add_subcommand("convert", "convert a checkpoint to pt, safetensors, tensorizer or dcp");
  cmd->add_option("IN", o->in, "input checkpoint, shard index, or shard files")->required();
  // IN takes every argument (several shard files); the last one is OUT.
  cmd->add_option("OUT", o->out,
                  "output file (.pt/.pth/.bin, .safetensors, .tensors), or folder (--to dcp)");
  cmd->add_option("--to", o->to,
                  "output format: pt, safetensors, tensorizer, or dcp (a "
                  "torch.distributed.checkpoint folder)");
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "pt/safetensors: write shards of at most SIZE tensor bytes (500MB, 5GB, "
                  "10GiB) and an index, as Hugging Face does (default: one file)");
  cmd->add_option("--align", o->align,
                  "alignment of tensor data (pt: default 64; safetensors: default 8)");
  cmd->add_flag("--copy-shared", o->copy_shared,
                "safetensors: write tensors that share storage as separate copies");
  cmd->add_flag("--digests", o->digests,
                "safetensors: store every tensor's SHA-256 in __metadata__ (checked by verify)");
  cmd->add_option("--meta", o->meta,
                  "safetensors: write meta tensors (no bytes) as zeros, or skip them; without "
                  "it they are refused (pt and tensorizer keep them as meta tensors)")
      ->check(CLI::IsMember({"zeros", "skip"}));
  cmd->add_option("--dcp-files", o->dcp_files,
                  "dcp: write N data files __<rank>_0.distcp as N ranks would (each tensor's "
                  "rows split as Shard(0) splits them; default 1)")
      ->check(CLI::Range(1u, 4096u));
  auto* ek = cmd->add_option("--encrypt-key", o->encrypt_key,
                             "tensorizer: encrypt with the key in FILE (hex); a new random key is "
                             "written there if FILE does not exist");
  cmd->add_option("--encrypt-password-file", o->encrypt_password_file,
                  "tensorizer: encrypt with a key derived (Argon2id) from the password in FILE")
      ->excludes(ek);
  cmd->add_option("--budget-mb", o->budget_mb,
                  "input that is not mapped (a DCP folder, a URL, a compressed file): MiB of "
                  "tensor data read ahead of the writer (default 128; a larger tensor is held "
                  "alone)")
      ->check(CLI::PositiveNumber);
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  auto tf = add_transform_flags(*cmd);
  cmd->callback([o, tf] {
    o->common.download_whole = true;  // every byte is read: a server without ranges is no obstacle
    double t0 = now_seconds();
    if (o->out.empty()) {
      if (o->in.size() < 2) {
        std::fprintf(stderr, "ckpt: OUT is required (see ckpt --help)\n");
        throw ExitStatus{kUsageExit};
      }
      o->out = o->in.back();
      o->in.pop_back();
    }
    ConvertOptions co;
    std::string named = o->out;  // a sharded output may be named by its index
    if (named.ends_with(".index.json")) named.resize(named.size() - 11);
    const ConvertFormat to = target_of(o->to, named);
    const char* to_name = convert_format_name(to);
    // Each format's own flags; a flag of another format is refused (or, where it could only
    // mean what the format does anyway, noted).
    if (o->digests && to != ConvertFormat::kSafetensors)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("--digests: stored digests are only available for safetensors "
                              "output (") +
                      to_name +
                      " has no place for them; use `ckpt digest` for a manifest beside the file)",
                  o->out);
    const bool encrypt = !o->encrypt_key.empty() || !o->encrypt_password_file.empty();
    if (encrypt && to != ConvertFormat::kTensorizer)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("--encrypt-key / --encrypt-password-file: encryption is only "
                              "available for tensorizer output, not ") +
                      to_name,
                  o->out);
    if (o->dcp_files && to != ConvertFormat::kDcp)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("--dcp-files applies to dcp output only, not ") + to_name, o->out);
    if (to == ConvertFormat::kDcp) {
      // pt's, safetensors' and tensorizer's flags have no meaning in a DCP folder.
      const char* other = o->align                     ? "--align"
                          : o->copy_shared             ? "--copy-shared"
                          : !o->meta.empty()           ? "--meta"
                          : !o->max_shard_size.empty() ? "--max-shard-size"
                                                       : nullptr;
      if (other)
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(other) + " does not apply to dcp output (--dcp-files splits it)",
                    o->out);
    }
    if (!o->meta.empty() && to != ConvertFormat::kSafetensors)
      std::fprintf(stderr, "ckpt: warning: %s keeps meta tensors as meta tensors; --meta ignored\n",
                   to_name);
    if (o->align && to == ConvertFormat::kTensorizer)
      std::fprintf(stderr, "ckpt: warning: tensorizer has no data alignment; --align ignored\n");
    if (to == ConvertFormat::kTorch) {
      PtTarget pt;
      pt.alignment = o->align;
      co.target = pt;
    } else if (to == ConvertFormat::kSafetensors) {
      SafetensorsTarget st;
      st.alignment = o->align;
      st.copy_shared = o->copy_shared;
      st.store_digests = o->digests;
      if (!o->meta.empty()) st.meta = parse_meta_tensors(o->meta);
      co.target = st;
    } else if (to == ConvertFormat::kDcp) {
      DcpTarget dcp;
      if (o->dcp_files) dcp.files = o->dcp_files;
      co.target = dcp;
    } else {
      for (const std::string* f : {&o->encrypt_key, &o->encrypt_password_file})
        if (!f->empty()) warn_if_readable_by_others(*f);
      TensorizerTarget tz;
      tz.encryption.key_file = o->encrypt_key;
      tz.encryption.password_file = o->encrypt_password_file;
      co.target = tz;
    }
    co.transforms = transform_recipe(*tf);
    co.limits = limits_of(o->common);
    co.remote = remote_options(o->common);
    if (o->budget_mb > 0) co.memory_budget = static_cast<uint64_t>(o->budget_mb * 1024 * 1024);
    if (!o->max_shard_size.empty()) {
      try {
        co.max_shard_size = parse_byte_size(o->max_shard_size);
      } catch (const Error& e) {
        std::fprintf(stderr, "--max-shard-size: %s\n", e.message().c_str());
        throw ExitStatus{kUsageExit};
      }
      if (to == ConvertFormat::kTensorizer) {
        std::fprintf(stderr, "--max-shard-size: tensorizer has no sharded layout\n");
        throw ExitStatus{kUsageExit};
      }
    }
    Checkpoint c = open_checkpoint(o->in, o->common);
    if (co.max_shard_size != 0 && !is_url(o->out)) {
      // Shards and their index go to OUT's folder: made as `extract` makes DIR.
      const auto parent = std::filesystem::path(o->out).parent_path();
      std::error_code ec;
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      if (ec)
        throw Error(ErrorCode::kIo, "cannot create the folder: " + ec.message(), parent.string());
    }
    ProgressLine line(o->progress);
    co.progress = line.fn();
    if (is_url(o->out)) {
      // A signal aborts the upload: the writer polls the flag through the progress callback.
      defer_interrupts();
      co.progress = [draw = co.progress](uint64_t done, uint64_t total) {
        if (int sig = interrupted_by()) throw ExitStatus{128 + sig};
        if (draw) draw(done, total);
      };
      co.progress_interval = std::chrono::milliseconds(50);
    }
    ConvertReport r = convert(c, o->out, co);
    line.finish(r.bytes_written);
    print_transform_report(r);

    const char* target = convert_format_name(r.format);
    if (!r.metadata_not_written.empty()) {
      std::string keys;
      for (const auto& k : r.metadata_not_written) keys += (keys.empty() ? "" : ", ") + k;
      std::fprintf(stderr,
                   "ckpt: note: %s has no place for the safetensors __metadata__; not "
                   "written: %s\n",
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
    if (r.format == ConvertFormat::kTensorizer && !r.copied_shared.empty())
      std::fprintf(stderr,
                   "ckpt: note: tensorizer cannot express shared or tied tensors; %zu "
                   "written as separate copies (first: %s, shares with %s)\n",
                   r.copied_shared.size(), r.copied_shared[0].first.c_str(),
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
      std::fprintf(stderr, "ckpt: wrote a new random key to %s\n", o->encrypt_key.c_str());
    double dt = now_seconds() - t0;
    // The bytes of the file written (headers and padding included), not the source's.
    if (!r.index.empty()) {
      std::printf("wrote %zu shards and %s (%s): %zu tensors (%s of data), %s (%llu bytes) in "
                  "%.3f s\n",
                  r.files.size(), r.index.c_str(), target, r.tensors,
                  human_bytes(r.tensor_bytes).c_str(), human_bytes(r.bytes_written).c_str(),
                  static_cast<unsigned long long>(r.bytes_written), now_seconds() - t0);
      return;
    }
    if (r.format == ConvertFormat::kDcp) {
      std::printf("wrote %s (dcp, %zu files): %zu tensors (%s of data), %s (%llu bytes) in "
                  "%.3f s\n",
                  o->out.c_str(), r.files.size(), r.tensors, human_bytes(r.tensor_bytes).c_str(),
                  human_bytes(r.bytes_written).c_str(),
                  static_cast<unsigned long long>(r.bytes_written), dt);
      return;
    }
    std::printf("wrote %s (%s): %zu tensors (%s of data), %s (%llu bytes) in %.3f s\n",
                o->out.c_str(), target, r.tensors, human_bytes(r.tensor_bytes).c_str(),
                human_bytes(r.bytes_written).c_str(),
                static_cast<unsigned long long>(r.bytes_written), dt);
  });
}

}  // namespace ckpt::cli
