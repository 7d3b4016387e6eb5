// convert(): a checkpoint of any format to a torch zip, safetensors or tensorizer file: the
// target's writer (writing.h) into a file, a sink or an upload, committed here.

#include "ckpt/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "convert/encryption.h"
#include "convert/progress_sink.h"
#include "convert/shards.h"
#include "convert/transform.h"
#include "convert/writing.h"

namespace ckpt {
namespace {

using internal::ProgressSink;

// Where the output goes: created on first use, so that everything that can be refused before
// writing is refused before a file (or its temporary) exists.
using OpenSink = std::function<ByteSink&()>;

// The one file of a conversion, through a ProgressSink when there is a callback.
class Output final : public internal::WriteOutput {
 public:
  Output(const OpenSink& open, uint64_t total, const ConvertOptions& o) : sink_(open()) {
    if (o.progress)
      progress_.emplace(
          sink_, total, o.progress,
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(o.progress_interval));
  }
  ByteSink& file() override { return progress_ ? static_cast<ByteSink&>(*progress_) : sink_; }
  ByteSink& file(const std::string& name) override {
    return internal::SinkOutput(sink_).file(name);  // throws: one file
  }
  // After the commit: the size, and the last progress call.
  uint64_t finish() {
    if (progress_) progress_->finish();
    return sink_.position();
  }

 private:
  ByteSink& sink_;
  std::optional<ProgressSink> progress_;
};

// read -> flatten -> writer -> commit.
ConvertReport run(const Checkpoint& c, const ConvertOptions& o, const OpenSink& open) {
  ConvertReport r;
  r.format = target_format(o.target);
  internal::TargetWriter target = internal::make_target(o);
  std::unique_ptr<internal::Writer> writer = std::move(target.writer);
  r.metadata_not_written = internal::metadata_not_written(c, *writer);
  internal::WriteContent content;
  if (writer->caps().object_tree && o.transforms.empty()) {
    internal::TensorSource source(c, o.load, o.memory_budget);
    content = internal::tree_content(c, source, r);
  } else {
    FlatStateDict flat = internal::flat_state(c, *writer, o, r);
    const auto* st = std::get_if<SafetensorsTarget>(&o.target);
    if (st && st->store_digests)
      writer = internal::with_digests(std::move(writer), o.load.threads, r.digests_stored);
    internal::TensorSource source(c, o.load, o.memory_budget);
    content = internal::flat_content(c, flat, source, *writer);
    // Transforms and dropped aliases (src/convert/transform.h): the content the writer sees.
    internal::finish_flat_content(o.transforms, *writer, c.source().name(), content, r);
  }
  Output out(open, r.tensor_bytes, o);
  internal::WriteResult written = writer->write(out, content);
  r.key = std::move(written.key);
  if (!target.new_key_file.empty()) {
    // The key is committed before the file: a file whose key was lost is unreadable.
    internal::write_key_file(target.new_key_file, r.key, o.atomic, o.fsync);
    r.key_file_written = true;
  }
  out.file().commit();
  r.bytes_written = out.finish();
  return r;
}

// The files of a folder output, recorded as they are created.
class FolderFiles final : public internal::WriteOutput {
 public:
  explicit FolderFiles(FolderSink& folder) : out_(folder) {}
  ByteSink& file() override { return out_.file(); }
  ByteSink& file(const std::string& name) override {
    ByteSink& f = out_.file(name);
    files_.emplace_back(name, &f);
    return f;
  }
  // Commits the files, then the folder; returns their total size.
  uint64_t commit(std::vector<std::string>& names) {
    uint64_t bytes = 0;
    for (const auto& [name, f] : files_) {
      names.push_back(name);
      bytes += f->position();
    }
    out_.commit();
    return bytes;
  }

 private:
  internal::FolderOutput out_;
  std::vector<std::pair<std::string, ByteSink*>> files_;
};

// A writer of several files (dcp): read -> writer -> a folder that appears whole, or not at all.
ConvertReport convert_to_folder(const Checkpoint& c, const std::string& dir,
                                const ConvertOptions& o) {
  ConvertReport r;
  r.format = target_format(o.target);
  internal::TargetWriter target = internal::make_target(o);
  r.metadata_not_written = internal::metadata_not_written(c, *target.writer);
  internal::TensorSource source(c, o.load, o.memory_budget);
  internal::WriteContent content;
  if (o.transforms.empty()) {
    content = internal::tree_content(c, source, r);
  } else {  // transforms (src/convert/transform.h): a flat state dict
    content = internal::flat_content(c, internal::flat_state(c, *target.writer, o, r), source,
                                     *target.writer);
    internal::finish_flat_content(o.transforms, *target.writer, c.source().name(), content, r);
  }
  std::unique_ptr<FolderSink> folder = create_folder_sink(dir, FolderSinkOptions{false, o.fsync});
  FolderFiles out(*folder);
  target.writer->write(out, content);
  r.bytes_written = out.commit(r.files);
  if (o.progress) o.progress(r.bytes_written, r.bytes_written);
  return r;
}

// An upload (ConvertOptions::remote): streamed where the writer only appends, else through a
// local temporary file.
ConvertReport convert_to_url(const Checkpoint& c, const std::string& url, ConvertOptions o) {
  if (o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument, "shards are written to local files only",
                redact_url(url));
  std::unique_ptr<ByteSink> sink = create_s3_sink(url, o.remote);
  if (!internal::make_target(o).writer->caps().patches)
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
  if (std::holds_alternative<std::monostate>(o.target)) {
    // A sharded output may be named by its index: "model.safetensors.index.json".
    std::string named = out_path;
    if (o.max_shard_size && named.size() > 11 &&
        named.compare(named.size() - 11, 11, ".index.json") == 0)
      named.resize(named.size() - 11);
    o.target = default_target(convert_format_for_path(named));
  }
  if (std::holds_alternative<DcpTarget>(o.target)) {
    if (is_url(out_path))
      throw Error(ErrorCode::kInvalidArgument, "a DCP folder is written to a local path only",
                  redact_url(out_path));
    return convert_to_folder(c, out_path, o);
  }
  if (is_url(out_path)) return convert_to_url(c, out_path, o);
  if (o.max_shard_size && !o.transforms.empty())
    throw Error(ErrorCode::kInvalidArgument, "transforms are not applied to sharded output",
                out_path);
  if (o.max_shard_size) return internal::convert_sharded(c, out_path, o);
  std::unique_ptr<ByteSink> file;
  return run(c, o, [&]() -> ByteSink& {
    file = create_file_sink(out_path, FileSinkOptions{o.atomic, o.fsync});
    return *file;
  });
}

ConvertReport convert(const Checkpoint& c, ByteSink& sink, const ConvertOptions& options) {
  ConvertOptions o = options;
  if (std::holds_alternative<std::monostate>(o.target))
    o.target = default_target(convert_format_for_path(sink.name()));
  if (std::holds_alternative<DcpTarget>(o.target))
    throw Error(ErrorCode::kInvalidArgument,
                "a DCP output is a folder of files: use the path overload", sink.name());
  if (auto* pt = std::get_if<PtTarget>(&o.target); pt && pt->archive_name.empty())
    pt->archive_name = "archive";  // not the sink's name
  if (o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument,
                "shards (max_shard_size) are written to files: use the path overload");
  return run(c, o, [&]() -> ByteSink& { return sink; });
}

}  // namespace ckpt
