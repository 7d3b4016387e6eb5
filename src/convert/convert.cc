// convert(): a checkpoint of any format to a torch zip, safetensors or tensorizer file.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "ckpt/safetensors.h"
#include "ckpt/tensorizer.h"
#include "ckpt/torchscript.h"
#if __has_include("ckpt/torch.h")
#include "ckpt/torch.h"
#endif
#include "convert/digest_internal.h"
#include "convert/encryption.h"
#include "convert/progress_sink.h"
#include "convert/shards.h"

namespace ckpt {
namespace {

using internal::ProgressSink;

// The torch zip folder name save_torch(path, ...) and torch.save derive: the file name up to
// its first dot.
std::string archive_name_for(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  base = base.substr(0, base.find('.'));
  return base.empty() ? "archive" : base;
}

// The checkpoint's tensors with their bytes. A mapped checkpoint gives views (zero-copy; pages
// are read as the writer reaches them); an unmapped one, or with `copy`, is loaded whole by
// load_all's reader threads, which is what reading tensor by tensor would hold at the end too.
class TensorSource {
 public:
  TensorSource(const Checkpoint& c, const LoadOptions& o) : c_(c), o_(o) {
    if (!c.source().memory() || o.copy) {
      all_ = c.load_all(o);
      loaded_ = true;
    }
  }
  Tensor get(size_t index) const { return loaded_ ? all_.at(index) : c_.tensor(index, o_); }

 private:
  const Checkpoint& c_;
  const LoadOptions& o_;
  std::vector<Tensor> all_;
  bool loaded_ = false;
};

// Where the output goes: created on first use, so that everything that can be refused before
// writing is refused before a file (or its temporary) exists.
using OpenSink = std::function<ByteSink&()>;

// Writes through a ProgressSink when there is a callback, else straight into the sink.
class Output {
 public:
  Output(const OpenSink& open, uint64_t total, const ConvertOptions& o)
      : sink_(open()) {
    if (o.progress)
      progress_.emplace(sink_, total, o.progress,
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            o.progress_interval));
  }
  ByteSink& sink() { return progress_ ? static_cast<ByteSink&>(*progress_) : sink_; }
  // After the commit: the size, and the last progress call.
  uint64_t finish() {
    if (progress_) progress_->finish();
    return sink_.position();
  }

 private:
  ByteSink& sink_;
  std::optional<ProgressSink> progress_;
};

void write_torch(const Checkpoint& c, const OpenSink& open, const ConvertOptions& o,
                 ConvertReport& r) {
  TensorSource source(c, o.load);
  std::vector<Tensor> tensors;
  tensors.reserve(c.tensors().size());
  const bool torchscript = c.format() == Format::kTorchScript;
  ValuePtr state_root;
  if (torchscript) {
    // A TorchScript module becomes its state dict (parameters and buffers by module path),
    // which load_state_dict accepts: the __torch__ module objects would not torch.load.
    TorchScriptArchive a = TorchScriptArchive::from(c);
    for (const auto& [name, index] : a.state_dict()) {
      Tensor t = source.get(index);
      t.info().name = name;
      t.info().requires_grad = false;  // as module.state_dict() gives them
      tensors.push_back(std::move(t));
    }
    // A per-channel quantized tensor's scales and zero points are tensors of the archive's
    // table, not of the state dict: they follow it, and its quantization points at them there.
    const size_t n_state = tensors.size();
    std::unordered_map<size_t, size_t> placed;
    auto place = [&](size_t index) {
      auto [it, fresh] = placed.emplace(index, tensors.size());
      if (fresh) tensors.push_back(source.get(index));
      return it->second;
    };
    for (size_t k = 0; k < n_state; ++k) {
      std::optional<Quantization> q = tensors[k].info().quantization;
      if (!q || !q->scales_tensor || !q->zero_points_tensor) continue;
      q->scales_tensor = place(*q->scales_tensor);
      q->zero_points_tensor = place(*q->zero_points_tensor);
      tensors[k].info().quantization = q;
    }
    state_root = state_dict_value(std::vector<Tensor>(tensors.begin(), tensors.begin() + n_state));
  } else {
    for (size_t i = 0; i < c.tensors().size(); ++i) tensors.push_back(source.get(i));
  }
  uint64_t bytes = 0;
  for (const auto& s : c.storages()) bytes += s.nbytes;
  SaveOptions so;
  if (o.alignment) so.alignment = o.alignment;
  so.archive_name = o.archive_name;
  Output out(open, bytes, o);
  // A safetensors root is a flat dict whose state holds __metadata__ (the reader keeps it apart
  // from tensor names that way); a pickle cannot give a plain dict a state, so such a file
  // becomes a plain state dict (metadata_not_written says what is lost).
  if (c.root() && !torchscript && c.format() != Format::kSafetensors)
    save_torch(out.sink(), c.root(), tensors, so);  // commits
  else
    save_torch(out.sink(), state_root ? state_root : state_dict_value(tensors), tensors, so);
  // Per-channel scales and zero points are part of their tensor, not counted apart.
  r.tensors = std::count_if(tensors.begin(), tensors.end(),
                            [](const Tensor& t) { return t.info().type != "qparams"; });
  r.tensor_bytes = bytes;
  r.bytes_written = out.finish();
}

void write_flat(const Checkpoint& c, const OpenSink& open, const ConvertOptions& o,
                ConvertReport& r) {
  const std::string target = convert_format_name(o.to);
  const std::string& in = c.source().name();
  // Keys and passwords are read before anything is written.
  internal::ConvertCrypt crypt;
  if (o.to == ConvertFormat::kTensorizer) crypt = internal::resolve_encryption(o.encryption);

  FlattenOptions fo;
  fo.limits = o.limits;
  FlatStateDict flat = flatten_state_dict(c, fo);
  const auto& infos = c.tensors();
  if (o.to == ConvertFormat::kSafetensors) {
    // Meta tensors have no bytes and safetensors no meta tensors: never invent zeros silently.
    auto is_meta = [&](const StateDictEntry& e) {
      return c.storages().at(infos[e.tensor].storage).meta;
    };
    for (const auto& e : flat.entries) {
      if (!is_meta(e)) continue;
      if (o.meta == MetaTensors::kRefuse)
        throw Error(ErrorCode::kUnsupported,
                    "is a meta tensor (a dtype and shape without bytes), which " + target +
                        " cannot hold: --meta=zeros (MetaTensors::kZeros) writes zeros, "
                        "--meta=skip (kSkip) leaves it out",
                    in, e.name);
      (o.meta == MetaTensors::kZeros ? r.meta_zeroed : r.meta_skipped).push_back(e.name);
    }
    if (o.meta == MetaTensors::kSkip && !r.meta_skipped.empty()) {
      // Indices into `entries` (alias_of, shares_with) are renumbered past the removed ones.
      std::vector<size_t> new_index(flat.entries.size(), SIZE_MAX);
      std::vector<StateDictEntry> kept;
      for (size_t i = 0; i < flat.entries.size(); ++i) {
        if (is_meta(flat.entries[i])) continue;
        new_index[i] = kept.size();
        kept.push_back(flat.entries[i]);
      }
      for (auto& e : kept) {
        if (e.alias_of) e.alias_of = new_index[*e.alias_of];
        if (e.shares_with) e.shares_with = new_index[*e.shares_with];
      }
      flat.entries = std::move(kept);
    }
  }
  for (const auto& e : flat.entries) {
    if (infos[e.tensor].quantization)
      throw Error(ErrorCode::kUnsupported, "quantized tensors cannot be written to " + target, in,
                  e.name);
    if (e.name.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "the checkpoint is a single unnamed tensor; " + target +
                      " stores tensors by name (convert to pt instead)",
                  in);
  }
  std::vector<std::pair<std::string, std::string>> shared;  // (tensor, shares with)
  uint64_t total = 0;
  for (const auto& e : flat.entries) {
    if (e.shares_with) shared.emplace_back(e.name, flat.entries[*e.shares_with].name);
    const TensorInfo& t = infos[e.tensor];
    if (!c.storages().at(t.storage).meta) total += t.nbytes();
  }
  if (o.to == ConvertFormat::kSafetensors && !shared.empty() && !o.copy_shared)
    throw Error(ErrorCode::kInvalidArgument,
                "shares its storage with '" + shared[0].second + "' (" +
                    std::to_string(shared.size()) +
                    " such tensors); safetensors cannot express shared or tied tensors: "
                    "use --copy-shared (ConvertOptions::copy_shared) to write each as a "
                    "separate copy",
                in, shared[0].first);

  // Tensors under their flat names; aliases share the storage of their tensor.
  TensorSource source(c, o.load);
  std::vector<Tensor> tensors;
  tensors.reserve(flat.entries.size());
  for (const auto& e : flat.entries) {
    Tensor t = source.get(e.tensor);
    if (t.name() != e.name) t.info().name = e.name;
    tensors.push_back(std::move(t));
  }
  r.not_written = std::move(flat.non_tensors);
  r.tensors = tensors.size();
  r.tensor_bytes = total;

  if (o.to == ConvertFormat::kSafetensors) {
    SafetensorsSaveOptions so;
    if (o.alignment) so.alignment = o.alignment;
    so.copy_shared = o.copy_shared;
    std::map<std::string, std::string> meta;
    for (const auto& [k, v] : c.properties())
      if (k.rfind("metadata.", 0) == 0) meta[k.substr(9)] = v;
    if (meta.empty()) meta["format"] = "pt";
    if (o.store_digests) {
      // Each distinct tensor once; a tied name repeats its tensor's digest.
      std::vector<bool> want(tensors.size());
      for (size_t i = 0; i < flat.entries.size(); ++i) want[i] = !flat.entries[i].alias_of;
      auto sums = internal::tensor_sha256_all(tensors, want, o.load.threads);
      std::vector<TensorDigest> digests(tensors.size());
      for (size_t i = 0; i < flat.entries.size(); ++i) {
        const auto& e = flat.entries[i];
        digests[i].name = e.name;
        digests[i].sha256 = sums[e.alias_of ? *e.alias_of : i];
      }
      meta[kSafetensorsDigestKey] = safetensors_digest_metadata(digests);
      r.digests_stored = digests.size();
    }
    Output out(open, total, o);
    save_safetensors(out.sink(), tensors, meta, so);
    out.sink().commit();
    r.bytes_written = out.finish();
  } else {
    // tensorizer stores every tensor on its own: sharing is lost, the bytes are not.
    std::vector<TensorizerEntry> entries;
    entries.reserve(tensors.size());
    for (auto& t : tensors) {
      TensorizerEntry e;
      if (t.info().type == "param") e.type = TensorizerTensorType::kParam;
      if (t.info().type == "buffer") e.type = TensorizerTensorType::kBuffer;
      e.meta = t.storage() && t.storage()->info.meta;
      e.tensor = std::move(t);
      entries.push_back(std::move(e));
    }
    tensors.clear();
    Output out(open, total, o);
    r.key = save_tensorizer(out.sink(), entries, crypt.save);
    if (crypt.save.encryption == TensorizerEncryption::kRandomKey) {
      // The key is committed before the file: a file whose key was lost is unreadable.
      internal::write_key_file(crypt.new_key_file, r.key, o.atomic, o.fsync);
      r.key_file_written = true;
    }
    out.sink().commit();
    r.bytes_written = out.finish();
  }
  r.copied_shared = std::move(shared);
}

ConvertReport run(const Checkpoint& c, const ConvertOptions& o, const OpenSink& open) {
  ConvertReport r;
  r.format = o.to;
  if (o.encryption.enabled() && o.to != ConvertFormat::kTensorizer)
    throw Error(ErrorCode::kInvalidArgument, "encryption is only available for tensorizer output");
  if (o.store_digests && o.to != ConvertFormat::kSafetensors)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("stored digests are only available for safetensors output (") +
                    convert_format_name(o.to) +
                    " has no place for them; use `ckpt digest` for a manifest beside the file)");
  if (c.format() == Format::kSafetensors && o.to != ConvertFormat::kSafetensors)
    for (const auto& [k, v] : c.properties())
      if (k.rfind("metadata.", 0) == 0 && k != "metadata.format")
        r.metadata_not_written.push_back(k.substr(9));
  if (o.to == ConvertFormat::kTorch)
    write_torch(c, open, o, r);
  else
    write_flat(c, open, o, r);
  return r;
}

}  // namespace

namespace {

// An upload (ConvertOptions::remote): streamed where the writer only appends, else through a
// local temporary file.
ConvertReport convert_to_url(const Checkpoint& c, const std::string& url, ConvertOptions o) {
  if (o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument, "shards are written to local files only",
                redact_url(url));
  if (o.archive_name.empty()) o.archive_name = archive_name_for(url);
  std::unique_ptr<ByteSink> sink = create_s3_sink(url, o.remote);
  if (o.to != ConvertFormat::kTensorizer)
    return run(c, o, [&]() -> ByteSink& { return *sink; });
  const char* dir = std::getenv("TMPDIR");
  const std::string tmp = std::string(dir && *dir ? dir : "/tmp") + "/.ckpt-upload-" +
                          std::to_string(::getpid()) + "-" +
                          std::to_string(reinterpret_cast<uintptr_t>(sink.get())) + ".tensors";
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove{tmp};
  ConvertReport r = convert(c, tmp, o);
  SourcePtr local = open_file_source(tmp);
  std::vector<std::byte> buf(std::min<uint64_t>(local->size(), 8 << 20));
  for (uint64_t done = 0; done < local->size(); done += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), local->size() - done);
    local->read_into(done, std::span<std::byte>(buf.data(), n));
    sink->write(std::span<const std::byte>(buf.data(), n));
  }
  sink->commit();
  return r;
}

}  // namespace

ConvertReport convert(const Checkpoint& c, const std::string& out_path,
                      const ConvertOptions& options) {
  ConvertOptions o = options;
  if (o.to == ConvertFormat::kAuto) {
    // A sharded output may be named by its index: "model.safetensors.index.json".
    std::string named = out_path;
    if (o.max_shard_size && named.size() > 11 &&
        named.compare(named.size() - 11, 11, ".index.json") == 0)
      named.resize(named.size() - 11);
    o.to = convert_format_for_path(named);
  }
  if (is_url(out_path)) return convert_to_url(c, out_path, o);
  if (o.max_shard_size) return internal::convert_sharded(c, out_path, o);
  if (o.archive_name.empty()) o.archive_name = archive_name_for(out_path);
  std::unique_ptr<ByteSink> file;
  return run(c, o, [&]() -> ByteSink& {
    file = create_file_sink(out_path, FileSinkOptions{o.atomic, o.fsync});
    return *file;
  });
}

ConvertReport convert(const Checkpoint& c, ByteSink& sink, const ConvertOptions& options) {
  ConvertOptions o = options;
  if (o.to == ConvertFormat::kAuto) o.to = convert_format_for_path(sink.name());
  if (o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument,
                "shards (max_shard_size) are written to files: use the path overload");
  return run(c, o, [&]() -> ByteSink& { return sink; });
}

}  // namespace ckpt
