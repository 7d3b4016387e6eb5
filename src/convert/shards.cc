// convert() with max_shard_size: a checkpoint written as shards plus an index, in the Hugging
// Face layout ("model-00001-of-00003.safetensors" ... and "model.safetensors.index.json").

#include "convert/shards.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ckpt/digest.h"
#include "ckpt/safetensors.h"
#include "ckpt/torch.h"
#include "convert/digest_internal.h"
#include "convert/progress_sink.h"

namespace ckpt {

uint64_t parse_byte_size(std::string_view text) {
  auto bad = [&]() -> Error {
    return Error(ErrorCode::kInvalidArgument,
                 "'" + std::string(text) +
                     "' is not a size (a number of bytes, or with a unit: 500MB, 5GB, 10GiB)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw bad();
  const std::string number(text.substr(0, i));
  if (std::count(number.begin(), number.end(), '.') > 1) throw bad();
  std::string unit;
  for (char ch : text.substr(i))
    if (ch != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},           {"b", 1},          {"k", 1e3},          {"kb", 1e3},
      {"m", 1e6},        {"mb", 1e6},       {"g", 1e9},          {"gb", 1e9},
      {"t", 1e12},       {"tb", 1e12},      {"kib", 1024.0},     {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double v = std::stod(number) * scale;
    if (!(v >= 1) || v >= 1.8e19) throw bad();
    return static_cast<uint64_t>(std::llround(v));
  }
  throw bad();
}

namespace internal {
namespace {

bool ends_with(const std::string& s, std::string_view end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

std::string shard_number(size_t k) {
  char b[16];
  std::snprintf(b, sizeof b, "%05zu", k);
  return b;
}

// The bytes of the checkpoint's tensors: views of a mapped file, else loaded once.
class Tensors {
 public:
  Tensors(const Checkpoint& c, const LoadOptions& o) : c_(c), o_(o) {
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

}  // namespace

ConvertReport convert_sharded(const Checkpoint& c, const std::string& out_path,
                              const ConvertOptions& o) {
  const std::string& in = c.source().name();
  if (o.to != ConvertFormat::kTorch && o.to != ConvertFormat::kSafetensors)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("shards (max_shard_size) are written for pt and safetensors, not ") +
                    convert_format_name(o.to));
  if (o.encryption.enabled())
    throw Error(ErrorCode::kInvalidArgument, "encryption is only available for tensorizer output");
  if (o.store_digests && o.to != ConvertFormat::kSafetensors)
    throw Error(ErrorCode::kInvalidArgument,
                "stored digests are only available for safetensors output");

  // Names: DIR/STEM.EXT -> DIR/STEM-0000k-of-0000n.EXT and DIR/STEM.EXT.index.json.
  std::string base = out_path;
  if (ends_with(base, ".index.json")) base.resize(base.size() - 11);
  const std::filesystem::path bp(base);
  std::string ext = bp.extension().string();
  if (ext.empty()) ext = o.to == ConvertFormat::kTorch ? ".bin" : ".safetensors";
  const std::string stem = bp.stem().string();
  const std::filesystem::path dir = bp.parent_path();

  FlattenOptions fo;
  fo.limits = o.limits;
  FlatStateDict flat = flatten_state_dict(c, fo);
  const auto& infos = c.tensors();
  const std::string target = convert_format_name(o.to);
  std::vector<std::pair<std::string, std::string>> shared;
  for (const auto& e : flat.entries) {
    if (o.to == ConvertFormat::kSafetensors && infos[e.tensor].quantization)
      throw Error(ErrorCode::kUnsupported, "quantized tensors cannot be written to " + target, in,
                  e.name);
    if (e.name.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "the checkpoint is a single unnamed tensor; shards store tensors by name", in);
    if (e.shares_with) shared.emplace_back(e.name, flat.entries[*e.shares_with].name);
  }
  if (o.to == ConvertFormat::kSafetensors && !shared.empty() && !o.copy_shared)
    throw Error(ErrorCode::kInvalidArgument,
                "shares its storage with '" + shared[0].second + "' (" +
                    std::to_string(shared.size()) +
                    " such tensors); safetensors cannot express shared or tied tensors: "
                    "use --copy-shared (ConvertOptions::copy_shared) to write each as a "
                    "separate copy",
                in, shared[0].first);

  // Shards: entries in order; the next shard starts when one more would pass the size. Bytes
  // shared with an earlier entry go where that entry went (pt: one storage record, counted once).
  const bool pt = o.to == ConvertFormat::kTorch;
  std::vector<std::vector<size_t>> shards;
  std::vector<uint64_t> sizes;
  std::vector<size_t> shard_of(flat.entries.size());
  for (size_t i = 0; i < flat.entries.size(); ++i) {
    const auto& e = flat.entries[i];
    const TensorInfo& t = infos[e.tensor];
    const StorageInfo& s = c.storages().at(t.storage);
    const uint64_t cost = pt ? (e.shares_with ? 0 : s.nbytes) : (s.meta ? 0 : t.nbytes());
    size_t k;
    if (e.shares_with) {
      k = shard_of[*e.shares_with];
    } else {
      if (shards.empty() || (!shards.back().empty() && sizes.back() + cost > o.max_shard_size)) {
        shards.emplace_back();
        sizes.push_back(0);
      }
      k = shards.size() - 1;
    }
    shards[k].push_back(i);
    sizes[k] += cost;
    shard_of[i] = k;
  }
  if (shards.size() <= 1) {
    // One shard: the one file, as without max_shard_size (the whole tree kept for pt).
    ConvertOptions one = o;
    one.max_shard_size = 0;
    ConvertReport r = convert(c, base, one);
    r.files = {base};
    return r;
  }

  ConvertReport r;
  r.format = o.to;
  if (c.format() == Format::kSafetensors && o.to != ConvertFormat::kSafetensors)
    for (const auto& [k, v] : c.properties())
      if (k.rfind("metadata.", 0) == 0 && k != "metadata.format")
        r.metadata_not_written.push_back(k.substr(9));
  std::map<std::string, std::string> meta;  // safetensors __metadata__
  for (const auto& [k, v] : c.properties())
    if (k.rfind("metadata.", 0) == 0 && k.substr(9) != kSafetensorsDigestKey) meta[k.substr(9)] = v;
  if (meta.empty()) meta["format"] = "pt";

  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  Tensors source(c, o.load);
  const size_t n = shards.size();
  std::vector<std::string> written;
  std::map<std::string, std::string> weight_map;
  uint64_t bytes_written = 0, reported_total = total;
  try {
    for (size_t k = 0; k < n; ++k) {
      const std::string file = stem + "-" + shard_number(k + 1) + "-of-" + shard_number(n) + ext;
      const std::string path = (dir / file).string();
      std::vector<Tensor> tensors;
      std::vector<bool> want;
      tensors.reserve(shards[k].size());
      for (size_t i : shards[k]) {
        const auto& e = flat.entries[i];
        Tensor t = source.get(e.tensor);
        if (t.name() != e.name) t.info().name = e.name;
        tensors.push_back(std::move(t));
        want.push_back(!e.alias_of);
        weight_map[e.name] = file;
      }
      uint64_t later = 0;
      for (size_t j = k + 1; j < n; ++j) later += sizes[j];
      const uint64_t before = bytes_written;
      std::function<void(uint64_t, uint64_t)> fn;
      if (o.progress)
        fn = [&, before, later](uint64_t done, uint64_t of) {
          reported_total = std::max(reported_total, before + of + later);
          o.progress(before + done, reported_total);
        };
      auto file_sink = create_file_sink(path, FileSinkOptions{o.atomic, o.fsync});
      std::optional<ProgressSink> counted;
      if (fn)
        counted.emplace(*file_sink, sizes[k], fn,
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            o.progress_interval));
      ByteSink& sink = counted ? static_cast<ByteSink&>(*counted) : *file_sink;
      if (pt) {
        SaveOptions so;
        if (o.alignment) so.alignment = o.alignment;
        so.archive_name = o.archive_name.empty() ? file.substr(0, file.find('.')) : o.archive_name;
        save_torch(sink, state_dict_value(tensors), tensors, so);  // commits
      } else {
        SafetensorsSaveOptions so;
        if (o.alignment) so.alignment = o.alignment;
        so.copy_shared = o.copy_shared;
        std::map<std::string, std::string> m = meta;
        if (o.store_digests) {
          // Each distinct tensor once; a tied name repeats its tensor's digest.
          auto sums = tensor_sha256_all(tensors, want, o.load.threads);
          std::vector<TensorDigest> digests(tensors.size());
          for (size_t j = 0; j < shards[k].size(); ++j) {
            const auto& e = flat.entries[shards[k][j]];
            digests[j].name = e.name;
            if (sums[j]) {
              digests[j].sha256 = sums[j];
            } else {  // an alias: its tensor's digest (the same bytes)
              digests[j].sha256 = tensor_sha256(tensors[j]);
            }
          }
          m[kSafetensorsDigestKey] = safetensors_digest_metadata(digests);
          r.digests_stored += digests.size();
        }
        save_safetensors(sink, tensors, m, so);
        sink.commit();
      }
      written.push_back(path);
      bytes_written += file_sink->position();
      r.files.push_back(path);
    }
    // The index last: a reader that finds it finds every shard.
    nlohmann::ordered_json j;
    j["metadata"]["total_size"] = total;
    j["weight_map"] = nlohmann::ordered_json::object();
    for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
    const std::string text = j.dump(2) + "\n";
    r.index = (dir / (bp.filename().string() + ".index.json")).string();
    auto index = create_file_sink(r.index, FileSinkOptions{o.atomic, o.fsync});
    index->write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                            text.size()));
    index->commit();
    bytes_written += text.size();
  } catch (...) {
    std::error_code ec;
    for (const auto& p : written) std::filesystem::remove(p, ec);
    throw;
  }
  r.tensors = flat.entries.size();
  r.tensor_bytes = total;
  r.bytes_written = bytes_written;
  r.not_written = std::move(flat.non_tensors);
  if (!pt) r.copied_shared = std::move(shared);
  if (o.progress) o.progress(bytes_written, bytes_written);
  return r;
}

}  // namespace internal
}  // namespace ckpt
