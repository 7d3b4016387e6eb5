// convert() with max_shard_size: a checkpoint written as shards plus an index, in the Hugging
// Face layout ("model-00001-of-00003.safetensors" ... and "model.safetensors.index.json").

#include "convert/shards.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/digest.h"
#include "convert/progress_sink.h"
#include "convert/transform.h"
#include "convert/writing.h"

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

// Files beside each other in a folder that exists, each an atomic file sink (per ConvertOptions),
// committed together in the order they were created; when a commit fails, the files committed
// before are removed. Destroyed uncommitted, it leaves nothing. Progress counts across the files.
class FilesOutput final : public WriteOutput {
 public:
  FilesOutput(std::filesystem::path dir, uint64_t total, const ConvertOptions& o)
      : dir_(std::move(dir)), total_(total), o_(o) {}
  ~FilesOutput() override {
    // A file sink that is not atomic writes under the file's own name: remove what was begun.
    if (committed_ || o_.atomic) return;
    files_.clear();
    std::error_code ec;
    for (const auto& p : begun_) std::filesystem::remove(p, ec);
  }
  ByteSink& file() override {
    throw Error(ErrorCode::kInvalidArgument, "the output is several files: name one",
                dir_.string());
  }
  ByteSink& file(const std::string& name) override {
    File f;
    f.path = (dir_ / name).string();
    f.sink = create_file_sink(f.path, FileSinkOptions{o_.atomic, o_.fsync});
    if (o_.progress)
      f.progress = std::make_unique<ProgressSink>(
          *f.sink, total_, o_.progress,
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(o_.progress_interval),
          size());
    begun_.push_back(f.path);
    files_.push_back(std::move(f));
    return files_.back().progress ? *files_.back().progress : *files_.back().sink;
  }
  // Bytes written to every file.
  uint64_t size() const {
    uint64_t n = 0;
    for (const auto& f : files_) n += f.sink->position();
    return n;
  }
  void commit() {
    std::vector<std::string> done;
    try {
      for (auto& f : files_) {
        f.sink->commit();
        done.push_back(f.path);
      }
      committed_ = true;
    } catch (...) {
      std::error_code ec;
      for (const auto& p : done) std::filesystem::remove(p, ec);
      throw;
    }
  }

 private:
  struct File {
    std::string path;
    std::unique_ptr<ByteSink> sink;
    std::unique_ptr<ProgressSink> progress;
  };
  const std::filesystem::path dir_;
  const uint64_t total_;
  const ConvertOptions& o_;
  std::vector<File> files_;
  std::vector<std::string> begun_;
  bool committed_ = false;
};

// One named file of an output, as a one-file output (what a shard's writer writes into).
class OneFileOf final : public WriteOutput {
 public:
  OneFileOf(WriteOutput& out, const std::string& name) : sink_(out.file(name)) {}
  ByteSink& file() override { return sink_; }
  ByteSink& file(const std::string& name) override { return SinkOutput(sink_).file(name); }

 private:
  ByteSink& sink_;
};

// Sharding around any writer: the content's tensors go into shards by a plan (shard_of[i] for
// tensor i), each shard is written by the inner writer into a file of its own
// ("STEM-0000k-of-0000n.EXT"), and then the index ({"metadata": {"total_size"}, "weight_map":
// {name: file}}, names sorted).
class ShardWriter final : public Writer {
 public:
  ShardWriter(std::unique_ptr<Writer> inner, std::vector<size_t> shard_of, size_t shards,
              std::string stem, std::string ext, std::string index, uint64_t total_size)
      : inner_(std::move(inner)),
        shard_of_(std::move(shard_of)),
        n_(shards),
        stem_(std::move(stem)),
        ext_(std::move(ext)),
        index_(std::move(index)),
        total_size_(total_size) {
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
    for (size_t k = 0; k < n_; ++k) {
      const std::string name = stem_ + "-" + shard_number(k + 1) + "-of-" + shard_number(n_);
      const std::string file = name + ext_;
      WriteContent shard;
      shard.metadata = content.metadata;
      shard.feed = content.feed;
      for (size_t i = 0; i < content.tensors.size(); ++i) {
        if (shard_of_[i] != k) continue;
        shard.tensors.push_back(content.tensors[i]);
        weight_map[content.tensors[i].name()] = file;
      }
      OneFileOf one(out, file);
      inner_->write(one, shard);
      files_.push_back(file);
    }
    // The index last: a reader that finds it finds every shard.
    nlohmann::ordered_json j;
    j["metadata"]["total_size"] = total_size_;
    j["weight_map"] = nlohmann::ordered_json::object();
    for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
    out.file(index_).write(j.dump(2) + "\n");
    return {};
  }
  // The shard files written, in order.
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::unique_ptr<Writer> inner_;
  WriterCaps caps_;
  std::vector<size_t> shard_of_;
  size_t n_;
  std::string stem_, ext_, index_;
  uint64_t total_size_;
  std::vector<std::string> files_;
};

}  // namespace

ConvertReport convert_sharded(const Checkpoint& c, const std::string& out_path,
                              const ConvertOptions& o) {
  TargetWriter target = make_target(o);  // refuses targets without the shard layout
  const WriterCaps& caps = target.writer->caps();

  // Names: DIR/STEM.EXT -> DIR/STEM-0000k-of-0000n.EXT and DIR/STEM.EXT.index.json.
  std::string base = out_path;
  if (ends_with(base, ".index.json")) base.resize(base.size() - 11);
  const std::filesystem::path bp(base);
  std::string ext = bp.extension().string();
  if (ext.empty()) ext = caps.object_tree ? ".bin" : ".safetensors";
  const std::string stem = bp.stem().string();
  const std::filesystem::path dir = bp.parent_path();

  ConvertReport r;
  r.format = target_format(o.target);
  r.metadata_not_written = metadata_not_written(c, *target.writer);
  const FlatStateDict flat = flat_state(c, *target.writer, o, r);

  // Shards: entries in order; the next shard starts when one more would pass the size. Bytes
  // shared with an earlier entry go where that entry went (a writer that stores shared bytes
  // once: one storage record, counted once).
  const auto& infos = c.tensors();
  std::vector<uint64_t> sizes;
  std::vector<size_t> counts;
  std::vector<size_t> shard_of(flat.entries.size());
  for (size_t i = 0; i < flat.entries.size(); ++i) {
    const auto& e = flat.entries[i];
    const TensorInfo& t = infos[e.tensor];
    const StorageInfo& s = c.storages().at(t.storage);
    const uint64_t cost =
        caps.shared_bytes ? (e.shares_with ? 0 : s.nbytes) : (s.meta ? 0 : t.nbytes());
    size_t k;
    if (e.shares_with) {
      k = shard_of[*e.shares_with];
    } else {
      if (sizes.empty() || (counts.back() > 0 && sizes.back() + cost > o.max_shard_size)) {
        sizes.push_back(0);
        counts.push_back(0);
      }
      k = sizes.size() - 1;
    }
    sizes[k] += cost;
    ++counts[k];
    shard_of[i] = k;
  }
  if (sizes.size() <= 1) {
    // One shard: the one file, as without max_shard_size (the whole tree kept for pt).
    ConvertOptions one = o;
    one.max_shard_size = 0;
    ConvertReport whole = convert(c, base, one);
    whole.files = {base};
    return whole;
  }
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  r.tensor_bytes = total;

  TensorSource source(c, o.load, o.memory_budget);
  WriteContent content = flat_content(c, flat, source, *target.writer);
  // A digest list names every tensor of its file: an input's would not match a shard.
  content.metadata.erase(kSafetensorsDigestKey);
  finish_flat_content({}, *target.writer, c.source().name(), content, r);  // aliases dropped
  std::unique_ptr<Writer> inner = std::move(target.writer);
  const auto* st = std::get_if<SafetensorsTarget>(&o.target);
  if (st && st->store_digests) inner = with_digests(std::move(inner), o.load.threads, r.digests_stored);
  r.index = (dir / (bp.filename().string() + ".index.json")).string();
  ShardWriter writer(std::move(inner), std::move(shard_of), sizes.size(), stem, ext,
                     bp.filename().string() + ".index.json", total);
  FilesOutput out(dir, total, o);
  writer.write(out, content);
  out.commit();
  for (const auto& f : writer.files()) r.files.push_back((dir / f).string());
  r.bytes_written = out.size();
  if (o.progress) o.progress(r.bytes_written, r.bytes_written);
  return r;
}

}  // namespace internal
}  // namespace ckpt
