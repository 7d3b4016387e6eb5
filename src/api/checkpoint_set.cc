// The opener of sharded checkpoints: an index file (a JSON object whose "weight_map" maps each
// tensor name to the shard file that holds it) or a list of shard files. Each shard is opened as
// an ordinary Checkpoint; the merged model describes them as one (tensors and storages in shard
// order, an OrderedDict root), and the set's body (api/kind_set.cc) hands every read to the
// shard that holds the bytes, so a single file's load path is untouched.

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "api/checkpoint_impl.h"
#include "ckpt/remote.h"
#include "formats/open.h"
#include "io/inside.h"

namespace ckpt::internal {
namespace {

// A file's name without its folder, as messages show it (a URL without credentials or query).
std::string file_name(const std::string& path) {
  const std::string shown = redact_url(path);
  std::string n = std::filesystem::path(shown).filename().string();
  return n.empty() ? shown : n;
}

Checkpoint open_shard(const std::string& path, const OpenOptions& options, size_t k, size_t n,
                      const std::string& set_name) {
  try {
    SourcePtr s = open_source(path, options.mmap, options.remote);
    return CheckpointAccess::make(open_model(std::move(s), options));
  } catch (Error& e) {
    e.with_source(redact_url(path));
    e.add_context("opening shard " + std::to_string(k + 1) + " of " + std::to_string(n) + " of " +
                  set_name);
    throw;
  }
}

// The merged checkpoint. `weight_map` (name -> shard index) is checked when given.
Checkpoint merge(std::vector<Checkpoint> shards, std::vector<std::string> paths, SourcePtr source,
                 const OpenOptions& options,
                 const std::vector<std::pair<std::string, size_t>>* weight_map,
                 std::map<std::string, std::string> extra_properties) {
  auto model = std::make_shared<CheckpointModel>();
  FileSet set;
  model->format = shards.at(0).format();
  model->source = source;
  model->options = options;
  ValuePtr root = Value::ordered_dict();
  std::unordered_map<std::string, size_t> owner;  // root key -> shard
  size_t total_tensors = 0, total_storages = 0;
  for (const auto& c : shards) {
    total_tensors += c.tensors().size();
    total_storages += c.storages().size();
  }
  model->tensors.reserve(total_tensors);
  model->storages.reserve(total_storages);
  set.tensor_part.reserve(total_tensors);
  set.storage_part.reserve(total_storages);
  owner.reserve(total_tensors);
  root->entries().reserve(total_tensors);
  for (size_t k = 0; k < shards.size(); ++k) {
    const Checkpoint& c = shards[k];
    const size_t tbase = model->tensors.size(), sbase = model->storages.size();
    set.tensor_base.push_back(tbase);
    set.storage_base.push_back(sbase);
    const ConstValuePtr& r = c.root();
    if (!r || !r->is_dict())
      throw Error(ErrorCode::kUnsupported,
                  "a shard must be a dict of tensors (a state dict); this one is " +
                      (r ? r->repr(40) : std::string("empty")),
                  redact_url(paths[k]));
    for (const TensorInfo& t : c.tensors()) {
      TensorInfo m = t;
      m.storage += sbase;
      model->tensors.push_back(std::move(m));
      set.tensor_part.push_back(static_cast<uint32_t>(k));
    }
    for (const StorageInfo& s : c.storages()) {
      model->storages.push_back(s);
      set.storage_part.push_back(static_cast<uint32_t>(k));
    }
    for (const auto& [key, value] : r->entries()) {
      if (!key || key->kind() != Value::Kind::kString)
        throw Error(ErrorCode::kUnsupported,
                    "a shard's keys must be strings; found " + (key ? key->repr(40) : "null"),
                    redact_url(paths[k]));
      auto [it, fresh] = owner.emplace(key->str(), k);
      if (!fresh)
        throw Error(ErrorCode::kCorrupt,
                    "the name is in two shards: " + file_name(paths[it->second]) + " and " +
                        file_name(paths[k]),
                    redact_url(paths[k]), key->str());
      ValuePtr v = value ? value->clone() : Value::none();
      shift_tensors(v, tbase);
      root->entries().emplace_back(Value::string(key->str()), std::move(v));
    }
  }
  if (weight_map) {
    for (const auto& [name, k] : *weight_map) {
      auto it = owner.find(name);
      if (it == owner.end())
        throw Error(ErrorCode::kCorrupt,
                    "the index maps this name to " + file_name(paths[k]) +
                        ", which has no tensor of that name",
                    redact_url(paths[k]), name);
      if (it->second != k)
        throw Error(ErrorCode::kCorrupt,
                    "the index maps this name to " + file_name(paths[k]) + ", but it is in " +
                        file_name(paths[it->second]),
                    redact_url(paths[it->second]), name);
    }
  }
  // Properties every shard agrees on, and the set's own.
  std::map<std::string, std::string> props = shards[0].properties();
  for (size_t k = 1; k < shards.size(); ++k)
    for (auto it = props.begin(); it != props.end();) {
      auto o = shards[k].properties().find(it->first);
      if (o == shards[k].properties().end() || o->second != it->second)
        it = props.erase(it);
      else
        ++it;
    }
  props["shards"] = std::to_string(shards.size());
  for (auto& [k, v] : extra_properties) props[k] = v;
  model->properties = std::move(props);
  model->root = std::move(root);
  // Records: each shard's, named "<shard file>:<record>".
  model->make_records = [shards, paths](std::vector<RecordInfo>& out) {
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string prefix = file_name(paths[k]) + ":";
      for (RecordInfo r : shards[k].records()) {
        r.name = prefix + r.name;
        out.push_back(std::move(r));
      }
    }
  };
  model->index_names();
  set.parts = std::move(shards);
  set.paths = std::move(paths);
  return CheckpointAccess::make(set_kind(std::move(model), std::move(set)));
}

// A shard name from an index: a relative path that stays inside the index's folder. A local
// index names local files only, a remote one objects under its own prefix only: never a URL, so
// an index cannot make ckpt fetch (or sign a request for) anything else. Checked before any
// shard is opened, so a refused index costs no request.
void check_shard_name(const std::string& name, const std::string& index, bool remote,
                      const std::string& key) {
  std::string why;
  if (name.empty() || name.find('\0') != std::string::npos) {
    why = "an empty name";
  } else if (is_url(name) || name.find("://") != std::string::npos) {
    why = remote ? "a shard must be an object under the index's own prefix, not a URL"
                 : "a local index names local files only, not URLs";
  } else if (std::filesystem::path(name).is_absolute() || name.front() == '/') {
    why = "an absolute path";
  } else if (remote && name.find_first_of("?#%\\") != std::string::npos) {
    why = "a '?', '#', '%' or '\\' in a remote shard's name";
  } else {
    for (const auto& part : std::filesystem::path(name))
      if (part == "..") why = "a '..' component";
  }
  if (!why.empty())
    throw Error(ErrorCode::kCorrupt,
                "the index names shard file '" + name + "' (" + why +
                    "); a shard must be a relative path inside the index's folder",
                index, key);
}

}  // namespace

bool looks_like_json(const ByteSource& source) {
  try {
    std::byte head[64];
    const size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof head, source.size()));
    source.read_into(0, std::span<std::byte>(head, n));
    size_t i = 0;
    if (n >= 3 && head[0] == std::byte{0xef} && head[1] == std::byte{0xbb} &&
        head[2] == std::byte{0xbf})
      i = 3;  // a UTF-8 byte order mark
    for (; i < n; ++i) {
      const char ch = static_cast<char>(head[i]);
      if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') continue;
      return ch == '{';
    }
  } catch (const Error&) {
  }
  return false;
}

Checkpoint open_index(const SourcePtr& source, const std::string& dir, const OpenOptions& options) {
  const std::string& index = source->name();
  if (source->size() > options.limits.max_metadata_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                "index of " + std::to_string(source->size()) +
                    " bytes; Limits::max_metadata_bytes is " +
                    std::to_string(options.limits.max_metadata_bytes),
                index);
  Bytes text = source->read(0, source->size());
  std::string_view sv = text.str();
  nlohmann::json j = nlohmann::json::parse(sv.begin(), sv.end(), nullptr, false);
  if (j.is_discarded())
    throw Error(ErrorCode::kUnsupported,
                "a JSON-looking file that is not valid JSON (not a checkpoint, nor a shard index)",
                index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(ErrorCode::kUnsupported,
                "a JSON file without a \"weight_map\" object: not a shard index (a sharded "
                "checkpoint's *.index.json maps each tensor name to its shard file)",
                index);
  const auto& wm = j["weight_map"];
  if (wm.empty()) throw Error(ErrorCode::kCorrupt, "the index's weight_map is empty", index);
  if (wm.size() > options.limits.max_tensors)
    throw Error(ErrorCode::kLimitExceeded,
                std::to_string(wm.size()) + " tensors; Limits::max_tensors is " +
                    std::to_string(options.limits.max_tensors),
                index);
  const bool remote = is_url(index);
  std::map<std::string, size_t> files;  // shard name -> index, in name order
  for (const auto& [name, file] : wm.items()) {
    if (!file.is_string())
      throw Error(ErrorCode::kCorrupt, "the index maps this name to a non-string", index, name);
    check_shard_name(file.get<std::string>(), index, remote, name);
    files.emplace(file.get<std::string>(), 0);
  }
  std::vector<std::string> paths;
  for (auto& [name, k] : files) {
    k = paths.size();
    paths.push_back(dir.empty() ? name : (std::filesystem::path(dir) / name).string());
    // A local shard, or a folder on its way, may be a symbolic link that leads out.
    if (!remote) check_inside(paths.back(), dir, "shard file", "the index's folder", index, {});
  }
  std::vector<std::pair<std::string, size_t>> weight_map;
  weight_map.reserve(wm.size());
  for (const auto& [name, file] : wm.items())
    weight_map.emplace_back(name, files.at(file.get<std::string>()));
  std::map<std::string, std::string> extra{{"index", file_name(index)}};
  if (j.contains("metadata") && j["metadata"].is_object()) {
    const auto& md = j["metadata"];
    if (md.contains("total_size") && md["total_size"].is_number_integer())
      extra["total_size"] = std::to_string(md["total_size"].get<int64_t>());
  }
  std::vector<Checkpoint> shards;
  shards.reserve(paths.size());
  for (size_t k = 0; k < paths.size(); ++k)
    shards.push_back(open_shard(paths[k], options, k, paths.size(), "index " + index));
  return merge(std::move(shards), std::move(paths), source, options, &weight_map, std::move(extra));
}

Checkpoint open_files(const std::vector<std::string>& paths, const OpenOptions& options) {
  if (paths.empty()) throw Error(ErrorCode::kInvalidArgument, "no files to open");
  std::string name = redact_url(paths[0]);
  if (paths.size() == 2) name += " + " + redact_url(paths[1]);
  if (paths.size() > 2) name += " and " + std::to_string(paths.size() - 1) + " more files";
  // The set's source: the index these files would have, without a weight_map to check.
  nlohmann::json desc;
  for (const std::string& p : paths) desc["files"].push_back(redact_url(p));
  std::vector<Checkpoint> shards;
  shards.reserve(paths.size());
  for (size_t k = 0; k < paths.size(); ++k)
    shards.push_back(open_shard(paths[k], options, k, paths.size(), name));
  return merge(std::move(shards), paths, memory_source(desc.dump(), name), options, nullptr, {});
}

}  // namespace ckpt::internal
