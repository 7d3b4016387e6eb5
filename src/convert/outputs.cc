// The outputs of a conversion other than a shard set (outputs.h).

#include "convert/outputs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "convert/shard_files.h"

namespace ckpt::internal {
namespace {

std::chrono::steady_clock::duration interval(const ConvertOptions& o) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(o.progress_interval);
}

// One sink, through a ProgressSink when there is a callback.
class OneFile final : public ConvertOutput {
 public:
  OneFile(ByteSink& sink, std::unique_ptr<ByteSink> owned, uint64_t total, const ConvertOptions& o)
      : owned_(std::move(owned)), sink_(sink) {
    if (o.progress) progress_.emplace(sink_, total, o.progress, interval(o));
  }
  ByteSink& file() override { return progress_ ? static_cast<ByteSink&>(*progress_) : sink_; }
  ByteSink& file(const std::string& name) override { return SinkOutput(sink_).file(name); }
  void commit(ConvertReport& r) override {
    sink_.commit();
    r.bytes_written = sink_.position();
    if (progress_) progress_->finish();
  }

 private:
  std::unique_ptr<ByteSink> owned_;
  ByteSink& sink_;
  std::optional<ProgressSink> progress_;
};

// A local file, with the folders made for it.
class LocalFile final : public ConvertOutput {
 public:
  LocalFile(const std::string& path, uint64_t total, const ConvertOptions& o, bool make_folders)
      : path_(path), list_(make_folders) {
    if (make_folders) made_.emplace(std::filesystem::path(path).parent_path());
    std::unique_ptr<ByteSink> sink = create_file_sink(path, FileSinkOptions{o.atomic, o.fsync});
    ByteSink& s = *sink;
    one_.emplace(s, std::move(sink), total, o);
  }
  ByteSink& file() override { return one_->file(); }
  ByteSink& file(const std::string& name) override { return one_->file(name); }
  void commit(ConvertReport& r) override {
    one_->commit(r);
    if (made_) made_->keep();
    if (list_) r.files = {path_};
  }

 private:
  const std::string path_;
  const bool list_;
  std::optional<MadeFolders> made_;  // before the file: destroyed after it
  std::optional<OneFile> one_;
};

// An upload of a file written whole first: the writer patches bytes it wrote.
class UploadViaFile final : public ConvertOutput {
 public:
  UploadViaFile(const std::string& url, uint64_t total, const ConvertOptions& o)
      : upload_(create_s3_sink(url, o.remote)) {
    const char* dir = std::getenv("TMPDIR");
    tmp_ = std::string(dir && *dir ? dir : "/tmp") + "/.ckpt-upload-" + std::to_string(::getpid()) +
           "-" + std::to_string(reinterpret_cast<uintptr_t>(upload_.get())) + ".tensors";
    std::unique_ptr<ByteSink> sink = create_file_sink(tmp_, FileSinkOptions{false, false});
    ByteSink& s = *sink;
    local_.emplace(s, std::move(sink), total, o);
  }
  ~UploadViaFile() override {
    local_.reset();
    std::remove(tmp_.c_str());
  }
  ByteSink& file() override { return local_->file(); }
  ByteSink& file(const std::string& name) override { return local_->file(name); }
  void commit(ConvertReport& r) override {
    local_->commit(r);
    SourcePtr local = open_file_source(tmp_);
    std::vector<std::byte> buf(std::max<uint64_t>(1, std::min<uint64_t>(local->size(), 8 << 20)));
    for (uint64_t done = 0; done < local->size(); done += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), local->size() - done);
      local->read_into(done, std::span<std::byte>(buf.data(), n));
      upload_->write(std::span<const std::byte>(buf.data(), n));
    }
    upload_->commit();
  }

 private:
  std::unique_ptr<ByteSink> upload_;
  std::string tmp_;
  std::optional<OneFile> local_;
};

// The files of a folder, recorded as they are created.
class FolderFiles final : public ConvertOutput {
 public:
  FolderFiles(const std::string& dir, const ConvertOptions& o)
      : folder_(create_folder_sink(dir, FolderSinkOptions{false, o.fsync})),
        out_(*folder_),
        o_(o) {}
  ByteSink& file() override { return out_.file(); }
  ByteSink& file(const std::string& name) override {
    ByteSink& f = out_.file(name);
    files_.emplace_back(name, &f);
    return f;
  }
  // Commits the files, then the folder.
  void commit(ConvertReport& r) override {
    uint64_t bytes = 0;
    for (const auto& [name, f] : files_) {
      r.files.push_back(name);
      bytes += f->position();
    }
    out_.commit();
    r.bytes_written = bytes;
    if (o_.progress) o_.progress(bytes, bytes);
  }

 private:
  std::unique_ptr<FolderSink> folder_;
  FolderOutput out_;
  const ConvertOptions& o_;
  std::vector<std::pair<std::string, ByteSink*>> files_;
};

}  // namespace

std::unique_ptr<ConvertOutput> one_file_output(ByteSink& sink, std::unique_ptr<ByteSink> owned,
                                               uint64_t total, const ConvertOptions& o) {
  return std::make_unique<OneFile>(sink, std::move(owned), total, o);
}

std::unique_ptr<ConvertOutput> file_output(const std::string& path, uint64_t total,
                                           const ConvertOptions& o, bool make_folders) {
  return std::make_unique<LocalFile>(path, total, o, make_folders);
}

std::unique_ptr<ConvertOutput> upload_via_file(const std::string& url, uint64_t total,
                                               const ConvertOptions& o) {
  return std::make_unique<UploadViaFile>(url, total, o);
}

std::unique_ptr<ConvertOutput> folder_output(const std::string& dir, const ConvertOptions& o) {
  return std::make_unique<FolderFiles>(dir, o);
}

}  // namespace ckpt::internal
