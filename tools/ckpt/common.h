#pragma once
// Shared pieces of the ckpt command-line tool: opening files, formatting, exit codes.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"

namespace ckpt::cli {

// Exit statuses: 0 success; one per error code; 64 for usage errors.
int exit_code(ErrorCode code);
// Prints a warning when a key or password file is readable by group or others.
void warn_if_readable_by_others(const std::string& path);
inline constexpr int kUsageExit = 64;
// Option checks with plain messages ("--size-mb: must be more than 0"): a bad value is a usage
// error (exit 64), never silently replaced.
CLI::Validator more_than(double bound);
CLI::Validator at_least(double bound);
// `verify` that checked no content (the format stores no checksums, or there is nothing to check):
// never exit 0 for work that was not done.
inline constexpr int kNotVerifiedExit = 10;
// SIGINT, SIGTERM, SIGHUP: remove the temporaries (ckpt::remove_temporaries_now), exit 128 + sig.
void install_interrupt_cleanup();
// An upload (convert to s3://): the first signal only sets a flag that interrupted_by() returns
// (the command then throws ExitStatus{128 + sig}, and unwinding aborts the multipart upload); a
// second one ends the process as usual.
void defer_interrupts();
int interrupted_by();
// Thrown by a command that has printed what it has to say and must end with this status.
struct ExitStatus {
  int code;
};

// `s` for a terminal: control characters (C0, DEL) as \xNN, so that a name from a file cannot
// move the cursor, clear the screen or hide the lines after it. Text output only (JSON escapes
// on its own).
std::string printable(std::string_view s);

// The candidate nearest to `word` by edit distance (insertions, deletions, substitutions,
// adjacent swaps; a candidate that starts with `word` counts as 1), when it is close enough to
// be a typo (at most max(2, |word| / 3)); else "". For "did you mean".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

struct Common {
  bool no_mmap = false;
  bool strict = false;                  // refuse classes ckpt does not know (OpenOptions::strict)
  std::string key_file, password_file;  // tensorizer decryption
  // --max-* options (docs/security.md): the bounds a file may ask for; defaults are Limits'.
  uint64_t max_metadata_mb = Limits{}.max_metadata_bytes >> 20;
  uint64_t max_inflated_mb = Limits{}.max_inflated_bytes >> 20;
  uint64_t max_object_mb = Limits{}.max_object_bytes >> 20;
  Limits limits;
  // URLs (http://, https://, s3://): OpenOptions::remote.
  int connections = RemoteOptions{}.connections;
  uint64_t chunk_mb = RemoteOptions{}.chunk_size >> 20;
  int retries = RemoteOptions{}.retries;
  double stall_timeout = RemoteOptions{}.low_speed_time_s;
  std::string ca_bundle;
  double timeout = RemoteOptions{}.timeout_s;
  // RemoteOptions::download_whole: set by the commands that read every byte (load, convert).
  bool download_whole = false;
};
void add_common(CLI::App& cmd, Common& c);
// Limits from the --max-* options.
Limits limits_of(const Common& c);
Checkpoint open_checkpoint(const std::string& path, const Common& c);
// One file (a checkpoint or a shard index), or several shard files opened as one checkpoint.
Checkpoint open_checkpoint(const std::vector<std::string>& paths, const Common& c);
// Several shard files opened as one and loaded (what open_and_load is for one file).
LoadedCheckpoint load_set(const std::vector<std::string>& paths, const Common& c,
                          const LoadOptions& lo);
// How messages name what FILE... gave: the path, or the first path and how many more; URLs
// without credentials or query string (redact_url). A name to show, never one to open.
std::string files_name(const std::vector<std::string>& paths);
// The OpenOptions those flags ask for (mmap, limits, decryption key or password).
OpenOptions open_options(const Common& c);
// The RemoteOptions of the --connections, --chunk-size, --retries, --stall-timeout, --timeout flags
// and of Common::download_whole; notes (RemoteOptions::on_note) go to stderr as "ckpt: note: ...".
RemoteOptions remote_options(const Common& c);
// The line the tool prints for an error: its text, the library options it names replaced by the
// tool's flags (SafetensorsSaveOptions::copy_shared -> --copy-shared), and for kLimitExceeded the
// option that raises the limit it names ("raise it with --max-tensors").
std::string error_line(const Error& e);

std::string shape_str(const std::vector<int64_t>& v);
std::string human_bytes(uint64_t n);
// Tensors a listing shows (quantization parameters are part of their tensor).
bool listed(const TensorInfo& t);
// Absolute file offset of a tensor's first element, or nullopt when not stored raw.
std::optional<uint64_t> file_offset(const Checkpoint& c, const TensorInfo& t);
double now_seconds();
// Keeps `c` until the process exits instead of freeing it: the exit returns its memory at once,
// where freeing a model of 400,000 tensors object by object took most of a second of CPU. For
// a command's last use of a checkpoint it only read; the library frees what it makes.
void keep_until_exit(Checkpoint c);

// Subcommands: each registers itself and sets the callback that runs it.
void add_ls(CLI::App& app);
void add_info(CLI::App& app);
void add_show(CLI::App& app);
void add_extract(CLI::App& app);
void add_convert(CLI::App& app);
void add_verify(CLI::App& app);
void add_digest(CLI::App& app);
void add_sample(CLI::App& app);
void add_bench(CLI::App& app);
void add_load(CLI::App& app);
void add_code(CLI::App& app);
void add_rewrite(CLI::App& app);
void add_prepack(CLI::App& app);

}  // namespace ckpt::cli
