// ckpt convert IN OUT [--to pt|safetensors|tensorizer] [--align N] [--encrypt-key FILE |
// --encrypt-password-file FILE] [--decrypt-key FILE | --decrypt-password-file FILE]
// Reads any supported checkpoint and writes the target format (from OUT's extension unless --to
// says). Names, dtypes, shapes and values are preserved bit-exact; non-tensor values that the
// target cannot hold (safetensors, tensorizer) are reported on stderr, never silently dropped.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "ckpt/tensorizer.h"
#include "common.h"

namespace ckpt::cli {
namespace {

std::string target_of(const std::string& to, const std::string& out) {
  if (!to.empty()) {
    if (to == "pt" || to == "torch") return "pt";
    if (to == "safetensors" || to == "tensorizer") return to;
    throw Error(ErrorCode::kInvalidArgument, "--to must be pt, safetensors or tensorizer");
  }
  auto ext = std::filesystem::path(out).extension().string();
  if (ext == ".safetensors") return "safetensors";
  if (ext == ".tensors") return "tensorizer";
  if (ext == ".pt" || ext == ".pth" || ext == ".bin" || ext == ".ckpt") return "pt";
  throw Error(ErrorCode::kInvalidArgument,
              "cannot tell the output format from '" + ext + "'; use --to pt|safetensors|tensorizer",
              out);
}

// Paths of non-tensor leaves (what a flat tensor format drops).
void non_tensor_paths(const ValuePtr& v, const std::string& path, std::vector<std::string>& out,
                      std::set<const Value*>& seen, int depth) {
  if (!v || depth > 200) return;
  auto child = [&](const std::string& c) { return path.empty() ? c : path + "." + c; };
  switch (v->kind) {
    case Value::Kind::kTensor: return;
    case Value::Kind::kDict:
      if (!seen.insert(v.get()).second) return;
      for (auto& [k, val] : v->entries) non_tensor_paths(val, child(k ? path_component(*k) : "?"), out, seen, depth + 1);
      if (v->state) out.push_back(child("<attributes of " + (v->name.empty() ? std::string("dict") : v->name) + ">"));
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (!seen.insert(v.get()).second) return;
      for (size_t i = 0; i < v->items.size(); ++i) non_tensor_paths(v->items[i], child(std::to_string(i)), out, seen, depth + 1);
      return;
    default:
      out.push_back(path.empty() ? "<root>" : path);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kNotFound, "cannot read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

void add_convert(CLI::App& app) {
  struct Opts {
    std::string in, out, to, encrypt_key, encrypt_password_file;
    uint32_t align = 0;
    bool copy_shared = false;
    Common common;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("convert", "convert a checkpoint to pt, safetensors or tensorizer");
  cmd->add_option("IN", o->in, "input checkpoint")->required();
  cmd->add_option("OUT", o->out, "output file (.pt/.pth/.bin, .safetensors, .tensors)")->required();
  cmd->add_option("--to", o->to, "output format: pt, safetensors or tensorizer");
  cmd->add_option("--align", o->align,
                  "alignment of tensor data (pt: default 64; safetensors: default 8)");
  cmd->add_flag("--copy-shared", o->copy_shared,
                "safetensors: write tensors that share storage as separate copies");
  auto* ek = cmd->add_option("--encrypt-key", o->encrypt_key,
                             "tensorizer: encrypt with the key in FILE (hex); a new random key is "
                             "written there if FILE does not exist");
  cmd->add_option("--encrypt-password-file", o->encrypt_password_file,
                  "tensorizer: encrypt with a key derived (Argon2id) from the password in FILE")
      ->excludes(ek);
  add_common(*cmd, o->common);
  cmd->callback([o] {
    double t0 = now_seconds();
    std::string target = target_of(o->to, o->out);
    Checkpoint c = open_checkpoint(o->in, o->common);
    // Views (zero-copy with mmap); the vector keeps storages shared while writing.
    std::vector<Tensor> tensors;
    tensors.reserve(c.tensors().size());
    uint64_t bytes = 0;
    for (size_t i = 0; i < c.tensors().size(); ++i) tensors.push_back(c.tensor(i));
    for (const auto& s : c.storages()) bytes += s.nbytes;
    if ((!o->encrypt_key.empty() || !o->encrypt_password_file.empty()) && target != "tensorizer")
      throw Error(ErrorCode::kInvalidArgument, "encryption is only available for tensorizer output");

    if (target == "pt") {
      SaveOptions so;
      if (o->align) so.alignment = o->align;
      ValuePtr root = c.root() ? c.root() : state_dict_value(tensors);
      save_torch(o->out, root, tensors, so);
    } else {
      std::vector<std::string> dropped;
      std::set<const Value*> seen;
      if (c.format() != Format::kSafetensors && c.format() != Format::kTensorizer)
        non_tensor_paths(c.root(), "", dropped, seen, 0);
      if (!dropped.empty()) {
        std::fprintf(stderr, "ckpt: note: %s cannot hold non-tensor values; not written (%zu):\n",
                     target.c_str(), dropped.size());
        for (size_t i = 0; i < dropped.size() && i < 20; ++i)
          std::fprintf(stderr, "  %s\n", dropped[i].c_str());
        if (dropped.size() > 20) std::fprintf(stderr, "  ... and %zu more\n", dropped.size() - 20);
      }
      std::vector<Tensor> listed_tensors;
      for (auto& t : tensors)
        if (listed(t.info())) listed_tensors.push_back(t);
      for (auto& t : listed_tensors)
        if (t.info().quantization)
          throw Error(ErrorCode::kUnsupported, "quantized tensors cannot be written to " + target,
                      o->in, t.name());
      if (target == "safetensors") {
        SafetensorsSaveOptions so;
        if (o->align) so.alignment = o->align;
        so.copy_shared = o->copy_shared;
        std::map<std::string, std::string> meta;
        for (auto& [k, v] : c.properties())
          if (k.rfind("metadata.", 0) == 0) meta[k.substr(9)] = v;
        if (meta.empty()) meta["format"] = "pt";
        save_safetensors(o->out, listed_tensors, meta, so);
      } else {
        TensorizerSaveOptions to;
        if (!o->encrypt_key.empty()) {
          if (std::filesystem::exists(o->encrypt_key)) {
            to.encryption = TensorizerEncryption::kKey;
            std::string k = read_text(o->encrypt_key);
            while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
            to.key = k;
          } else {
            to.encryption = TensorizerEncryption::kRandomKey;
            to.key_file = o->encrypt_key;
          }
        } else if (!o->encrypt_password_file.empty()) {
          to.encryption = TensorizerEncryption::kPassword;
          std::string p = read_text(o->encrypt_password_file);
          auto nl = p.find('\n');
          if (nl != std::string::npos) p.resize(nl);
          if (!p.empty() && p.back() == '\r') p.pop_back();
          to.password = p;
        }
        std::vector<TensorizerEntry> entries;
        for (auto& t : listed_tensors) {
          TensorizerEntry e;
          e.tensor = t;
          if (t.info().type == "param") e.type = TensorizerTensorType::kParam;
          if (t.info().type == "buffer") e.type = TensorizerTensorType::kBuffer;
          e.meta = t.storage() && t.storage()->info.meta;
          entries.push_back(std::move(e));
        }
        save_tensorizer(o->out, entries, to);
        if (to.encryption == TensorizerEncryption::kRandomKey)
          std::fprintf(stderr, "ckpt: wrote a new random key to %s\n", o->encrypt_key.c_str());
      }
    }
    double dt = now_seconds() - t0;
    std::printf("wrote %s (%s): %zu tensors, %s in %.3f s\n", o->out.c_str(), target.c_str(),
                tensors.size(), human_bytes(bytes).c_str(), dt);
  });
}

}  // namespace ckpt::cli
