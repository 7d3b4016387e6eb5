// ckpt digest FILE [-o MANIFEST] [--json] [--threads N]: the SHA-256 of every tensor's logical
// bytes and of the whole file (include/ckpt/digest.h), for `ckpt verify FILE --digests MANIFEST`.

#include <cstdio>
#include <future>

#include "ckpt/digest.h"
#include "common.h"
#include "progress.h"

namespace ckpt::cli {

namespace {

struct DigestCmdOptions {
  std::string file, out;
  bool json = false;
  int threads = 0;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
};

void run_digest(const DigestCmdOptions& o) {
  double t0 = now_seconds();
  Checkpoint c = open_checkpoint(o.file, o.common);
  // The whole-file digest reads the file once more: on its own thread, beside the tensors'.
  auto file = std::async(std::launch::async, [&c] { return file_digest(c.source()); });
  DigestOptions d;
  d.threads = o.threads;
  ProgressLine line(o.progress);
  d.load.progress = line.fn();
  DigestManifest m;
  m.tensors = tensor_digests(c, d);
  m.file = file.get();
  line.end_line();
  double dt = now_seconds() - t0;
  if (!o.out.empty()) {
    std::string json = manifest_to_json(m);
    auto sink = create_file_sink(o.out, {.atomic = true, .fsync = true});
    sink->write(json);
    sink->commit();
    std::printf("wrote %s: %zu tensors, file sha256 %s (%s, %.3f s)\n", o.out.c_str(),
                m.tensors.size(), to_hex(m.file->sha256).c_str(), human_bytes(m.file->size).c_str(),
                dt);
  } else if (o.json) {
    std::fputs(manifest_to_json(m).c_str(), stdout);
  } else {
    // The first line is what `sha256sum FILE` prints.
    std::printf("%s  %s\n", to_hex(m.file->sha256).c_str(), redact_url(o.file).c_str());
    for (const TensorDigest& t : m.tensors)
      std::printf("%s  %s\n", t.sha256 ? to_hex(*t.sha256).c_str() : "meta (no bytes)",
                  t.name.c_str());
  }
}

}  // namespace

void add_digest(CLI::App& app) {
  auto o = std::make_shared<DigestCmdOptions>();
  auto* cmd = app.add_subcommand(
      "digest", "SHA-256 of every tensor's elements and of the file: a manifest for verify");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  auto* out =
      cmd->add_option("-o,--output", o->out, "write the JSON manifest to this file (atomically)");
  cmd->add_flag("--json", o->json,
                "print the JSON manifest (the default without -o prints "
                "sha256sum-style lines)")
      ->excludes(out);
  cmd->add_option("--threads", o->threads, "storages hashed at once (0: the machine's cores)")
      ->check(at_least(0));
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_digest(*o); });
}

}  // namespace ckpt::cli
