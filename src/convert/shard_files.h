#pragma once
// The files of a shard set (ConvertOptions::max_shard_size) and their commit. A new set replaces
// an old one of the same index name so that whoever reads the index finds the old set or the
// complete new one at every moment, a SIGKILL included (docs/design/writers.md,
// "Writers", **Shard sets**).

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "convert/outputs.h"

namespace ckpt::internal {

// The folders of `dir` that do not exist yet, made now. Until keep(), the top one made is
// registered as a temporary (a signal removes it whole), and destroying this removes the folders
// it made (those still empty), so that a failed conversion leaves no folder behind.
class MadeFolders {
 public:
  explicit MadeFolders(const std::filesystem::path& dir);
  ~MadeFolders();
  MadeFolders(const MadeFolders&) = delete;
  MadeFolders& operator=(const MadeFolders&) = delete;
  void keep();

 private:
  void undo() noexcept;
  std::vector<std::filesystem::path> made_;  // top first
  int slot_ = -1;
};

// The shards of a set, each written to a temporary beside it, and its index: the file named
// `index_name` is held in memory ({"metadata": ..., "weight_map": {tensor: shard name}}, as the
// shard writer writes it) and written by commit(). A shard whose name the old index (the file at
// `index_name`, when there is one) names is written under a fresh name first and moved to its
// own name after the new index replaced the old one. Destroyed uncommitted, it leaves nothing
// (and the old set as it was). commit() sets r.files (the shards' paths) and r.index.
class ShardFiles final : public ConvertOutput {
 public:
  ShardFiles(const std::filesystem::path& dir, std::string index_name, uint64_t total,
             const ConvertOptions& o);
  ~ShardFiles() override;
  ByteSink& file() override;                         // throws: several files
  ByteSink& file(const std::string& name) override;  // a shard, in order, or the index
  void commit(ConvertReport& r) override;

 private:
  struct File;
  uint64_t size() const;  // bytes written to the shards
  void write_index(bool final_names);
  void discard() noexcept;
  void move_to_own_names() noexcept;

  const std::filesystem::path dir_;
  const std::string index_name_;
  const uint64_t total_;
  const ConvertOptions& o_;
  std::set<std::string> old_;  // the files the old index names
  MadeFolders made_;
  std::vector<File> files_;
  std::unique_ptr<MemorySink> index_;
  nlohmann::ordered_json written_;  // the index as the writer wrote it
  bool committed_ = false;
};

}  // namespace ckpt::internal
