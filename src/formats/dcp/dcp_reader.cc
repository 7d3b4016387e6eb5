// The reader of torch.distributed.checkpoint (DCP) folders (formats/dcp/dcp_layout.h): `.metadata`
// read as data (formats/dcp), every storage item checked against its data file, every chunk's
// torch.save blob opened as the small torch zip it is (its tensor's bytes are one raw run of the
// data file), the chunks of each tensor checked to tile it exactly, and the tree torch's
// dcp_to_torch_save rebuilds (planner_data paths, as torch's set_element nests them) made over one
// tensor per global tensor. The folder's layout: docs/formats/dcp.md,
// "torch.distributed.checkpoint folders".

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "ckpt/remote.h"
#include "formats/dcp/dcp_checks.h"
#include "formats/dcp/dcp_chunk.h"
#include "formats/dcp/dcp_files.h"
#include "formats/dcp/dcp_folder.h"
#include "formats/dcp/dcp_layout.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/flat_index.h"
#include "formats/open.h"
#include "io/inside.h"
#include "io/window_source.h"

namespace ckpt::internal {
namespace {

// A data file's name must stay inside the folder: one plain name.
bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\\') == std::string::npos && n.find('\0') == std::string::npos;
}

// A tensor chunk of at most this many bytes is read whole, in one read, and opened from memory:
// opening a torch.save zip from its data file reads the zip's directory, then data.pkl with the
// small records, each a system call (a folder of 400,000 small tensors: 1.1 s of system time).
constexpr uint64_t kSmallItem = 64 << 10;

// An item, opened. A bytes item keeps its model (its value and tensors join the folder's); a
// tensor chunk keeps only what build() checks and places (formats/dcp/dcp_chunk.h), read
// directly from the item or from its model, which the thread that opened it frees (400,000
// models kept to the end were most of the memory of opening such a folder).
struct Opened : DcpChunkFacts {
  std::shared_ptr<CheckpointModel> blob;  // a bytes item: the item's torch.save, opened
  uint32_t item = 0;                      // its storage item's number in the metadata
};

// The jobs a thread takes at a time: neighbours in the list are mostly neighbours in the file.
constexpr size_t kJobBatch = 256;

// One thread's last read of a data file, which the small items after it are copied from. A read
// goes `ahead` bytes past the item when the items come in file order, doubling per read up to
// kReadAhead, and is the item alone otherwise: 400,000 small items of one file were 400,000
// preads (each through the descriptor cache's lock), and a folder whose items are out of order
// reads no more than before.
constexpr uint64_t kReadAhead = 256 << 10;
struct ItemBlock {
  uint32_t file = UINT32_MAX;
  uint64_t start = 0;
  uint64_t last_end = 0;  // where the last item copied from it ended
  uint64_t ahead = 0;
  std::vector<std::byte> data;
  std::vector<std::byte> own;  // an item read alone
  size_t next_item = 0;  // the storage item after the thread's last job's: mostly the next one's
};

// A chunk's item read where its bytes lie (the thread's block), for read_chunk_item: no name, no
// owner, no copy. It lives on the stack of the job and is handed out without ownership; the
// bytes were counted when read from the file.
class SpanSource final : public ByteSource, public InMemory {
 public:
  explicit SpanSource(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    count_forwarded(dst.size());
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }
  const InMemory* in_memory() const override { return this; }
  const std::byte* base() const override { return bytes_.data(); }
  std::shared_ptr<const void> owner() const override { return nullptr; }

 private:
  std::span<const std::byte> bytes_;
  std::string name_ = "<memory>";
};

// How the folder was written, for `info`.
std::string layout_name(DcpFolderKind kind, bool blobs) {
  std::string s = kind == DcpFolderKind::kRankLocal  ? "rank-local __<rank>.metadata"
                  : kind == DcpFolderKind::kHfShards ? "HuggingFaceStorageWriter shards"
                                                     : ".metadata";
  if (kind != DcpFolderKind::kHfShards) s += blobs ? ", safetensors items" : ", torch.save items";
  return s;
}

// The chunk offsets older writers key a bytes item by.
constexpr int64_t kOffsetZero[1] = {0};

class Opener {
 public:
  Opener(std::string dir, const OpenOptions& options) : options_(options) {
    layout_ = std::make_shared<DcpLayout>();
    layout_->dir = std::move(dir);
  }

  std::shared_ptr<CheckpointModel> open() {
    remote_ = is_url(layout_->dir);
    DcpFolderMetadata folder = read_dcp_folder(layout_->dir, options_);
    SourcePtr meta = folder.source;
    meta_name_ = meta->name();
    md_ = std::move(folder.md);
    index_storage();
    open_items();
    refuse_shared_bytes();
    auto model = std::make_shared<CheckpointModel>();
    model->format = Format::kTorchDcp;
    model->source = meta;
    model->options = options_;
    build(*model);
    model->decoder = dcp_decoder(layout_);
    model->decode_all = true;
    model->files = layout_->paths;
    model->verify = [](const ProgressFn& progress) -> size_t {  // DCP stores no checksums
      if (progress) progress(0, 0);
      return 0;
    };
    model->properties["data_files"] = std::to_string(layout_->paths.size());
    if (!md_.version.empty()) model->properties["dcp_version"] = md_.version;
    model->properties["dcp_layout"] = layout_name(folder.kind, !blobs_.empty());
    model->properties.insert(folder.properties.begin(), folder.properties.end());
    model->finalize();
    return model;
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& what, const std::string& file,
                         const std::string& fqn, std::optional<uint64_t> offset = {}) const {
    throw Error(code, what, file.empty() ? meta_name_ : file, fqn, offset);
  }

  // The storage items by (fqn, chunk offsets); each data file opened once, in first-use order.
  void index_storage() {
    std::map<std::string, uint32_t> file_of;
    auto last = file_of.end();
    by_key_ = FlatIndex(md_.storage.size());
    item_file_.reserve(md_.storage.size());
    const size_t n = md_.storage.size();
    uint64_t ahead[kAhead];
    for (size_t i = 0; i < std::min(n, kAhead); ++i) ahead[i] = storage_hash(i);
    for (size_t i = 0; i < n; ++i) {
      const DcpStorage& s = md_.storage[i];
      // The keys hashed kAhead items ahead and their index slots prefetched: the index is
      // megabytes, and each probe of it missed the cache.
      const uint64_t hash = ahead[i % kAhead];
      if (i + kAhead < n) by_key_.prefetch(ahead[i % kAhead] = storage_hash(i + kAhead));
      if (!plain_name(s.relative_path))
        fail(ErrorCode::kCorrupt,
             "data file name '" + s.relative_path + "' is not a plain file name in the folder", {},
             s.fqn);
      // The items of a file mostly come together: the last item's file is tried first.
      if (last != file_of.end() && last->first == s.relative_path) {
        check_item(i, last->second, hash);
        continue;
      }
      auto [it, fresh] =
          file_of.emplace(s.relative_path, static_cast<uint32_t>(layout_->paths.size()));
      last = it;
      if (fresh) {  // a URL's data file is one more object under the same prefix
        const std::string path = join(layout_->dir, s.relative_path);
        if (!remote_)
          check_inside(path, layout_->dir, "data file", "the folder", meta_name_, s.fqn);
        try {
          layout_->sources.push_back(open_data_file(files_, path, options_.remote));
        } catch (Error& e) {
          e.add_context("opening the data file of '" + s.fqn + "' (named in .metadata)");
          throw;
        }
        layout_->paths.push_back(layout_->sources.back()->name());
      }
      check_item(i, it->second, hash);
    }
  }

  uint64_t storage_hash(size_t i) const {
    return DcpItemKeyHash{}(DcpItemKey{md_.storage[i].fqn, md_.storage[i].chunk_offsets});
  }
  static constexpr size_t kAhead = 8;

  // Storage item i, of data file f: inside the file, not transformed, its key (hashed: `hash`)
  // not seen before.
  void check_item(size_t i, uint32_t f, uint64_t hash) {
    const DcpStorage& s = md_.storage[i];
    item_file_.push_back(f);
    const ByteSource& src = *layout_->sources[f];
    if (s.offset > src.size() || s.length > src.size() - s.offset)
      fail(ErrorCode::kTruncated,
           "the item of " + std::to_string(s.length) + " bytes at offset " +
               std::to_string(s.offset) + " passes the end of the file (" +
               std::to_string(src.size()) + " bytes)",
           src.name(), s.fqn, s.offset);
    if (s.transformed)
      fail(ErrorCode::kUnsupported,
           "the item is stored through transforms (" + s.transforms +
               "); only plain torch.save items are read",
           src.name(), s.fqn, s.offset);
    const DcpItemKey key{s.fqn, s.chunk_offsets};
    if (by_key_.find_or_add(hash, i, [&](uint32_t j) {
          return DcpItemKey{md_.storage[j].fqn, md_.storage[j].chunk_offsets} == key;
        }) != i)
      fail(ErrorCode::kCorrupt, "two storage items for offsets " + dims(s.chunk_offsets),
           src.name(), s.fqn, s.offset);
  }

  const DcpStorage* item(std::string_view fqn, std::span<const int64_t> offsets,
                         size_t* index = nullptr) const {
    const DcpItemKey key{fqn, offsets};
    const uint32_t i = by_key_.find(DcpItemKeyHash{}(key), [&](uint32_t j) {
      return DcpItemKey{md_.storage[j].fqn, md_.storage[j].chunk_offsets} == key;
    });
    if (i == FlatIndex::kNone) return nullptr;
    if (index) *index = i;
    return &md_.storage[i];
  }
  // item() for a job's chunk, tried first at the storage item after the last one found: torch
  // and ckpt list the storage items in the order of the entries and their chunks, and a probe of
  // the hash index reads three scattered places of a large index and metadata per item.
  const DcpStorage* item_after(std::string_view fqn, std::span<const int64_t> offsets,
                               size_t* index, size_t& guess) const {
    if (guess < md_.storage.size()) {
      const DcpStorage& g = md_.storage[guess];
      if (DcpItemKey{g.fqn, g.chunk_offsets} == DcpItemKey{fqn, offsets}) {
        *index = guess++;
        return &g;
      }
    }
    const DcpStorage* s = item(fqn, offsets, index);
    if (s) guess = *index + 1;
    return s;
  }
  const std::string& file_name(size_t item) const { return layout_->paths[item_file_[item]]; }

  // Checks that a tensor's chunks tile it (formats/dcp/dcp_checks.h), naming the data file and
  // offset of the chunk at fault.
  void check_chunks(DcpEntry& e) const {
    check_tiling(e, [&](ErrorCode code, const std::string& what, const DcpChunk* c) {
      std::string file;
      std::optional<uint64_t> off;
      size_t i = 0;
      if (c && item(e.fqn, c->offsets, &i)) {
        file = file_name(i);
        off = md_.storage[i].offset;
      }
      fail(code, what, file, e.fqn, off);
    });
  }

  // Two items that share bytes of a data file would each load their own copy of them (a folder
  // of a few megabytes could make gigabytes): torch writes every item once, so it is corrupt.
  void refuse_shared_bytes() const {
    std::vector<DcpItemRange> ranges(md_.storage.size());
    for (size_t i = 0; i < ranges.size(); ++i)
      ranges[i] =
          ranges_[i] ? DcpItemRange{item_file_[i], ranges_[i]->first, ranges_[i]->second, i}
                     : DcpItemRange{item_file_[i], md_.storage[i].offset, md_.storage[i].length, i};
    if (auto two = shared_bytes(std::move(ranges))) {
      const DcpStorage& a = md_.storage[two->first];
      const DcpStorage& b = md_.storage[two->second];
      fail(ErrorCode::kCorrupt,
           "the item of " + std::to_string(b.length) + " bytes at offset " +
               std::to_string(b.offset) + " overlaps the item of '" + a.fqn + "' (" +
               std::to_string(a.length) + " bytes at offset " + std::to_string(a.offset) +
               "): two items share bytes",
           file_name(two->second), b.fqn, b.offset);
    }
  }

  uint64_t mul(uint64_t a, uint64_t b, const std::string& fqn) const {
    if (b && a > UINT64_MAX / b) fail(ErrorCode::kCorrupt, "the tensor's size overflows", {}, fqn);
    return a * b;
  }

  // Every item's torch.save blob, opened (in parallel: each is a few small reads).
  void open_items() {
    for (DcpEntry& e : md_.entries) {
      if (e.is_bytes) {
        jobs_.push_back({&e, nullptr});
        continue;
      }
      if (e.size.size() > options_.limits.max_dims)
        fail(ErrorCode::kLimitExceeded,
             "the tensor has " + std::to_string(e.size.size()) + " dimensions", {}, e.fqn);
      check_chunks(e);
      for (const DcpChunk& c : e.chunks) {
        uint64_t vol = 1;
        for (int64_t s : c.sizes) vol *= static_cast<uint64_t>(s);
        if (vol) jobs_.push_back({&e, &c});
      }
    }
    opened_.resize(jobs_.size());
    ranges_.resize(md_.storage.size());
    std::vector<std::exception_ptr> errors(jobs_.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      ItemBlock block;
      for (size_t b; (b = next.fetch_add(kJobBatch)) < jobs_.size();)
        for (size_t j = b; j < std::min(b + kJobBatch, jobs_.size()); ++j) {
          try {
            opened_[j] = open_job(jobs_[j], block);
          } catch (...) {
            errors[j] = std::current_exception();
          }
        }
    };
    const size_t threads = std::min<size_t>(
        {jobs_.size() / 8 + 1, 8, std::max(1u, std::thread::hardware_concurrency())});
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  struct Job {
    DcpEntry* entry;
    const DcpChunk* chunk;  // null: a bytes item
  };

  // A small item's bytes: a view into the thread's block when it holds them, else read into the
  // block (with its read-ahead while the items come in file order). An item past the file's end,
  // or of a remote file, is read through its window into `b.own`, and the window names a fault.
  std::span<const std::byte> read_small(uint32_t f, const DcpStorage& s, ItemBlock& b) const {
    const SourcePtr& file = layout_->sources[f];
    auto alone = [&]() -> std::span<const std::byte> {
      b.own.resize(s.length);
      window(f, s)->read_into(0, b.own);
      return b.own;
    };
    if (remote_ || s.offset > file->size() || s.length > file->size() - s.offset) return alone();
    if (b.file != f || s.offset < b.start || s.offset + s.length > b.start + b.data.size()) {
      const bool in_order = b.file == f && s.offset >= b.last_end && s.offset - b.last_end < 4096;
      b.ahead = in_order ? std::clamp<uint64_t>(2 * b.ahead, 4 * s.length, kReadAhead) : 0;
      b.data.resize(std::min<uint64_t>(s.length + b.ahead, file->size() - s.offset));
      b.file = UINT32_MAX;
      try {
        file->read_into(s.offset, b.data);
      } catch (const Error&) {  // maybe past this item: the item alone names its own fault
        return alone();
      }
      b.file = f;
      b.start = s.offset;
    }
    b.last_end = s.offset + s.length;
    return {b.data.data() + (s.offset - b.start), s.length};
  }

  // The item's bytes in its data file, named "<file>@<offset>" in errors.
  std::string item_name(uint32_t f, const DcpStorage& s) const {
    return layout_->paths[f] + "@" + std::to_string(s.offset);
  }
  SourcePtr window(uint32_t f, const DcpStorage& s) const {
    return window_source(layout_->sources[f], s.offset, s.length, item_name(f, s));
  }

  // The storage item of job j: its number in md_.storage.
  size_t job_item(const Job& j, ItemBlock& block) const {
    const std::vector<int64_t> none;
    size_t i = 0;
    const DcpStorage* s =
        item_after(j.entry->fqn, j.chunk ? j.chunk->offsets : none, &i, block.next_item);
    if (!s && !j.chunk)
      s = item(j.entry->fqn, kOffsetZero, &i);  // older writers key bytes by offset 0
    if (!s)
      fail(ErrorCode::kCorrupt,
           j.chunk ? "the chunk at " + dims(j.chunk->offsets) + " has no storage item"
                   : std::string("the bytes item has no storage item"),
           {}, j.entry->fqn);
    return i;
  }

  Opened open_job(const Job& j, ItemBlock& block) const {
    const size_t i = job_item(j, block);
    Opened o = open_item(j, i, block);
    o.item = static_cast<uint32_t>(i);
    return o;
  }

  Opened open_item(const Job& j, size_t i, ItemBlock& block) const {
    const DcpStorage* s = &md_.storage[i];
    const uint32_t f = item_file_[i];
    SourcePtr w;
    if (j.chunk) {
      // A tensor item is a torch.save zip, or with SerializationFormat.SAFETENSORS (and in the
      // files of HuggingFaceStorageWriter) one safetensors blob per data file that every tensor
      // item of the file points at (its length is the tensor's bytes: maybe under 4).
      std::byte head[4]{};
      if (s->length >= 4 && s->length <= kSmallItem) {  // one read, not one per zip record
        // Read from the bytes where they lie (no copy, no name, no window per item); an item
        // read_chunk_item leaves to open_model is copied out under its name.
        const std::span<const std::byte> bytes = read_small(f, *s, block);
        if (std::memcmp(bytes.data(), "PK\x03\x04", 4) != 0)
          return blob_item(*j.entry, *j.chunk, i);
        const SpanSource view(bytes);
        if (std::optional<DcpChunkFacts> facts =
                read_chunk_item(SourcePtr(SourcePtr(), &view), options_)) {
          Opened o;
          static_cast<DcpChunkFacts&>(o) = std::move(*facts);
          return o;
        }
        w = memory_source(std::vector<std::byte>(bytes.begin(), bytes.end()), item_name(f, *s));
      } else {
        if (layout_->sources[f]->size() - s->offset >= 4)
          layout_->sources[f]->read_into(s->offset, head);
        if (std::memcmp(head, "PK\x03\x04", 4) != 0) return blob_item(*j.entry, *j.chunk, i);
        w = window(f, *s);
        if (std::optional<DcpChunkFacts> facts = read_chunk_item(w, options_)) {
          Opened o;
          static_cast<DcpChunkFacts&>(o) = std::move(*facts);
          return o;
        }
      }
    } else {
      w = window(f, *s);
    }
    try {
      std::shared_ptr<CheckpointModel> m = open_model(w, options_);
      if (j.chunk) {
        Opened o;
        static_cast<DcpChunkFacts&>(o) = chunk_facts(*m);
        return o;
      }
      Opened o;
      o.blob = std::move(m);
      return o;
    } catch (Error& e) {
      e.add_context("reading the item of '" + j.entry->fqn + "' at offset " +
                    std::to_string(s->offset) + " of " + layout_->paths[f]);
      throw;
    }
  }

  // The safetensors blob at item i's offset (to the end of its data file, as torch writes it),
  // opened once per file and offset; the chunk's tensor is found in it by name and checked
  // against the chunk (blob_tensor), and its bytes become the item's range.
  Opened blob_item(const DcpEntry& e, const DcpChunk& c, size_t i) const {
    const DcpStorage& s = md_.storage[i];
    const uint32_t f = item_file_[i];
    std::shared_ptr<CheckpointModel> b;
    {
      std::lock_guard<std::mutex> lock(blob_mu_);
      std::shared_ptr<CheckpointModel>& slot = blobs_[{f, s.offset}];
      if (!slot) {
        const SourcePtr& file = layout_->sources[f];
        SourcePtr w = window_source(file, s.offset, file->size() - s.offset,
                                    layout_->paths[f] + "@" + std::to_string(s.offset));
        try {
          slot = open_safetensors(w, options_);
          slot->finalize();
        } catch (Error& err) {
          err.add_context("the chunk at " + dims(c.offsets) + " of '" + e.fqn +
                          "' is neither a torch.save zip nor a safetensors blob "
                          "(SerializationFormat.SAFETENSORS)");
          throw;
        }
      }
      b = slot;
    }
    const TensorInfo& t = blob_tensor(*b, e, c, i);
    const StorageInfo& bs = b->storages[t.storage];
    ranges_[i] = {s.offset + bs.offset + t.byte_offset(), t.nbytes()};
    Opened o;  // the blob stays open in blobs_
    o.one_tensor = true;
    o.dtype = t.dtype;
    o.shape = t.shape;
    o.raw =
        t.is_contiguous() && !bs.meta && b->kind(t.storage) == StorageKind::kRaw && !bs.byteswap;
    o.offset = bs.offset + t.byte_offset();
    o.nbytes = t.nbytes();
    return o;
  }

  const nlohmann::json& sharding(const CheckpointModel& b) const {
    std::lock_guard<std::mutex> lock(blob_mu_);
    auto [it, fresh] = sharding_.try_emplace(&b);
    if (fresh) {
      auto info = b.properties.find("metadata.DCP_SHARDING_INFO");
      if (info != b.properties.end())
        it->second = nlohmann::json::parse(info->second, nullptr, false);
      if (it->second.is_discarded()) it->second = nlohmann::json::object();  // matches nothing
    }
    return it->second;
  }

  // The chunk's tensor in a safetensors blob: the tensor named as the entry, at the offsets
  // DCP_SHARDING_INFO records for it (torch keys the blob by name, so a rank that held two
  // chunks of one tensor kept only the last: refused here rather than read wrong).
  const TensorInfo& blob_tensor(const CheckpointModel& b, const DcpEntry& e, const DcpChunk& c,
                                size_t i) const {
    const std::string& file = file_name(i);
    const uint64_t at = md_.storage[i].offset;
    std::optional<size_t> k = b.find(e.fqn);
    if (!k)
      fail(ErrorCode::kCorrupt,
           "the chunk at " + dims(c.offsets) + " is not in the safetensors blob of its file", file,
           e.fqn, at);
    const TensorInfo& t = b.tensors[*k];
    if (t.dtype != e.dtype || t.shape != c.sizes)
      fail(ErrorCode::kCorrupt,
           "the chunk at " + dims(c.offsets) + " holds a " + std::string(dtype_name(t.dtype)) +
               " tensor " + dims(t.shape) + "; the metadata says " +
               std::string(dtype_name(e.dtype)) + " " + dims(c.sizes),
           file, e.fqn, at);
    const nlohmann::json& j = sharding(b);
    if (!j.is_null()) {
      std::vector<int64_t> saved;
      if (j.is_object() && j.contains(e.fqn) && j[e.fqn].is_object() &&
          j[e.fqn].contains("saved_offsets") && j[e.fqn]["saved_offsets"].is_array())
        for (const auto& v : j[e.fqn]["saved_offsets"])
          saved.push_back(v.is_number_integer() ? v.get<int64_t>() : -1);
      if (saved != c.offsets)
        fail(ErrorCode::kCorrupt,
             "the blob's DCP_SHARDING_INFO places the tensor at " + dims(saved) +
                 ", not at the chunk's offsets " + dims(c.offsets),
             file, e.fqn, at);
    }
    return t;
  }

  void build(CheckpointModel& m);
  void place(const ValuePtr& root, const DcpEntry& e, ValuePtr v) const;

  OpenOptions options_;
  bool remote_ = false;
  std::shared_ptr<DataFiles> files_ = data_files();
  std::shared_ptr<DcpLayout> layout_;
  std::string meta_name_;
  DcpMetadata md_;
  // The storage items by (fqn, chunk offsets): their numbers in md_.storage (no longer changes).
  FlatIndex by_key_;
  std::vector<uint32_t> item_file_;  // per storage item: its data file
  // Per storage item in a safetensors blob: the bytes of its tensor (offset, length in the file).
  mutable std::vector<std::optional<std::pair<uint64_t, uint64_t>>> ranges_;
  // The safetensors blobs by (data file, offset).
  mutable std::mutex blob_mu_;
  mutable std::map<std::pair<uint32_t, uint64_t>, std::shared_ptr<CheckpointModel>> blobs_;
  // Their DCP_SHARDING_INFO, parsed once (null where a blob has none).
  mutable std::map<const CheckpointModel*, nlohmann::json> sharding_;
  std::vector<Job> jobs_;
  std::vector<Opened> opened_;
  // The entries of each dict place() walks: key -> entry number (a string key equals only a
  // string, an int key only an int). A dict's entries only grow while the tree is built, and a
  // dict is indexed from its own entries the first time it is met (a bytes item's value may
  // bring some), so a lookup costs O(1), not a scan per key. The dicts are found by address.
  struct DictIndex {
    const Value* dict;
    FlatIndex keys;
    // The entry of key k (string or int), added as entry `next` when new: (entry, added).
    std::pair<size_t, bool> find_or_add(const Value& k, size_t next) {
      const bool str = k.kind() == Value::Kind::kString;
      const uint64_t h =
          str ? name_hash(k.str()) : static_cast<uint64_t>(k.as_int()) * 0x9e3779b97f4a7c15ull + 1;
      const uint32_t at = keys.find_or_add(h, next, [&](uint32_t j) {
        const Value& o = *dict->entries()[j].first;
        return o.kind() == k.kind() && (str ? o.str() == k.str() : o.as_int() == k.as_int());
      });
      return {at, at == next};
    }
  };
  mutable std::vector<DictIndex> dict_indexes_;
  mutable FlatIndex dict_of_;  // Value address -> its dict_indexes_ number
  // The containers place() walked through for the last entry: (the step to it, it); [0]: the
  // root.
  mutable std::vector<std::pair<const Value*, ValuePtr>> walked_;
};

namespace {
bool string_or_int(const Value& k) {
  return k.kind() == Value::Kind::kString || k.kind() == Value::Kind::kInt;
}
}  // namespace

// Puts v where torch's set_element would: along planner_data's path (dicts for string keys,
// lists padded with None for int keys), else under the flat key.
void Opener::place(const ValuePtr& root, const DcpEntry& e, ValuePtr v) const {
  if (e.path.empty()) {
    root->set(e.fqn, std::move(v));
    walked_.clear();  // the key may have been one of the containers walked
    return;
  }
  auto slot = [&](const ValuePtr& cur, const ValuePtr& key, bool create_list) -> ValuePtr* {
    if (cur->is_dict()) {
      if (!string_or_int(*key))
        fail(ErrorCode::kCorrupt,
             "planner_data's path holds a key that is neither a string nor an int", {}, e.fqn);
      const size_t next = dict_indexes_.size();
      const uint32_t d =
          dict_of_.find_or_add(std::hash<const Value*>{}(cur.get()), next,
                               [&](uint32_t j) { return dict_indexes_[j].dict == cur.get(); });
      const bool first_visit = d == next;
      if (first_visit) dict_indexes_.push_back(DictIndex{cur.get(), FlatIndex(0)});
      DictIndex& index = dict_indexes_[d];
      if (first_visit)
        for (size_t i = 0; i < cur->entries().size(); ++i)
          if (string_or_int(*cur->entries()[i].first))
            index.find_or_add(*cur->entries()[i].first, i);
      const auto [at, fresh] = index.find_or_add(*key, cur->entries().size());
      if (!fresh) return &cur->entries()[at].second;
      cur->entries().emplace_back(key, nullptr);
      return &cur->entries().back().second;
    }
    if (cur->kind() == Value::Kind::kList && key->kind() == Value::Kind::kInt) {
      auto idx = static_cast<size_t>(key->as_int());
      while (cur->items().size() <= idx) cur->items().push_back(Value::none());
      return &cur->items()[idx];
    }
    (void)create_list;
    fail(ErrorCode::kCorrupt, "planner_data's path runs through " + cur->repr(40), {}, e.fqn);
  };
  // The steps this path shares with the last one's lead to the containers they led to then (the
  // last value placed went into the last container, never onto one): the walk starts after them.
  if (walked_.empty() || walked_[0].second != root) walked_.assign(1, {nullptr, root});
  size_t k = 0;
  while (k + 1 < e.path.size() && k + 1 < walked_.size() && walked_[k + 1].first == e.path[k].get())
    ++k;
  walked_.resize(k + 1);
  ValuePtr cur = walked_[k].second;
  for (size_t i = k + 1; i < e.path.size(); ++i) {
    ValuePtr* s = slot(cur, e.path[i - 1], false);
    if (!*s || (*s)->is_none())
      *s = e.path[i]->kind() == Value::Kind::kString ? Value::dict() : Value::list();
    cur = *s;
    walked_.emplace_back(e.path[i - 1].get(), cur);
  }
  *slot(cur, e.path.back(), false) = std::move(v);
}

void Opener::build(CheckpointModel& m) {
  ValuePtr root = Value::dict();
  m.tensors.reserve(md_.entries.size());  // one per tensor entry (a bytes item may add more)
  m.storages.reserve(md_.entries.size());
  m.tensor_files.reserve(md_.entries.size());
  layout_->pieces.reserve(md_.entries.size());
  size_t j = 0;                      // jobs_ are in entry order, chunks in order
  for (DcpEntry& e : md_.entries) {  // the last use of md_: its chunks are moved
    if (e.is_bytes) {
      const uint32_t item_no = opened_[j].item;  // the storage item open_job found
      const CheckpointModel& b = *opened_[j++].blob;
      // The value, with its tensors (if any) as tensors of this model read whole from the item.
      const size_t tbase = m.tensors.size(), sbase = m.storages.size();
      for (size_t s = 0; s < b.storages.size(); ++s) {
        StorageInfo si = b.storages[s];
        if (!si.meta && (b.kind(s) != StorageKind::kRaw || si.byteswap))
          fail(ErrorCode::kUnsupported,
               "a tensor inside the bytes item is stored in a way this reader does not assemble",
               b.source->name(), e.fqn);
        DcpPiece p;
        p.whole = true;
        if (!si.meta) {
          // The window is the item: its offsets are relative to the item's start.
          p.file = item_file_[item_no];
          p.file_offset = md_.storage[item_no].offset + si.offset;
          p.nbytes = si.nbytes;
        }
        si.offset = kNoOffset;
        si.crc32.reset();
        layout_->pieces.push_back(si.meta ? std::vector<DcpPiece>{} : std::vector<DcpPiece>{p});
        m.storages.push_back(std::move(si));
      }
      for (const TensorInfo& t : b.tensors) {
        TensorInfo n = t;
        n.storage += sbase;
        n.name = t.name.empty() ? e.fqn : e.fqn + "." + t.name;
        std::vector<uint32_t> files;
        for (const DcpPiece& p : layout_->pieces[n.storage]) files.push_back(p.file);
        if (files.empty()) files.push_back(0);
        m.tensor_files.push_back(std::move(files));
        m.tensors.push_back(std::move(n));
      }
      ValuePtr v = b.root ? b.root->clone(options_.limits.max_pickle_depth) : Value::none();
      shift_tensors(v, tbase);
      place(root, e, std::move(v));
      continue;
    }
    // A global tensor: one storage, assembled from its chunks.
    StorageInfo si;
    si.key = e.fqn;
    si.record = e.fqn;
    si.dtype = e.dtype;
    uint64_t numel = 1;
    for (int64_t s : e.size) numel *= static_cast<uint64_t>(s);
    const size_t elsize = dtype_size(e.dtype);
    si.nbytes = mul(numel, elsize, e.fqn);
    std::vector<DcpPiece> pieces;
    std::vector<uint32_t> files;
    for (DcpChunk& c : e.chunks) {
      uint64_t vol = 1;
      for (int64_t s : c.sizes) vol *= static_cast<uint64_t>(s);
      if (!vol) continue;
      const Opened& b = opened_[j++];
      const size_t i = b.item;  // the storage item open_job found
      const DcpStorage* st = &md_.storage[i];
      const std::string& file = layout_->paths[item_file_[i]];
      if (!b.one_tensor)
        fail(ErrorCode::kUnsupported,
             "the chunk at " + dims(c.offsets) + " is stored as " + b.root +
                 ", not one tensor (a storage layout this reader does not know)",
             file, e.fqn, st->offset);
      if (b.dtype != e.dtype || b.shape != c.sizes)
        fail(ErrorCode::kCorrupt,
             "the chunk at " + dims(c.offsets) + " holds a " + std::string(dtype_name(b.dtype)) +
                 " tensor " + dims(b.shape) + "; .metadata says " +
                 std::string(dtype_name(e.dtype)) + " " + dims(c.sizes),
             file, e.fqn, st->offset);
      if (!b.raw)
        fail(ErrorCode::kUnsupported,
             "the chunk at " + dims(c.offsets) +
                 " is not stored as contiguous raw bytes in native order (a storage layout this "
                 "reader does not know)",
             file, e.fqn, st->offset);
      DcpPiece p;
      p.file = item_file_[i];
      p.file_offset = st->offset + b.offset;
      p.nbytes = b.nbytes;
      p.shape = e.size;
      p.offsets = std::move(c.offsets);
      p.sizes = std::move(c.sizes);
      if (std::find(files.begin(), files.end(), p.file) == files.end()) files.push_back(p.file);
      pieces.push_back(std::move(p));
    }
    const size_t s = m.storages.size();
    if (pieces.empty()) si.meta = numel != 0;  // nothing stored (an empty tensor)
    m.storages.push_back(std::move(si));
    layout_->pieces.push_back(std::move(pieces));
    place(root, e, Value::tensor(m.tensors.size()));
    TensorInfo t;
    t.name = std::move(e.fqn);  // the last use of the entry's name
    t.dtype = e.dtype;
    t.strides = contiguous_strides(e.size);
    t.shape = std::move(e.size);
    t.storage = s;
    if (files.empty()) files.push_back(0);
    m.tensor_files.push_back(std::move(files));
    m.tensors.push_back(std::move(t));
  }
  m.root = std::move(root);
}

}  // namespace

std::shared_ptr<CheckpointModel> open_dcp(const std::string& dir, const OpenOptions& options) {
  return Opener(dir, options).open();
}

}  // namespace ckpt::internal
