#include "common.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ckpt::cli {

int exit_code(ErrorCode code) { return exit_status(code); }

void add_common(CLI::App& cmd, Common& c) {
  cmd.add_flag("--no-mmap", c.no_mmap, "read with pread instead of mapping the file");
  cmd.add_flag("--strict", c.strict,
               "refuse classes ckpt does not know (torch's weights_only) instead of keeping them "
               "as opaque objects");
  cmd.add_option("--decrypt-key", c.key_file, "tensorizer: file with the raw key (hex or binary)");
  cmd.add_option("--decrypt-password-file", c.password_file,
                 "tensorizer: file whose first line is the password");
  cmd.add_option("--connections", c.connections, "a URL: ranged requests in flight per read")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->group("Remote");
  cmd.add_option("--chunk-size", c.chunk_mb, "a URL: MiB per ranged request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024))
      ->group("Remote");
  cmd.add_option("--retries", c.retries, "a URL: retries of a failed range (5xx, resets, cuts)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100))
      ->group("Remote");
  cmd.add_option("--stall-timeout", c.stall_timeout,
                 "a URL: seconds under 1 KiB/s before a transfer is abandoned and retried")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0))
      ->group("Remote");
  cmd.add_option("--ca-bundle", c.ca_bundle,
                 "a URL: PEM file of certificate authorities to trust (default: AWS_CA_BUNDLE, "
                 "CURL_CA_BUNDLE, SSL_CERT_FILE, else the system's)")
      ->group("Remote");
  cmd.add_option("--timeout", c.timeout, "a URL: seconds one range may take, retries included")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0))
      ->group("Remote");
  // Limits (docs/security.md): what an untrusted file may make ckpt allocate or walk. The
  // defaults open real models (1 TB, 1M tensors); raise one when a file is refused for it.
  cmd.add_option("--max-metadata-mb", c.max_metadata_mb,
                 "largest data.pkl / safetensors header / tensorizer index, MiB")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-tensors", c.limits.max_tensors, "most tensors (and storages) per file")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-dims", c.limits.max_dims, "most dimensions per tensor")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-pickle-memo", c.limits.max_pickle_memo, "most pickle memo entries")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-pickle-stack", c.limits.max_pickle_stack,
                 "deepest pickle stack (values + marks)")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-pickle-depth", c.limits.max_pickle_depth,
                 "deepest nesting of the object tree")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-inflated-mb", c.max_inflated_mb,
                 "largest inflated size of one deflated record, MiB")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-records", c.limits.max_records, "most zip entries")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--max-object-mb", c.max_object_mb,
                 "memory the metadata's objects may take, MiB, plus "
                 "--object-bytes-per-byte for each byte of the file")
      ->capture_default_str()
      ->group("Limits");
  cmd.add_option("--object-bytes-per-byte", c.limits.object_bytes_per_byte,
                 "memory the metadata's objects may take per byte of the file")
      ->capture_default_str()
      ->group("Limits");
}

namespace {
CLI::Validator bound_check(double bound, bool strict) {
  return CLI::Validator(
      [bound, strict](std::string& v) -> std::string {
        double x = 0;
        try {
          size_t used = 0;
          x = std::stod(v, &used);
          if (used != v.size()) return "'" + v + "' is not a number";
        } catch (...) {
          return "'" + v + "' is not a number";
        }
        char b[32];
        std::snprintf(b, sizeof b, "%g", bound);
        if (strict ? !(x > bound) : !(x >= bound))
          return std::string("must be ") + (strict ? "more than " : "at least ") + b + ", not " + v;
        return {};
      },
      strict ? "NUMBER > bound" : "NUMBER >= bound");
}
}  // namespace

CLI::Validator more_than(double bound) { return bound_check(bound, true); }
CLI::Validator at_least(double bound) { return bound_check(bound, false); }

Limits limits_of(const Common& c) {
  Limits l = c.limits;
  // MiB options; saturate rather than wrap for absurd values.
  l.max_metadata_bytes =
      c.max_metadata_mb > (UINT64_MAX >> 20) ? UINT64_MAX : c.max_metadata_mb << 20;
  l.max_inflated_bytes =
      c.max_inflated_mb > (UINT64_MAX >> 20) ? UINT64_MAX : c.max_inflated_mb << 20;
  l.max_object_bytes = c.max_object_mb > (UINT64_MAX >> 20) ? UINT64_MAX : c.max_object_mb << 20;
  return l;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}
}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    // Lengths that differ by more than the limit cannot be close: skip the quadratic table
    // (a checkpoint may have 100,000 names).
    const size_t gap = c.size() > word.size() ? c.size() - word.size() : word.size() - c.size();
    if (gap > limit && c.rfind(word, 0) != 0) continue;
    size_t d = gap > limit ? SIZE_MAX : edit_distance(word, c);
    if (c.rfind(word, 0) == 0) d = std::min<size_t>(d, 1);  // a prefix
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= limit ? best : std::string();
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

std::string error_line(const Error& e) {
  std::string line = printable(e.what());
  // Library messages name the library's options; the tool's user sets its flags.
  static const std::pair<const char*, const char*> kOptions[] = {
      {"SafetensorsSaveOptions::copy_shared", "--copy-shared"},
      {"TargetSettings::alignment", "--align"},
      {"TargetSettings::copy_shared", "--copy-shared"},
      {"TargetSettings::meta", "--meta"},
      {"TargetSettings::store_digests", "--digests"},
      {"TargetSettings::encryption", "--encrypt-key / --encrypt-password-file"},
      {"TargetSettings::dcp_files", "--dcp-files"},
      {"ConvertOptions::max_shard_size", "--max-shard-size"},
      {"SafetensorsSaveOptions::meta = MetaTensors::kZeros", "--meta=zeros"},
      {"MetaTensors::kSkip", "--meta=skip"},
      {"OpenOptions::decrypt_key", "--decrypt-key FILE"},
      {"OpenOptions::decrypt_password", "--decrypt-password-file FILE"},
  };
  for (const auto& [option, flag] : kOptions)
    for (size_t at; (at = line.find(option)) != std::string::npos;)
      line.replace(at, std::strlen(option), flag);
  if (line.find("RemoteOptions::download_whole") != std::string::npos)
    return line + "; `ckpt load` and `ckpt convert` download such an object whole";
  if (e.code() != ErrorCode::kLimitExceeded) return line;
  // Library messages name the field ("Limits::max_tensors", "limits.max_records").
  static const std::pair<const char*, const char*> kFlags[] = {
      {"max_metadata_bytes", "--max-metadata-mb"},
      {"max_tensors", "--max-tensors"},
      {"max_dims", "--max-dims"},
      {"max_pickle_memo", "--max-pickle-memo"},
      {"max_pickle_stack", "--max-pickle-stack"},
      {"max_pickle_depth", "--max-pickle-depth"},
      {"max_inflated_bytes", "--max-inflated-mb"},
      {"max_records", "--max-records"},
      {"max_object_bytes", "--max-object-mb (or --object-bytes-per-byte)"},
  };
  for (const auto& [field, flag] : kFlags)
    if (line.find(field) != std::string::npos) return line + "; raise it with " + flag;
  return line;
}

// A secret (key or password) file others can read: say so, once per file.
void warn_if_readable_by_others(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077))
    std::fprintf(stderr,
                 "ckpt: warning: %s holds a secret but is readable by others (mode %03o); "
                 "chmod 600 it\n",
                 path.c_str(), static_cast<unsigned>(st.st_mode & 0777));
}

namespace {
std::string slurp(const std::string& path) {
  warn_if_readable_by_others(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kNotFound, "cannot read key/password file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

Checkpoint open_checkpoint(const std::string& path, const Common& c) {
  Checkpoint ck = Checkpoint::open(path, open_options(c));
  // A decryption option the file has no use for would be silently ignored: say so.
  if (!c.key_file.empty() || !c.password_file.empty()) {
    auto it = ck.properties().find("encrypted");
    if (it == ck.properties().end() || it->second != "true")
      std::fprintf(stderr, "ckpt: warning: %s is not encrypted; %s ignored\n",
                   redact_url(path).c_str(),
                   !c.key_file.empty() ? "--decrypt-key" : "--decrypt-password-file");
  }
  return ck;
}

Checkpoint open_checkpoint(const std::vector<std::string>& paths, const Common& c) {
  if (paths.size() == 1) return open_checkpoint(paths[0], c);
  Checkpoint ck = Checkpoint::open_set(paths, open_options(c));
  if (!c.key_file.empty() || !c.password_file.empty()) {
    auto it = ck.properties().find("encrypted");
    if (it == ck.properties().end() || it->second != "true")
      std::fprintf(stderr, "ckpt: warning: %s is not encrypted; %s ignored\n",
                   files_name(paths).c_str(),
                   !c.key_file.empty() ? "--decrypt-key" : "--decrypt-password-file");
  }
  return ck;
}

LoadedCheckpoint load_set(const std::vector<std::string>& paths, const Common& c,
                          const LoadOptions& lo) {
  Checkpoint ck = open_checkpoint(paths, c);
  std::vector<Tensor> tensors = ck.load_all(lo);
  return {std::move(ck), std::move(tensors)};
}

std::string files_name(const std::vector<std::string>& paths) {
  if (paths.empty()) return {};
  if (paths.size() == 1) return redact_url(paths[0]);
  return redact_url(paths[0]) + " and " + std::to_string(paths.size() - 1) + " more file" +
         (paths.size() == 2 ? "" : "s");
}

RemoteOptions remote_options(const Common& c) {
  RemoteOptions r;
  r.connections = c.connections;
  r.chunk_size = c.chunk_mb << 20;
  r.retries = c.retries;
  r.low_speed_time_s = c.stall_timeout;
  r.ca_file = c.ca_bundle;
  r.timeout_s = c.timeout;
  r.download_whole = c.download_whole;
  r.on_note = [](const std::string& note) {
    std::fprintf(stderr, "ckpt: note: %s\n", note.c_str());
  };
  return r;
}

OpenOptions open_options(const Common& c) {
  OpenOptions o;
  o.strict = c.strict;
  o.mmap = !c.no_mmap;
  o.limits = limits_of(c);
  o.remote = remote_options(c);
  if (!c.key_file.empty()) {
    std::string k = slurp(c.key_file);
    while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
    o.decrypt_key = k;
  }
  if (!c.password_file.empty()) {
    std::string p = slurp(c.password_file);
    auto nl = p.find('\n');
    if (nl != std::string::npos) p.resize(nl);
    if (!p.empty() && p.back() == '\r') p.pop_back();
    o.decrypt_password = p;
  }
  return o;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

bool listed(const TensorInfo& t) { return t.type != "qparams"; }

std::optional<uint64_t> file_offset(const Checkpoint& c, const TensorInfo& t) {
  const StorageInfo& s = c.storages()[t.storage];
  if (s.offset == kNoOffset || s.meta) return std::nullopt;
  return s.offset + t.byte_offset();
}

void keep_until_exit(Checkpoint c) {
  // Reachable from a static, so LeakSanitizer does not report it.
  static auto* kept = new std::vector<Checkpoint>;
  kept->push_back(std::move(c));
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace ckpt::cli
