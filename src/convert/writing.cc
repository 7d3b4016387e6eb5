// The steps of convert() (writing.h): the writer for a target and its options, the rules checked
// against its capabilities, and the content it writes.

#include "convert/writing.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "api/checkpoint_impl.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/torch.h"
#include "ckpt/torchscript.h"
#include "convert/digest_internal.h"
#include "convert/encryption.h"
#include "convert/transform.h"
#include "formats/dcp/dcp_writer.h"

namespace ckpt::internal {

namespace {

// Storages of an unmapped checkpoint read in the writer's order through the kind's ring.
class CheckpointFeed final : public TensorFeed {
 public:
  CheckpointFeed(const Checkpoint& c, const LoadOptions& o, uint64_t budget,
                 std::unordered_map<const Storage*, uint32_t> index)
      : c_(c), o_(o), budget_(budget), index_(std::move(index)) {}

  void each(std::span<const Tensor* const> tensors,
            const std::function<void(size_t, const Tensor&)>& fn) const override {
    // One read per run of consecutive tensors of one storage.
    std::vector<uint32_t> order;
    std::vector<size_t> run;  // run j: tensors [run[j], run[j + 1])
    for (size_t k = 0; k < tensors.size(); ++k) {
      const uint32_t s = index_.at(tensors[k]->storage().get());
      if (order.empty() || order.back() != s) {
        order.push_back(s);
        run.push_back(k);
      }
    }
    run.push_back(tensors.size());
    CheckpointAccess::kind(c_).stream_storages(
        budget_, order,
        [&](size_t j, const StoragePtr& st) {
          for (size_t k = run[j]; k < run[j + 1]; ++k) fn(k, Tensor(tensors[k]->info(), st));
        },
        o_);
  }

 private:
  const Checkpoint& c_;
  const LoadOptions& o_;
  const uint64_t budget_;
  const std::unordered_map<const Storage*, uint32_t> index_;  // placeholder -> storage
};

// Whether every storage with bytes is a view of a mapped file (no read, no copy).
bool all_viewed(const Checkpoint& c) {
  const CheckpointKind& kind = CheckpointAccess::kind(c);
  const auto& storages = c.storages();
  for (size_t s = 0; s < storages.size(); ++s)
    if (!storages[s].meta && storages[s].nbytes > 0 && !kind.view(s)) return false;
  return true;
}

}  // namespace

TensorSource::TensorSource(const Checkpoint& c, const LoadOptions& o, uint64_t budget)
    : c_(c), o_(o) {
  if (o.copy) {
    all_ = c.load_all(o);
    loaded_ = true;
  } else if (!all_viewed(c)) {
    std::unordered_map<const Storage*, uint32_t> index;
    placeholders_.resize(c.storages().size());
    for (size_t s = 0; s < placeholders_.size(); ++s) {
      auto st = std::make_shared<Storage>();
      st->info = c.storages()[s];
      index.emplace(st.get(), static_cast<uint32_t>(s));
      placeholders_[s] = std::move(st);
    }
    feed_ = std::make_shared<CheckpointFeed>(c, o, budget, std::move(index));
  }
}

Tensor TensorSource::get(size_t index) const {
  if (loaded_) return all_.at(index);
  if (feed_) {
    const TensorInfo& t = c_.tensors().at(index);
    return Tensor(t, placeholders_.at(t.storage));
  }
  return c_.tensor(index, o_);
}

TargetWriter make_target(const ConvertOptions& o) {
  TargetWriter t = target_writer(o.target);
  const WriterCaps& caps = t.writer->caps();
  if (o.max_shard_size && !caps.sharded)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("ConvertOptions::max_shard_size is only available for pt and "
                            "safetensors output, not ") +
                    caps.format);
  return t;
}

void refuse_own_input(const Checkpoint& c, const std::string& out) {
  struct stat o;
  if (::stat(out.c_str(), &o) != 0) return;  // a new file is nobody's input
  std::vector<std::string> inputs = c.files();
  inputs.push_back(c.source().name());
  for (const std::string& in : inputs) {
    struct stat i;
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino)
      throw Error(ErrorCode::kInvalidArgument,
                  "is a file of the input (" + in +
                      "): writing it would replace what is being read; write elsewhere",
                  out);
  }
}

std::vector<std::string> metadata_not_written(const Checkpoint& c, const Writer& w) {
  std::vector<std::string> keys;
  if (format_traits(c.format()).metadata && !w.caps().metadata)
    for (const auto& [k, v] : c.properties())
      if (k.rfind("metadata.", 0) == 0 && k != "metadata.format") keys.push_back(k.substr(9));
  return keys;
}

FlatStateDict flat_state(const Checkpoint& c, const Writer& w, const ConvertOptions& o,
                         ConvertReport& r) {
  const WriterCaps& caps = w.caps();
  const std::string target = caps.format;
  const std::string& in = c.source().name();
  FlattenOptions fo;
  fo.limits = o.limits;
  const auto* st = std::get_if<SafetensorsSaveOptions>(&o.target);
  const MetaTensors meta = st ? st->meta : MetaTensors::kRefuse;
  FlatStateDict flat = flatten_state_dict(c, fo);
  const auto& infos = c.tensors();
  auto is_meta = [&](const StateDictEntry& e) {
    return c.storages().at(infos[e.tensor].storage).meta;
  };
  if (!caps.meta_tensors) {
    // Never invent zeros silently.
    for (const auto& e : flat.entries) {
      if (!is_meta(e)) continue;
      if (meta == MetaTensors::kRefuse)
        throw Error(ErrorCode::kUnsupported,
                    "is a meta tensor (a dtype and shape without bytes), which " + target +
                        " cannot hold: SafetensorsSaveOptions::meta = MetaTensors::kZeros writes "
                        "zeros, MetaTensors::kSkip leaves it out",
                    in, e.name);
      (meta == MetaTensors::kZeros ? r.meta_zeroed : r.meta_skipped).push_back(e.name);
    }
    if (meta == MetaTensors::kSkip && !r.meta_skipped.empty()) {
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
  // Tied weights: written once, as safetensors' save_model does (transform.h).
  if (!caps.shared_bytes && !w.copies_shared()) drop_aliases(c, flat, r);
  std::vector<std::pair<std::string, std::string>> shared;  // (tensor, shares with)
  uint64_t total = 0;
  for (const auto& e : flat.entries) {
    const TensorInfo& t = infos[e.tensor];
    if (t.quantization && !caps.quantized)
      throw Error(ErrorCode::kUnsupported, "quantized tensors cannot be written to " + target, in,
                  e.name);
    if (e.name.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "the checkpoint is a single unnamed tensor; " + target +
                      " stores tensors by name (convert to pt instead)",
                  in);
    if (e.shares_with) shared.emplace_back(e.name, flat.entries[*e.shares_with].name);
    if (!is_meta(e)) total += t.nbytes();
  }
  if (!caps.shared_bytes && !shared.empty() && !w.copies_shared())
    throw Error(ErrorCode::kInvalidArgument,
                "shares its storage with '" + shared[0].second + "' (" +
                    std::to_string(shared.size()) + " such tensors); " + target +
                    " cannot express shared or tied tensors: "
                    "set SafetensorsSaveOptions::copy_shared to write separate copies",
                in, shared[0].first);
  for (const auto& e : flat.entries) {
    const TensorInfo& t = infos[e.tensor];
    if (!t.quantization && !w.holds(t.dtype))
      throw Error(ErrorCode::kUnsupported,
                  "dtype " + std::string(dtype_name(t.dtype)) + " cannot be written to " + target,
                  in, e.name);
  }
  if (!caps.shared_bytes) r.copied_shared = std::move(shared);
  r.not_written = flat.non_tensors;
  r.tensors = flat.entries.size();
  r.tensor_bytes = total;
  return flat;
}

WriteContent flat_content(const Checkpoint& c, const FlatStateDict& flat,
                          const TensorSource& source, const Writer& w) {
  WriteContent content;
  content.tensors.reserve(flat.entries.size());
  content.feed = source.feed();
  for (const auto& e : flat.entries) {
    // An alias is its tensor again: the same storage object (hashed once, stored once).
    Tensor t = e.alias_of ? content.tensors[*e.alias_of] : source.get(e.tensor);
    if (t.name() != e.name) t.info().name = e.name;
    content.tensors.push_back(std::move(t));
  }
  if (w.caps().metadata) {
    for (const auto& [k, v] : c.properties())
      if (k.rfind("metadata.", 0) == 0 && k.substr(9) != kSafetensorsDigestKey)
        content.metadata[k.substr(9)] = v;
    if (content.metadata.empty()) content.metadata["format"] = "pt";
  }
  return content;
}

WriteContent tree_content(const Checkpoint& c, const TensorSource& source, ConvertReport& r) {
  WriteContent content;
  std::vector<Tensor>& tensors = content.tensors;
  content.feed = source.feed();
  tensors.reserve(c.tensors().size());
  if (format_traits(c.format()).script) {
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
    content.root =
        state_dict_value(std::vector<Tensor>(tensors.begin(), tensors.begin() + n_state));
  } else {
    for (size_t i = 0; i < c.tensors().size(); ++i) tensors.push_back(source.get(i));
    // A safetensors root is a flat dict whose state holds __metadata__ (the reader keeps it
    // apart from tensor names that way); a pickle cannot give a plain dict a state, so such a
    // file becomes a plain state dict (metadata_not_written says what is lost).
    if (!format_traits(c.format()).metadata) content.root = c.root();
  }
  uint64_t bytes = 0;
  for (const auto& s : c.storages()) bytes += s.nbytes;
  // Per-channel scales and zero points are part of their tensor, not counted apart.
  r.tensors = std::count_if(tensors.begin(), tensors.end(),
                            [](const Tensor& t) { return t.info().type != "qparams"; });
  r.tensor_bytes = bytes;
  return content;
}

namespace {

// Each distinct view is hashed once: a tied name (the same storage, offset, shape and strides)
// repeats its tensor's digest.
class DigestWriter final : public Writer {
 public:
  DigestWriter(std::unique_ptr<Writer> inner, int threads, size_t& stored)
      : inner_(std::move(inner)), threads_(threads), stored_(stored) {}
  const WriterCaps& caps() const override { return inner_->caps(); }
  bool holds(DType d) const override { return inner_->holds(d); }
  bool copies_shared() const override { return inner_->copies_shared(); }
  bool encrypts() const override { return inner_->encrypts(); }
  WriteResult write(WriteOutput& out, WriteContent& content) override {
    const auto& ts = content.tensors;
    std::vector<bool> want(ts.size());
    std::vector<size_t> first(ts.size());
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < ts.size(); ++i) {
      const TensorInfo& t = ts[i].info();
      std::string key = std::to_string(reinterpret_cast<uintptr_t>(ts[i].storage().get())) + "/" +
                        std::to_string(t.storage_offset) + "/" + std::string(dtype_name(t.dtype));
      for (int64_t d : t.shape) key += "," + std::to_string(d);
      key += "/";
      for (int64_t d : t.strides) key += "," + std::to_string(d);
      auto [it, fresh] = seen.emplace(ts[i].storage() ? key : std::to_string(i), i);
      want[i] = fresh;
      first[i] = it->second;
    }
    std::vector<std::optional<Sha256>> sums;
    if (content.feed) {
      // Streamed: one pass for the digests (the header holds them), then the write.
      sums.resize(ts.size());
      std::vector<const Tensor*> order;
      std::vector<size_t> at;
      for (size_t i = 0; i < ts.size(); ++i)
        if (want[i]) {
          order.push_back(&ts[i]);
          at.push_back(i);
        }
      content.feed->each(order, [&](size_t k, const Tensor& t) { sums[at[k]] = tensor_sha256(t); });
    } else {
      sums = tensor_sha256_all(ts, want, threads_);
    }
    std::vector<TensorDigest> digests(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      digests[i].name = ts[i].name();
      digests[i].sha256 = sums[first[i]];
    }
    content.metadata[kSafetensorsDigestKey] = safetensors_digest_metadata(digests);
    stored_ += digests.size();
    return inner_->write(out, content);
  }

 private:
  std::unique_ptr<Writer> inner_;
  const int threads_;
  size_t& stored_;
};

}  // namespace

std::unique_ptr<Writer> with_digests(std::unique_ptr<Writer> inner, int threads, size_t& stored) {
  return std::make_unique<DigestWriter>(std::move(inner), threads, stored);
}

}  // namespace ckpt::internal
