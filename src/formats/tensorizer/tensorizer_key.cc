#include "formats/tensorizer/tensorizer_key.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kNotFound, "cannot read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The mode the key source set gives (kNone: none is set).
TensorizerEncryption mode_of(const TensorizerSaveOptions& o) {
  if (!o.key.empty()) return TensorizerEncryption::kKey;
  if (!o.key_file.empty()) return TensorizerEncryption::kKeyFile;
  if (!o.password.empty() || !o.password_file.empty()) return TensorizerEncryption::kPassword;
  return TensorizerEncryption::kNone;
}

}  // namespace

ResolvedKey resolve_key(const TensorizerSaveOptions& o) {
  const int set =
      !o.key.empty() + !o.key_file.empty() + !o.password.empty() + !o.password_file.empty();
  if (set > 1)
    throw Error(ErrorCode::kInvalidArgument,
                "encryption: set only one of key, key_file, password and password_file");
  const TensorizerEncryption given = mode_of(o);
  TensorizerEncryption mode = o.encryption == TensorizerEncryption::kNone ? given : o.encryption;
  const bool agrees =
      given == TensorizerEncryption::kNone || given == mode ||
      (mode == TensorizerEncryption::kRandomKey && given == TensorizerEncryption::kKeyFile);
  if (!agrees)
    throw Error(ErrorCode::kInvalidArgument,
                "encryption: the key source set (key, key_file, password or password_file) does "
                "not go with TensorizerSaveOptions::encryption");
  ResolvedKey r;
  r.options = o;
  r.options.key_file.clear();
  r.options.password_file.clear();
  if (mode == TensorizerEncryption::kKeyFile) {
    if (std::filesystem::exists(o.key_file)) {
      std::string k = read_text(o.key_file);
      while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
      r.options.key = std::move(k);
      mode = TensorizerEncryption::kKey;
    } else {
      mode = TensorizerEncryption::kRandomKey;
    }
  }
  if (mode == TensorizerEncryption::kRandomKey) r.new_key_file = o.key_file;
  if (!o.password_file.empty()) {
    std::string p = read_text(o.password_file);
    auto nl = p.find('\n');
    if (nl != std::string::npos) p.resize(nl);
    if (!p.empty() && p.back() == '\r') p.pop_back();
    r.options.password = std::move(p);
  }
  r.options.encryption = mode;
  return r;
}

}  // namespace ckpt::internal
