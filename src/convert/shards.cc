// Sharding, a decorator of the write pipeline (shards.h): a checkpoint written as shards plus an
// index, in the Hugging Face layout ("model-00001-of-00003.safetensors" ... and
// "model.safetensors.index.json"); and parse_byte_size, the sizes --max-shard-size takes.

#include "convert/shards.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/error.h"

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
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"b", 1},
                                                          {"k", 1e3},
                                                          {"kb", 1e3},
                                                          {"m", 1e6},
                                                          {"mb", 1e6},
                                                          {"g", 1e9},
                                                          {"gb", 1e9},
                                                          {"t", 1e12},
                                                          {"tb", 1e12},
                                                          {"kib", 1024.0},
                                                          {"mib", 1048576.0},
                                                          {"gib", 1073741824.0},
                                                          {"tib", 1099511627776.0}};
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

// One named file of an output, as a one-file output (what a shard's writer writes into).
class OneFileOf final : public WriteOutput {
 public:
  OneFileOf(WriteOutput& out, const std::string& name) : sink_(out.file(name)) {}
  ByteSink& file() override { return sink_; }
  ByteSink& file(const std::string& name) override { return SinkOutput(sink_).file(name); }

 private:
  ByteSink& sink_;
};

// Sharding around any writer: the content's tensors go into shards by the plan, each shard is
// written by the inner writer into a file of its own, and then the index.
class ShardWriter final : public Writer {
 public:
  ShardWriter(std::unique_ptr<Writer> inner, ShardPlan plan, ShardNames names)
      : inner_(std::move(inner)), plan_(std::move(plan)), names_(std::move(names)) {
    caps_ = inner_->caps();
    caps_.object_tree = false;  // each shard is a state dict
    caps_.several_files = true;
  }
  const WriterCaps& caps() const override { return caps_; }
  bool holds(DType d) const override { return inner_->holds(d); }
  bool copies_shared() const override { return inner_->copies_shared(); }
  bool encrypts() const override { return inner_->encrypts(); }

  WriteResult write(WriteOutput& out, WriteContent& content) override {
    std::map<std::string, std::string> weight_map;
    for (size_t k = 0; k < plan_.shards; ++k) {
      const std::string file = names_.shard(k, plan_.shards);
      WriteContent shard;
      shard.metadata = content.metadata;
      shard.feed = content.feed;
      for (size_t i = 0; i < content.tensors.size(); ++i) {
        if (plan_.shard_of[i] != k) continue;
        shard.tensors.push_back(content.tensors[i]);
        weight_map[content.tensors[i].name()] = file;
      }
      OneFileOf one(out, file);
      inner_->write(one, shard);
    }
    nlohmann::ordered_json j;
    j["metadata"]["total_size"] = plan_.total;
    j["weight_map"] = nlohmann::ordered_json::object();
    for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
    out.file(names_.index).write(j.dump(2) + "\n");
    return {};
  }

 private:
  std::unique_ptr<Writer> inner_;
  WriterCaps caps_;
  ShardPlan plan_;
  ShardNames names_;
};

}  // namespace

std::string ShardNames::shard(size_t k, size_t n) const {
  return stem + "-" + shard_number(k + 1) + "-of-" + shard_number(n) + ext;
}

ShardNames shard_names(const std::string& out_path, const WriterCaps& caps) {
  ShardNames n;
  n.one_file = out_path;
  if (ends_with(n.one_file, ".index.json")) n.one_file.resize(n.one_file.size() - 11);
  const std::filesystem::path bp(n.one_file);
  n.ext = bp.extension().string();
  if (n.ext.empty()) n.ext = caps.object_tree ? ".bin" : ".safetensors";
  n.stem = bp.stem().string();
  n.dir = bp.parent_path();
  n.index = bp.filename().string() + ".index.json";
  return n;
}

ShardPlan plan_shards(const Checkpoint& c, const FlatStateDict& flat, const WriterCaps& caps,
                      uint64_t max) {
  // The next shard starts when one more entry would pass the size. Bytes shared with an earlier
  // entry go where that entry went (a writer that stores shared bytes once: one storage record,
  // counted once).
  const auto& infos = c.tensors();
  std::vector<uint64_t> sizes;
  std::vector<size_t> counts;
  ShardPlan plan;
  plan.shard_of.resize(flat.entries.size());
  for (size_t i = 0; i < flat.entries.size(); ++i) {
    const auto& e = flat.entries[i];
    const TensorInfo& t = infos[e.tensor];
    const StorageInfo& s = c.storages().at(t.storage);
    const uint64_t cost =
        caps.shared_bytes ? (e.shares_with ? 0 : s.nbytes) : (s.meta ? 0 : t.nbytes());
    size_t k;
    if (e.shares_with) {
      k = plan.shard_of[*e.shares_with];
    } else {
      if (sizes.empty() || (counts.back() > 0 && sizes.back() + cost > max)) {
        sizes.push_back(0);
        counts.push_back(0);
      }
      k = sizes.size() - 1;
    }
    sizes[k] += cost;
    ++counts[k];
    plan.shard_of[i] = k;
  }
  plan.shards = sizes.size();
  for (uint64_t s : sizes) plan.total += s;
  return plan;
}

ShardPlan plan_content_shards(const std::vector<Tensor>& tensors, uint64_t max) {
  ShardPlan plan;
  plan.shard_of.resize(tensors.size());
  std::vector<uint64_t> sizes;
  std::vector<size_t> counts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const uint64_t cost = t.storage() && t.storage()->info.meta ? 0 : t.info().nbytes();
    if (sizes.empty() || (counts.back() > 0 && sizes.back() + cost > max)) {
      sizes.push_back(0);
      counts.push_back(0);
    }
    sizes.back() += cost;
    ++counts.back();
    plan.shard_of[i] = sizes.size() - 1;
  }
  plan.shards = sizes.size();
  for (uint64_t s : sizes) plan.total += s;
  return plan;
}

std::unique_ptr<Writer> shard_writer(std::unique_ptr<Writer> inner, ShardPlan plan,
                                     ShardNames names) {
  return std::make_unique<ShardWriter>(std::move(inner), std::move(plan), std::move(names));
}

}  // namespace internal
}  // namespace ckpt
