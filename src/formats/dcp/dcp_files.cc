// The data files of a DCP folder through a cache of open descriptors (formats/dcp/dcp_files.h).

#include "formats/dcp/dcp_files.h"

#include <sys/resource.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <unordered_map>

#include "ckpt/error.h"
#include "ckpt/remote.h"

namespace ckpt::internal {

class DataFiles {
 public:
  explicit DataFiles(size_t capacity) : capacity_(capacity) {}

  // The open source of file `id`, opened by `path` when it is not in the cache.
  SourcePtr get(size_t id, const std::string& path, uint64_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = where_.find(id);
      if (it != where_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    SourcePtr s = open_file_source(path);  // outside the lock: an open may be slow
    if (s->size() != size)
      throw Error(ErrorCode::kIo,
                  "the data file changed size since the folder was opened (" +
                      std::to_string(size) + " bytes, now " + std::to_string(s->size()) + ")",
                  path);
    put(id, s);
    return s;
  }

  void put(size_t id, SourcePtr s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (where_.count(id)) return;
    lru_.emplace_front(id, std::move(s));
    where_[id] = lru_.begin();
    while (lru_.size() > capacity_) {  // a reader still holding one keeps it open until done
      where_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }

  size_t next_id() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_++;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<size_t, SourcePtr>> lru_;  // most recently used first
  std::unordered_map<size_t, std::list<std::pair<size_t, SourcePtr>>::iterator> where_;
  size_t ids_ = 0;
};

namespace {

class CachedFile final : public ByteSource {
 public:
  CachedFile(std::shared_ptr<DataFiles> files, size_t id, std::string path, uint64_t size,
             std::string name)
      : files_(std::move(files)),
        id_(id),
        path_(std::move(path)),
        size_(size),
        name_(std::move(name)) {}

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    files_->get(id_, path_, size_)->read_into(offset, dst);
    count_forwarded(dst.size());
  }

 private:
  std::shared_ptr<DataFiles> files_;
  size_t id_;
  std::string path_;
  uint64_t size_;
  std::string name_;
};

}  // namespace

std::shared_ptr<DataFiles> data_files(size_t capacity) {
  if (capacity == 0) {
    rlimit rl{};
    const uint64_t soft = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                              ? static_cast<uint64_t>(rl.rlim_cur)
                              : 4096;
    capacity = static_cast<size_t>(std::clamp<uint64_t>(soft / 4, 16, 512));
  }
  return std::make_shared<DataFiles>(capacity);
}

SourcePtr open_data_file(const std::shared_ptr<DataFiles>& files, const std::string& path,
                         const RemoteOptions& remote) {
  if (is_url(path)) return open_source(path, false, remote);
  SourcePtr s = open_file_source(path);
  const size_t id = files->next_id();
  auto cached = std::make_shared<CachedFile>(files, id, path, s->size(), s->name());
  files->put(id, std::move(s));
  return cached;
}

}  // namespace ckpt::internal
