#include "convert/encryption.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kNotFound, "cannot read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

ConvertCrypt resolve_encryption(const ConvertEncryption& e) {
  const int set =
      !e.key.empty() + !e.key_file.empty() + !e.password.empty() + !e.password_file.empty();
  if (set > 1)
    throw Error(ErrorCode::kInvalidArgument,
                "encryption: set only one of key, key_file, password and password_file");
  ConvertCrypt c;
  c.save.pwhash_opslimit = e.pwhash_opslimit;
  c.save.pwhash_memlimit = e.pwhash_memlimit;
  if (!e.key.empty()) {
    c.save.encryption = TensorizerEncryption::kKey;
    c.save.key = e.key;
  } else if (!e.key_file.empty()) {
    if (std::filesystem::exists(e.key_file)) {
      std::string k = read_text(e.key_file);
      while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
      c.save.encryption = TensorizerEncryption::kKey;
      c.save.key = std::move(k);
    } else {
      c.save.encryption = TensorizerEncryption::kRandomKey;
      c.new_key_file = e.key_file;
    }
  } else if (!e.password.empty()) {
    c.save.encryption = TensorizerEncryption::kPassword;
    c.save.password = e.password;
  } else if (!e.password_file.empty()) {
    std::string p = read_text(e.password_file);
    auto nl = p.find('\n');
    if (nl != std::string::npos) p.resize(nl);
    if (!p.empty() && p.back() == '\r') p.pop_back();
    c.save.encryption = TensorizerEncryption::kPassword;
    c.save.password = std::move(p);
  }
  return c;
}

void write_key_file(const std::string& path, const std::string& raw_key, bool atomic, bool fsync) {
  FileSinkOptions fo;
  fo.atomic = atomic;
  fo.fsync = fsync;
  fo.owner_only = true;  // a key file is a secret: 0600 from its creation on
  fo.replace = false;    // and one that appeared meanwhile is never overwritten
  auto sink = create_file_sink(path, fo);
  sink->write(to_hex(std::as_bytes(std::span(raw_key.data(), raw_key.size()))) + "\n");
  sink->commit();
}

}  // namespace ckpt::internal
