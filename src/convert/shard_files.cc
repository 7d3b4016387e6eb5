// A shard set's files and their commit (shard_files.h). The order of the steps is what keeps a
// reader of the index on one whole set; docs/design/writers.md ("Writers",
// **Shard sets**) says why.

#include "convert/shard_files.h"

#include <unistd.h>

#include <fstream>
#include <system_error>

#include "ckpt/error.h"
#include "io/temporaries.h"

namespace ckpt::internal {

namespace fs = std::filesystem;

MadeFolders::MadeFolders(const fs::path& dir) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (it == missing.rbegin()) slot_ = io::adopt_temporary(it->string(), true);
    if (!fs::create_directory(*it, ec) && ec) {
      undo();
      throw Error(ErrorCode::kIo, "cannot create the folder: " + ec.message(), it->string());
    }
    made_.push_back(*it);
  }
}

MadeFolders::~MadeFolders() { undo(); }

void MadeFolders::undo() noexcept {
  std::error_code ec;
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) fs::remove(*it, ec);  // empty ones
  made_.clear();
  io::release_temporary(slot_);
  slot_ = -1;
}

void MadeFolders::keep() {
  made_.clear();
  io::release_temporary(slot_);
  slot_ = -1;
}

namespace {

// The file names an index names (plain names in its folder; anything else is not ours to touch).
std::set<std::string> indexed_files(const fs::path& index) {
  std::set<std::string> names;
  std::ifstream in(index);
  if (!in) return names;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return names;
  for (const auto& [k, v] : j["weight_map"].items()) {
    if (!v.is_string()) continue;
    const std::string f = v.get<std::string>();
    if (!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos) names.insert(f);
  }
  return names;
}

// "model-00001-of-00002.safetensors" -> "model-00001-of-00002.XXXXXX.safetensors", not existing.
std::string fresh_name(const fs::path& dir, const std::string& name) {
  const fs::path p(name);
  for (;;) {
    std::string n = p.stem().string() + "." + io::random_suffix() + p.extension().string();
    std::error_code ec;
    if (!fs::exists(dir / n, ec)) return n;
  }
}

}  // namespace

struct ShardFiles::File {
  std::string name;  // its own name, as the weight map names it
  std::string at;    // the name it is committed under (its own, or a fresh one)
  std::unique_ptr<ByteSink> sink;
  std::unique_ptr<ProgressSink> progress;
  int slot = -1;  // registered for removal until the index names it
  bool placed = false;
};

ShardFiles::ShardFiles(const fs::path& dir, std::string index_name, uint64_t total,
                       const ConvertOptions& o)
    : dir_(dir),
      index_name_(std::move(index_name)),
      total_(total),
      o_(o),
      old_(indexed_files(dir_ / index_name_)),
      made_(dir_) {}

ShardFiles::~ShardFiles() {
  if (!committed_) discard();
}

ByteSink& ShardFiles::file() {
  throw Error(ErrorCode::kInvalidArgument, "the output is several files: name one", dir_.string());
}

ByteSink& ShardFiles::file(const std::string& name) {
  if (name == index_name_) {
    index_ = std::make_unique<MemorySink>((dir_ / name).string());
    return *index_;
  }
  File f;
  f.name = name;
  // A name of the old set is not touched before the new index no longer names it.
  f.at = old_.count(name) ? fresh_name(dir_, name) : name;
  // Always atomic: a shard under its own name before the index would be a set of neither.
  f.sink = create_file_sink((dir_ / f.at).string(), FileSinkOptions{true, o_.fsync});
  if (o_.progress)
    f.progress = std::make_unique<ProgressSink>(
        *f.sink, total_, o_.progress,
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(o_.progress_interval),
        size());
  files_.push_back(std::move(f));
  return files_.back().progress ? *files_.back().progress : *files_.back().sink;
}

uint64_t ShardFiles::size() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f.sink->position();
  return n;
}

void ShardFiles::write_index(bool final_names) {
  std::map<std::string, std::string> at;
  for (const auto& f : files_) at[f.name] = final_names ? f.name : f.at;
  nlohmann::ordered_json j = written_;
  for (auto& file : j["weight_map"]) file = at.at(file.get<std::string>());
  std::unique_ptr<ByteSink> index =
      create_file_sink((dir_ / index_name_).string(), FileSinkOptions{true, o_.fsync});
  index->write(j.dump(2) + "\n");
  index->commit();  // one rename: the old set's index, then the new one's
}

void ShardFiles::discard() noexcept {
  std::error_code ec;
  for (auto& f : files_) {
    f.progress.reset();
    f.sink.reset();  // an uncommitted temporary goes with its sink
    // Placed under a name no index names (a fresh name, or one the old set does not use).
    if (f.placed) fs::remove(dir_ / f.at, ec);
    io::release_temporary(f.slot);
  }
  files_.clear();
}

void ShardFiles::commit(ConvertReport& r) {
  if (!index_)
    throw Error(ErrorCode::kInvalidArgument, "a shard set without its index", dir_.string());
  const auto& b = index_->bytes();
  written_ = nlohmann::ordered_json::parse(reinterpret_cast<const char*>(b.data()),
                                           reinterpret_cast<const char*>(b.data()) + b.size());
  // 1. The shards into place, under names the old index does not name; registered so that a
  //    signal before step 2 removes them.
  for (auto& f : files_) {
    f.slot = io::adopt_temporary((dir_ / f.at).string(), false);
    f.sink->commit();
    f.placed = true;
  }
  // 2. The new index replaces the old one (one rename): from here on, the new set is the set.
  //    The shards leave the signal cleanup first: a signal after the rename must not remove
  //    what the new index names. (One between the two leaves the old set whole and new shards
  //    that no index names, as SIGKILL can; `discard` still removes them on an error.)
  for (auto& f : files_) {
    io::release_temporary(f.slot);
    f.slot = -1;
  }
  write_index(false);
  committed_ = true;
  made_.keep();
  // 3. The old set's shards the new set does not use are removed.
  std::set<std::string> now;
  for (const auto& f : files_) now.insert(f.name);
  std::error_code ec;
  for (const auto& name : old_)
    if (!now.count(name) && name != index_name_) fs::remove(dir_ / name, ec);
  // 4. Shards under fresh names move to their own (the old set's files of that name are no
  //    longer named by any index).
  move_to_own_names();
  for (const auto& f : files_) r.files.push_back((dir_ / f.at).string());
  r.index = (dir_ / index_name_).string();
  r.bytes_written = size();
  if (o_.progress) o_.progress(r.bytes_written, r.bytes_written);
}

void ShardFiles::move_to_own_names() noexcept {
  std::vector<File*> fresh;
  for (auto& f : files_)
    if (f.at != f.name) fresh.push_back(&f);
  if (fresh.empty()) return;
  // Each own name gets a second link to its fresh file while the index names the fresh names;
  // the index names the own names only once every one of them holds its new shard.
  std::error_code ec;
  for (File* f : fresh) {
    const fs::path link = dir_ / ("." + f->name + ".link-" + io::random_suffix());
    if (::link((dir_ / f->at).c_str(), link.c_str()) != 0) return;  // the fresh names stay
    fs::rename(link, dir_ / f->name, ec);
    if (ec) {
      fs::remove(link, ec);
      return;
    }
  }
  try {
    write_index(true);
  } catch (...) {
    return;
  }
  for (File* f : fresh) {
    fs::remove(dir_ / f->at, ec);
    f->at = f->name;
  }
}

}  // namespace ckpt::internal
