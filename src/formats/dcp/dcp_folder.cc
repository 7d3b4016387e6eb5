// The metadata of a torch.distributed.checkpoint folder, wherever its writer put it
// (formats/dcp/dcp_folder.h).

#include "formats/dcp/dcp_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "formats/dcp/dcp_checks.h"
#include "formats/open.h"
#include "io/inside.h"

namespace ckpt::internal {
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The folder's plain files whose names match `re`, by the number its first group holds.
std::map<uint64_t, std::string> numbered(const std::string& dir, const std::regex& re) {
  std::map<uint64_t, std::string> found;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, re) && m[1].length() <= 9)
      found.emplace(std::stoull(m[1].str()), name);
  }
  return found;
}

const std::regex& rank_metadata() {
  static const std::regex re(R"(__([0-9]+)\.metadata)");
  return re;
}
const std::regex& hf_shard() {
  static const std::regex re(R"(shard-([0-9]+)-model-[0-9]+-of-[0-9]+\.safetensors)");
  return re;
}

// One metadata pickle, its size checked before a byte is read.
DcpMetadata read_one(const std::string& dir, const std::string& name, const OpenOptions& options,
                     SourcePtr* source) {
  const std::string path = join(dir, name);
  // A link that leads out of the folder is refused, as a shard index's shards are.
  if (!is_url(dir)) check_inside(path, dir, "file", "the folder", path, {});
  SourcePtr meta = open_source(path, false, options.remote);
  if (meta->size() > options.limits.max_metadata_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                name + " of " + std::to_string(meta->size()) +
                    " bytes; Limits::max_metadata_bytes is " +
                    std::to_string(options.limits.max_metadata_bytes),
                meta->name());
  // Read into memory that is not zeroed first (a 220 MB .metadata was written twice over).
  const size_t size = static_cast<size_t>(meta->size());
  std::unique_ptr<std::byte[]> bytes(new std::byte[size]);
  meta->read_into(0, std::span<std::byte>(bytes.get(), size));
  DcpMetadata md = read_dcp_metadata({bytes.get(), size}, meta->name(), options.limits);
  if (source) *source = meta;
  return md;
}

// Adds one rank's metadata to `all`: new tensors and chunks, and the storage items no lower rank
// wrote already.
void merge(DcpMetadata& all, DcpMetadata&& one, const std::string& file,
           std::map<std::string, size_t>& entry_of,
           std::map<std::pair<std::string, std::vector<int64_t>>, bool>& items) {
  for (DcpEntry& e : one.entries) {
    auto [it, fresh] = entry_of.emplace(e.fqn, all.entries.size());
    if (fresh) {
      all.entries.push_back(std::move(e));
      continue;
    }
    DcpEntry& have = all.entries[it->second];
    if (have.is_bytes != e.is_bytes ||
        (!e.is_bytes && (have.dtype != e.dtype || have.size != e.size)))
      throw Error(
          ErrorCode::kCorrupt,
          "the ranks disagree on the entry: " +
              (e.is_bytes ? std::string("bytes")
                          : std::string(dtype_name(e.dtype)) + " " + dims(e.size)) +
              " here, " +
              (have.is_bytes ? std::string("bytes")
                             : std::string(dtype_name(have.dtype)) + " " + dims(have.size)) +
              " in a lower rank's metadata",
          file, e.fqn);
    for (DcpChunk& c : e.chunks) {
      const bool dup = std::any_of(have.chunks.begin(), have.chunks.end(), [&](const DcpChunk& h) {
        return h.offsets == c.offsets && h.sizes == c.sizes;
      });
      if (!dup) have.chunks.push_back(std::move(c));
    }
  }
  for (DcpStorage& s : one.storage)
    if (items.emplace(std::make_pair(s.fqn, s.chunk_offsets), true).second)
      all.storage.push_back(std::move(s));
  if (all.version.empty()) all.version = one.version;
}

DcpFolderMetadata read_rank_local(const std::string& dir, const OpenOptions& options) {
  DcpFolderMetadata out;
  out.kind = DcpFolderKind::kRankLocal;
  const std::map<uint64_t, std::string> ranks = numbered(dir, rank_metadata());
  std::map<std::string, size_t> entry_of;
  std::map<std::pair<std::string, std::vector<int64_t>>, bool> items;
  uint64_t expect = 0;
  for (const auto& [rank, name] : ranks) {
    if (rank != expect)
      throw Error(ErrorCode::kNotFound,
                  "__" + std::to_string(expect) +
                      ".metadata is missing: the folder holds the "
                      "rank-local metadata of ranks 0 to " +
                      std::to_string(ranks.rbegin()->first) +
                      " with gaps (every rank writes its own)",
                  join(dir, "__" + std::to_string(expect) + ".metadata"));
    ++expect;
    SourcePtr src;
    DcpMetadata md = read_one(dir, name, options, rank == 0 ? &out.source : &src);
    merge(out.md, std::move(md), join(dir, name), entry_of, items);
  }
  return out;
}

// One HuggingFaceStorageWriter shard: its tensors as chunks at their saved_offsets.
void add_shard(DcpMetadata& md, std::map<std::string, size_t>& entry_of, const std::string& dir,
               const std::string& name, const OpenOptions& options, SourcePtr* first) {
  const std::string path = join(dir, name);
  check_inside(path, dir, "file", "the folder", path, {});
  SourcePtr src = open_file_source(path);
  std::shared_ptr<CheckpointModel> m = open_model(src, options);
  if (m->format != Format::kSafetensors)
    throw Error(ErrorCode::kCorrupt, "a shard of HuggingFaceStorageWriter that is not safetensors",
                path);
  if (!*first) *first = src;
  nlohmann::json info;
  if (auto it = m->properties.find("metadata.DCP_SHARDING_INFO"); it != m->properties.end()) {
    info = nlohmann::json::parse(it->second, nullptr, false);
    if (!info.is_object())
      throw Error(ErrorCode::kCorrupt, "__metadata__[\"DCP_SHARDING_INFO\"] is not a JSON object",
                  path, "__metadata__");
  }
  for (const TensorInfo& t : m->tensors) {
    std::vector<int64_t> offsets(t.shape.size(), 0);
    if (info.contains(t.name)) {
      const nlohmann::json& o = info[t.name].is_object()
                                    ? info[t.name].value("saved_offsets", nlohmann::json())
                                    : nlohmann::json();
      if (!o.is_array() || o.size() != t.shape.size() ||
          !std::all_of(o.begin(), o.end(),
                       [](const nlohmann::json& v) { return v.is_number_unsigned(); }))
        throw Error(ErrorCode::kCorrupt,
                    "DCP_SHARDING_INFO's saved_offsets is not one offset per dimension", path,
                    t.name);
      for (size_t d = 0; d < offsets.size(); ++d) offsets[d] = o[d].get<int64_t>();
    }
    auto [it, fresh] = entry_of.emplace(t.name, md.entries.size());
    if (fresh) {
      md.entries.emplace_back();
      md.entries.back().fqn = t.name;
      md.entries.back().dtype = t.dtype;
      md.entries.back().size.assign(t.shape.size(), 0);
    }
    DcpEntry& e = md.entries[it->second];
    if (e.dtype != t.dtype || e.size.size() != t.shape.size())
      throw Error(ErrorCode::kCorrupt,
                  "the shards disagree on the tensor: " + std::string(dtype_name(t.dtype)) + " " +
                      dims(t.shape) + " here, " + std::string(dtype_name(e.dtype)) + " with " +
                      std::to_string(e.size.size()) + " dimensions in another shard",
                  path, t.name);
    for (size_t d = 0; d < offsets.size(); ++d) {
      if (offsets[d] > INT64_MAX - t.shape[d])
        throw Error(ErrorCode::kCorrupt, "saved_offsets overflow", path, t.name);
      e.size[d] = std::max(e.size[d], offsets[d] + t.shape[d]);
    }
    e.chunks.push_back({offsets, t.shape});
    // The item is the file: the reader finds the tensor in it by name.
    DcpStorage item;
    item.fqn = t.name;
    item.chunk_offsets = std::move(offsets);
    item.relative_path = name;
    item.length = src->size();
    md.storage.push_back(std::move(item));
  }
}

DcpFolderMetadata read_hf_shards(const std::string& dir, const OpenOptions& options) {
  DcpFolderMetadata out;
  out.kind = DcpFolderKind::kHfShards;
  std::map<std::string, size_t> entry_of;
  // Ranks in order; each rank's files by name.
  std::map<std::pair<uint64_t, std::string>, bool> files;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, hf_shard()) && m[1].length() <= 9)
      files.emplace(std::make_pair(std::stoull(m[1].str()), name), true);
  }
  for (const auto& [key, unused] : files)
    add_shard(out.md, entry_of, dir, key.second, options, &out.source);
  return out;
}

// Megatron-core before 0.14 saved a ShardedTensor with a flattened_range (its distributed
// optimizer's state) reshaped, [fragments per dimension..., local numel], and recorded the real
// shape in Metadata.mcore_data: refused rather than read in the reshaped form.
void refuse_reshaped(const DcpFolderMetadata& out) {
  if (out.md.mcore_keys.empty()) return;
  const std::string& key = out.md.mcore_keys.front();
  throw Error(ErrorCode::kUnsupported,
              "Megatron-core saved the tensor reshaped (a flattened_range shard of its "
              "distributed optimizer, listed in Metadata.mcore_data" +
                  (out.md.mcore_keys.size() > 1
                       ? " with " + std::to_string(out.md.mcore_keys.size() - 1) + " more"
                       : std::string()) +
                  "); ckpt does not assemble these",
              out.source->name(), key);
}

// Megatron-core's torch_dist folder (dcp_folder.h): metadata.json's backends as properties, and
// common.pt as one more bytes item, the whole file, under the key `common`.
void add_megatron(const std::string& dir, DcpFolderMetadata& out) {
  const std::string marker = join(dir, "metadata.json");
  struct stat st {};
  // Megatron's is a hundred bytes; a large file of that name is someone else's.
  if (::stat(marker.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 10)) return;
  check_inside(marker, dir, "file", "the folder", marker, {});
  SourcePtr src = open_file_source(marker);
  const Bytes bytes = src->read(0, src->size());
  const nlohmann::json j = nlohmann::json::parse(bytes.str(), nullptr, false);
  if (!j.is_object() || !j.contains("sharded_backend") || !j["sharded_backend"].is_string()) return;
  for (const char* k : {"sharded_backend", "common_backend"}) {
    const std::string v = std::string(k) + "_version";
    if (!j.contains(k) || !j[k].is_string()) continue;
    std::string p = j[k].get<std::string>();
    if (j.contains(v) && j[v].is_number_integer()) p += " " + std::to_string(j[v].get<int64_t>());
    out.properties[std::string("megatron_") + k] = p;
  }
  const std::string common = join(dir, "common.pt");
  if (!exists(common))
    throw Error(ErrorCode::kNotFound,
                "common.pt is missing: Megatron-core's torch_dist folder (metadata.json) keeps "
                "the state that is not sharded in it",
                common);
  for (const DcpEntry& e : out.md.entries) {
    const bool under = !e.path.empty() && e.path[0]->kind() == Value::Kind::kString &&
                       e.path[0]->str() == "common";
    if (e.fqn == "common" || e.fqn.starts_with("common.") || under)
      throw Error(ErrorCode::kUnsupported,
                  "the sharded key takes the place of common.pt's state (`common`); open "
                  "common.pt by its path",
                  out.source->name(), e.fqn);
  }
  check_inside(common, dir, "file", "the folder", common, {});
  DcpEntry e;
  e.fqn = "common";
  e.is_bytes = true;
  out.md.entries.push_back(std::move(e));
  DcpStorage item;
  item.fqn = "common";
  item.relative_path = "common.pt";
  item.length = open_file_source(common)->size();
  out.md.storage.push_back(std::move(item));
}

}  // namespace

DcpFolderKind dcp_folder_kind(const std::string& dir) {
  if (is_url(dir) || exists(join(dir, ".metadata"))) return DcpFolderKind::kMetadata;
  if (exists(join(dir, "__0.metadata"))) return DcpFolderKind::kRankLocal;
  if (!numbered(dir, hf_shard()).empty()) return DcpFolderKind::kHfShards;
  return DcpFolderKind::kNone;
}

DcpFolderMetadata read_dcp_folder(const std::string& dir, const OpenOptions& options) {
  switch (dcp_folder_kind(dir)) {
    case DcpFolderKind::kMetadata: {
      DcpFolderMetadata out;
      out.kind = DcpFolderKind::kMetadata;
      out.md = read_one(dir, ".metadata", options, &out.source);
      refuse_reshaped(out);
      if (!is_url(dir)) add_megatron(dir, out);
      return out;
    }
    case DcpFolderKind::kRankLocal:
      return read_rank_local(dir, options);
    case DcpFolderKind::kHfShards:
      return read_hf_shards(dir, options);
    case DcpFolderKind::kNone:
      break;
  }
  throw Error(ErrorCode::kNotFound,
              "no .metadata, __0.metadata or shard-*-model-*.safetensors in the folder", dir);
}

}  // namespace ckpt::internal
