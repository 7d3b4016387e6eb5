// ckpt verify FILE [--digests MANIFEST]: check every CRC32 (or the format's hashes), or every
// tensor's SHA-256 against a manifest (`ckpt digest`) or against the digests a safetensors file
// stores (`ckpt convert --digests`); non-zero exit naming the bad record or tensors.

#include <cstdio>

#include "ckpt/digest.h"
#include "common.h"
#include "progress.h"

namespace ckpt::cli {
namespace {

// Prints one line per mismatch (at most kShown) on stderr and ends with exit 5 when there is
// any; else prints the OK line.
// --json: one object on stdout whatever the outcome ("result": ok | corrupt | not_verified),
// beside the usual stderr lines and exit status.
void print_json(const std::string& file, const Checkpoint& c, const char* result, size_t checked,
                size_t total, const std::string& what, double t0,
                const nlohmann::ordered_json& extra = {}) {
  nlohmann::ordered_json j{{"file", file},
                           {"format", format_name(c.format())},
                           {"result", result},
                           {"checked", checked},
                           {"total", total},
                           {"what", what},
                           {"seconds", now_seconds() - t0}};
  if (extra.is_object())
    for (auto& [k, v] : extra.items()) j[k] = v;
  std::printf("%s\n", j.dump().c_str());
}

void report_digests(const std::string& file, const Checkpoint& c,
                    const std::vector<DigestMismatch>& bad, size_t expected, size_t computed,
                    const std::string& against, bool stored, double t0, bool json) {
  if (json) {
    nlohmann::ordered_json extra{{"against", against}};
    extra["mismatches"] = nlohmann::ordered_json::array();
    for (const auto& b : bad)
      extra["mismatches"].push_back({{"tensor", b.tensor}, {"problem", b.problem}});
    print_json(file, c, bad.empty() ? "ok" : "corrupt", computed, expected, "tensors", t0, extra);
  }
  if (bad.empty()) {
    if (json) return;
    std::printf("OK: %zu of %zu tensors match %s (%s, %.3f s)\n", computed, expected,
                against.c_str(), format_name(c.format()), now_seconds() - t0);
    return;
  }
  constexpr size_t kShown = 100;
  for (size_t i = 0; i < bad.size() && i < kShown; ++i) {
    std::string problem = bad[i].problem;
    if (stored && problem == "not in the manifest") problem = "no stored SHA-256";
    if (stored && problem == "not in the file")
      problem = "has a stored SHA-256 but is not in the file";
    std::fprintf(stderr, "ckpt: error: %s: %s: %s [corrupt]\n", file.c_str(), bad[i].tensor.c_str(),
                 problem.c_str());
  }
  if (bad.size() > kShown) std::fprintf(stderr, "ckpt: ... and %zu more\n", bad.size() - kShown);
  std::fprintf(stderr, "ckpt: %zu tensor%s do%s not match %s\n", bad.size(),
               bad.size() == 1 ? "" : "s", bad.size() == 1 ? "es" : "", against.c_str());
  throw ExitStatus{exit_code(ErrorCode::kCorrupt)};
}

struct VerifyOptions {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file, digests;
  bool json = false;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
};

// Every record's CRC32 (tensorizer: its hashes); the number checked. On a corrupt record with
// --json, prints the JSON result before the error goes up.
size_t check_records(const VerifyOptions& o, const Checkpoint& c, ProgressLine& line, double t0) {
  size_t n = 0;
  try {
    n = c.verify(line.fn());
  } catch (const Error& e) {
    line.end_line();
    if (o.json && e.code() == ErrorCode::kCorrupt) {
      nlohmann::ordered_json extra = nlohmann::ordered_json::object();
      extra["error"] = error_line(e);
      extra["record"] = e.record();
      extra["offset"] =
          e.offset() ? nlohmann::ordered_json(*e.offset()) : nlohmann::ordered_json(nullptr);
      print_json(o.file, c, "corrupt", 0,
                 c.records().empty() ? c.storages().size() : c.records().size(),
                 c.records().empty() ? "storages" : "records", t0, extra);
    }
    throw;
  }
  return n;
}

// Nothing was checked: saying OK would pass a corrupted file through a CI gate.
[[noreturn]] void refuse_nothing_checked(const VerifyOptions& o, const Checkpoint& c, size_t total,
                                         const char* what, double t0) {
  if (o.json) print_json(o.file, c, "not_verified", 0, total, what, t0);
  const bool has_checksums = format_traits(c.format()).stores_checksums;
  std::fprintf(stderr, "ckpt: not verified: %s: %s; 0 of %zu %s checked [not_verified]\n",
               o.file.c_str(),
               total == 0 ? "it holds nothing to check"
               : has_checksums
                   ? "its records were written without checksums"
                   : (std::string(format_name(c.format())) + " files store no checksums").c_str(),
               total, what);
  if (total != 0)
    std::fprintf(stderr,
                 "ckpt: hint: `ckpt digest FILE -o MANIFEST` records every tensor's SHA-256; "
                 "`ckpt verify FILE --digests MANIFEST` checks them\n");
  throw ExitStatus{kNotVerifiedExit};
}

// A torch file saved with CRCs off has a CRC for data.pkl only: its tensors went unchecked.
void refuse_unchecked_storages(const VerifyOptions& o, const Checkpoint& c, size_t n, size_t total,
                               const char* what, double t0) {
  size_t unchecked = 0, with_bytes = 0;
  if (format_traits(c.format()).zip_records)
    for (const StorageInfo& s : c.storages()) {
      if (s.meta || s.nbytes == 0) continue;
      ++with_bytes;
      if (!s.crc32) ++unchecked;
    }
  if (unchecked != 0) {
    if (o.json) print_json(o.file, c, "not_verified", n, total, what, t0);
    std::fprintf(stderr,
                 "ckpt: not verified: %s: %zu of %zu storages were written without checksums "
                 "(torch's compute_crc32=False); %zu of %zu %s checked [not_verified]\n",
                 printable(o.file).c_str(), unchecked, with_bytes, n, total, what);
    std::fprintf(stderr,
                 "ckpt: hint: `ckpt digest FILE -o MANIFEST` records every tensor's SHA-256; "
                 "`ckpt verify FILE --digests MANIFEST` checks them\n");
    throw ExitStatus{kNotVerifiedExit};
  }
}

void run_verify(VerifyOptions& o) {
  o.file = files_name(o.files);
  double t0 = now_seconds();
  Checkpoint c = open_checkpoint(o.files, o.common);
  ProgressLine line(o.progress);
  DigestOptions dopt;
  dopt.load.progress = line.fn();
  if (!o.digests.empty()) {
    DigestManifest m = read_manifest(o.digests, limits_of(o.common));
    std::vector<TensorDigest> have = tensor_digests(c, dopt);
    line.end_line();
    report_digests(o.file, c, compare_digests(m.tensors, have), m.tensors.size(), have.size(),
                   o.digests, false, t0, o.json);
    return;
  }
  if (auto stored = stored_digests(c)) {
    std::vector<TensorDigest> have = tensor_digests(c, dopt);
    line.end_line();
    report_digests(o.file, c, compare_digests(*stored, have), stored->size(), have.size(),
                   "their stored SHA-256", true, t0, o.json);
    return;
  }
  size_t n = check_records(o, c, line, t0);
  line.end_line();
  double dt = now_seconds() - t0;
  size_t total = c.records().empty() ? c.storages().size() : c.records().size();
  const char* what = c.records().empty() ? "storages" : "records";
  if (n == 0) refuse_nothing_checked(o, c, total, what, t0);
  refuse_unchecked_storages(o, c, n, total, what, t0);
  if (o.json) return print_json(o.file, c, "ok", n, total, what, t0);
  std::printf("OK: %zu of %zu %s checked (%s, %.3f s)\n", n, total, what, format_name(c.format()),
              dt);
}

}  // namespace

void add_verify(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  auto* cmd = app.add_subcommand(
      "verify", "check every record's CRC32 (tensorizer: its hashes), or tensors' SHA-256");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  cmd->add_option("--digests", o->digests,
                  "check every tensor against this manifest (written by `ckpt digest`)");
  cmd->add_flag("--json", o->json,
                "one JSON object on stdout: result (ok, corrupt, not_verified), counts, seconds");
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_verify(*o); });
}

}  // namespace ckpt::cli
