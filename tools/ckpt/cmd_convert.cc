// ckpt convert IN OUT [--to pt|safetensors|tensorizer] [--align N] [--copy-shared]
// [--encrypt-key FILE | --encrypt-password-file FILE] [--decrypt-key FILE |
// --decrypt-password-file FILE]
// Reads any supported checkpoint and writes the target format (from OUT's extension unless --to
// says). Names, dtypes, shapes and values are preserved bit-exact; non-tensor values that the
// target cannot hold (safetensors, tensorizer) are reported on stderr, never silently dropped.
// On a terminal, conversions that take a while show a one-line progress bar on stderr.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
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
  throw Error(
      ErrorCode::kInvalidArgument,
      "cannot tell the output format from '" + ext + "'; use --to pt|safetensors|tensorizer", out);
}

// Paths of non-tensor leaves (what a flat tensor format drops).
void non_tensor_paths(const ValuePtr& v, const std::string& path, std::vector<std::string>& out,
                      std::set<const Value*>& seen, int depth) {
  if (!v || depth > 200) return;
  auto child = [&](const std::string& c) { return path.empty() ? c : path + "." + c; };
  switch (v->kind) {
    case Value::Kind::kTensor:
      return;
    case Value::Kind::kDict:
      // An empty container is structure the flat format loses too. Checked before `seen`:
      // pickle shares one () between all its uses, and each path must be reported.
      if (v->entries.empty() && !v->state) {
        if (!path.empty()) out.push_back(path);
        return;
      }
      if (!seen.insert(v.get()).second) return;
      for (auto& [k, val] : v->entries)
        non_tensor_paths(val, child(k ? path_component(*k) : "?"), out, seen, depth + 1);
      if (v->state)
        out.push_back(
            child("<attributes of " + (v->name.empty() ? std::string("dict") : v->name) + ">"));
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (v->items.empty()) {
        if (!path.empty()) out.push_back(path);
        return;
      }
      if (!seen.insert(v.get()).second) return;
      for (size_t i = 0; i < v->items.size(); ++i)
        non_tensor_paths(v->items[i], child(std::to_string(i)), out, seen, depth + 1);
      return;
    default:
      out.push_back(path.empty() ? "<root>" : path);
  }
}

// Every path under which a tensor appears in the tree, in tree (depth-first) order. torch.save
// writes a tied weight once and reaches it from several keys ("encoder.weight",
// "decoder.weight"); `ckpt ls` names it by the first path, the others are its aliases. A flat
// format has no references, so the aliases must be written (or refused) explicitly, not lost.
void tensor_paths(const ValuePtr& v, const std::string& path,
                  std::vector<std::pair<std::string, size_t>>& out, std::set<const Value*>& seen,
                  int depth) {
  if (!v || depth > 200) return;
  auto child = [&](const std::string& c) { return path.empty() ? c : path + "." + c; };
  switch (v->kind) {
    case Value::Kind::kTensor:
      if (v->i >= 0) out.emplace_back(path, static_cast<size_t>(v->i));
      return;
    case Value::Kind::kDict:
      if (!seen.insert(v.get()).second) return;
      for (auto& [k, val] : v->entries)
        tensor_paths(val, child(k ? path_component(*k) : "?"), out, seen, depth + 1);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (!seen.insert(v.get()).second) return;
      for (size_t i = 0; i < v->items.size(); ++i)
        tensor_paths(v->items[i], child(std::to_string(i)), out, seen, depth + 1);
      return;
    default:
      return;
  }
}

// The output file's sink, drawing a progress line on stderr when it is a terminal. It sits
// between the writers and the file, so every format gets the same bar without callbacks in the
// writers: it counts the bytes they write. Big writes (one tensor is one write) are passed on in
// pieces so that the bar keeps moving through a large tensor. Quick conversions draw nothing:
// the first draw waits until kDelay seconds have passed.
class ProgressSink final : public ByteSink {
 public:
  ProgressSink(std::unique_ptr<ByteSink> inner, uint64_t total)
      : inner_(std::move(inner)),
        total_(total),
        draw_(isatty(STDERR_FILENO) == 1),
        t0_(now_seconds()) {}
  ~ProgressSink() override { end_line(); }
  const std::string& name() const override { return inner_->name(); }
  void write(std::span<const std::byte> bytes) override {
    if (!draw_) return inner_->write(bytes);
    constexpr size_t kPiece = 8 << 20;
    while (!bytes.empty()) {
      size_t n = std::min(bytes.size(), kPiece);
      inner_->write(bytes.first(n));
      bytes = bytes.subspan(n);
      tick(false);
    }
  }
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    inner_->patch(offset, bytes);
  }
  uint64_t position() const override { return inner_->position(); }
  void commit() override {
    inner_->commit();
    if (draw_) {
      tick(true);
      end_line();
    }
  }

 private:
  static constexpr double kDelay = 0.25, kEvery = 0.1;
  void tick(bool last) {
    double now = now_seconds();
    if (!last && (now - t0_ < kDelay || now - drawn_at_ < kEvery)) return;
    if (last && !drawn_ && now - t0_ < kDelay) return;
    uint64_t done = inner_->position();
    // `total` counts tensor bytes only; headers and padding come on top, so cap the percentage
    // until the file is complete.
    int pct = total_ ? static_cast<int>(std::min<uint64_t>(done * 100 / total_, 99)) : 0;
    if (last) pct = 100;
    double secs = std::max(now - t0_, 1e-9);
    // Never show more done than total: the estimate grows to what was actually written.
    std::fprintf(stderr, "\r%s / %s  %3d%%  %.1f MB/s   ", human_bytes(done).c_str(),
                 human_bytes(std::max(total_, done)).c_str(), pct,
                 static_cast<double>(done) / secs / 1e6);
    std::fflush(stderr);
    drawn_ = true;
    drawn_at_ = now;
  }
  // Ends the progress line so that what follows (the summary, or an error) starts on its own.
  void end_line() {
    if (!drawn_) return;
    std::fputc('\n', stderr);
    drawn_ = false;
  }

  std::unique_ptr<ByteSink> inner_;
  uint64_t total_;
  bool draw_;
  double t0_, drawn_at_ = 0;
  bool drawn_ = false;
};

// The torch zip folder name, as save_torch(path, ...) derives it: the file name up to the first
// dot (torch.save does the same).
std::string archive_name_for(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  base = base.substr(0, base.find('.'));
  return base.empty() ? "archive" : base;
}

std::string to_hex(const std::string& raw) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
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
  auto* cmd =
      app.add_subcommand("convert", "convert a checkpoint to pt, safetensors or tensorizer");
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
    bool torchscript = c.format() == Format::kTorchScript;
    if (torchscript) {
      // A TorchScript module becomes its state dict (parameters and buffers by module path),
      // which load_state_dict accepts: the __torch__ module objects would not torch.load.
      TorchScriptArchive a = TorchScriptArchive::from(c);
      for (const auto& [name, index] : a.state_dict()) {
        Tensor t = c.tensor(index);
        t.info().name = name;
        t.info().requires_grad = false;  // as module.state_dict() gives them
        tensors.push_back(std::move(t));
      }
    } else {
      for (size_t i = 0; i < c.tensors().size(); ++i) tensors.push_back(c.tensor(i));
    }
    for (const auto& s : c.storages()) bytes += s.nbytes;
    size_t written = tensors.size();  // what the summary reports: tensors in the output
    if ((!o->encrypt_key.empty() || !o->encrypt_password_file.empty()) && target != "tensorizer")
      throw Error(ErrorCode::kInvalidArgument,
                  "encryption is only available for tensorizer output");

    if (c.format() == Format::kSafetensors && target != "safetensors") {
      std::string keys;
      for (auto& [k, v] : c.properties())
        if (k.rfind("metadata.", 0) == 0 && k != "metadata.format")
          keys += (keys.empty() ? "" : ", ") + k.substr(9);
      if (!keys.empty())
        std::fprintf(stderr,
                     "ckpt: note: %s has no place for the safetensors __metadata__; not "
                     "written: %s\n",
                     target.c_str(), keys.c_str());
    }
    const FileSinkOptions fso;  // atomic + fsync: nothing appears under OUT unless it succeeds
    if (target == "pt") {
      SaveOptions so;
      if (o->align) so.alignment = o->align;
      so.archive_name = archive_name_for(o->out);
      // A safetensors root is a flat dict whose state holds __metadata__ (the reader keeps it
      // apart from tensor names that way); a pickle cannot give a plain dict state, so such a
      // file becomes a plain state dict (the metadata note above says what is lost).
      ValuePtr root = c.root() && !torchscript && c.format() != Format::kSafetensors
                          ? c.root()
                          : state_dict_value(tensors);
      ProgressSink sink(create_file_sink(o->out, fso), bytes);
      save_torch(sink, root, tensors, so);  // commits
    } else {
      std::vector<std::string> dropped;
      std::set<const Value*> seen;
      if (c.format() != Format::kSafetensors && c.format() != Format::kTensorizer && !torchscript)
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
      // Aliases of tied tensors get their own entries (sharing the storage), so that every name
      // torch.load would show survives the flat format.
      if (c.root() && !torchscript) {  // (a TorchScript state dict lists its aliases already)
        std::vector<std::pair<std::string, size_t>> paths;
        std::set<const Value*> seen_values;
        tensor_paths(c.root(), "", paths, seen_values, 0);
        std::set<size_t> reached;
        for (auto& [path, index] : paths) {
          if (index >= tensors.size() || !listed(tensors[index].info())) continue;
          if (reached.insert(index).second || path == tensors[index].name()) continue;
          TensorInfo info = tensors[index].info();
          info.name = path;
          listed_tensors.emplace_back(std::move(info), tensors[index].storage());
        }
      }
      for (auto& t : listed_tensors) {
        if (t.info().quantization)
          throw Error(ErrorCode::kUnsupported, "quantized tensors cannot be written to " + target,
                      o->in, t.name());
        if (t.name().empty())
          throw Error(ErrorCode::kInvalidArgument,
                      "the checkpoint is a single unnamed tensor; " + target +
                          " stores tensors by name (convert to pt instead)",
                      o->in);
      }
      // Sharing, as the writers see it: one Storage object, or one buffer under two of them.
      std::map<const void*, std::string> owner;
      std::vector<std::pair<std::string, std::string>> shared;  // (tensor, shares with)
      for (auto& t : listed_tensors) {
        if (!t.storage()) continue;
        auto [it, fresh] = owner.emplace(t.storage().get(), t.name());
        if (fresh && t.storage()->data && t.storage()->info.nbytes > 0) {
          auto [it2, fresh2] = owner.emplace(t.storage()->data, t.name());
          if (!fresh2) it = it2, fresh = false;
        }
        if (!fresh) shared.emplace_back(t.name(), it->second);
      }
      uint64_t total = 0;
      written = listed_tensors.size();
      for (auto& t : listed_tensors)
        if (!(t.storage() && t.storage()->info.meta)) total += t.info().nbytes();
      bytes = total;
      if (target == "safetensors") {
        if (!shared.empty() && !o->copy_shared)
          throw Error(ErrorCode::kInvalidArgument,
                      "shares its storage with '" + shared[0].second + "' (" +
                          std::to_string(shared.size()) +
                          " such tensors); safetensors cannot express shared or tied tensors: "
                          "use --copy-shared to write each as a separate copy",
                      o->in, shared[0].first);
        SafetensorsSaveOptions so;
        if (o->align) so.alignment = o->align;
        so.copy_shared = o->copy_shared;
        std::map<std::string, std::string> meta;
        for (auto& [k, v] : c.properties())
          if (k.rfind("metadata.", 0) == 0) meta[k.substr(9)] = v;
        if (meta.empty()) meta["format"] = "pt";
        ProgressSink sink(create_file_sink(o->out, fso), total);
        save_safetensors(sink, listed_tensors, meta, so);
        sink.commit();
      } else {
        // tensorizer stores every tensor on its own; sharing is lost, the bytes are not.
        if (!shared.empty())
          std::fprintf(stderr,
                       "ckpt: note: tensorizer cannot express shared or tied tensors; %zu "
                       "written as separate copies (first: %s, shares with %s)\n",
                       shared.size(), shared[0].first.c_str(), shared[0].second.c_str());
        TensorizerSaveOptions to;
        if (!o->encrypt_key.empty()) {
          if (std::filesystem::exists(o->encrypt_key)) {
            to.encryption = TensorizerEncryption::kKey;
            std::string k = read_text(o->encrypt_key);
            while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' '))
              k.pop_back();
            to.key = k;
          } else {
            to.encryption = TensorizerEncryption::kRandomKey;
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
        ProgressSink sink(create_file_sink(o->out, fso), total);
        std::string key = save_tensorizer(sink, entries, to);
        if (to.encryption == TensorizerEncryption::kRandomKey) {
          // The key is committed before the file: a file whose key was lost is unreadable.
          auto ks = create_file_sink(o->encrypt_key, fso);
          ks->write(to_hex(key) + "\n");
          ks->commit();
        }
        sink.commit();
        if (to.encryption == TensorizerEncryption::kRandomKey)
          std::fprintf(stderr, "ckpt: wrote a new random key to %s\n", o->encrypt_key.c_str());
      }
    }
    double dt = now_seconds() - t0;
    std::printf("wrote %s (%s): %zu tensors, %s in %.3f s\n", o->out.c_str(), target.c_str(),
                written, human_bytes(bytes).c_str(), dt);
  });
}

}  // namespace ckpt::cli
