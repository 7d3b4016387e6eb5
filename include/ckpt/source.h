#pragma once
// ByteSource: random-access bytes (a file through pread, an mmap, memory, HTTP and S3).
// Thread-safe: every method may be called from several threads at once.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ckpt {

// Bytes with an owner that keeps them alive. The span stays valid as long as `owner` (or a copy
// of it) lives.
struct Bytes {
  std::span<const std::byte> data;
  std::shared_ptr<const void> owner;

  size_t size() const noexcept { return data.size(); }
  const std::byte* begin() const noexcept { return data.data(); }
  std::string_view str() const noexcept {
    return {reinterpret_cast<const char*>(data.data()), data.size()};
  }
};

struct ReadRequest {
  uint64_t offset = 0;
  std::span<std::byte> dst;
};

// Counters that tests and benchmarks read (not reset by reads).
struct SourceStats {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes{0};
  // Network requests made (remote sources; retries included). 0 for local sources.
  std::atomic<uint64_t> requests{0};
};

// Bytes read through every ByteSource of this process so far: the sum of their
// SourceStats::bytes (views of a mapping counted when handed out), never reset. Tests and
// benchmarks compare it before and after a load (how many bytes a rank read).
uint64_t process_bytes_read() noexcept;
namespace internal {
void count_process_bytes(uint64_t bytes) noexcept;
}

class ByteSource;

// The optional capability of a source whose bytes all sit in this process's memory (a file
// mapping, a buffer): zero-copy views instead of reads. ByteSource::in_memory() returns it, or
// null for a source without it (a pread file, a remote object, most sources of your own).
class InMemory {
 public:
  virtual ~InMemory() = default;
  // The source's first byte; views into it live as long as owner() (or a copy of it) does.
  virtual const std::byte* base() const = 0;
  virtual std::shared_ptr<const void> owner() const = 0;
  // True when callers may write base(): a private copy-on-write file mapping opened with
  // `writable_views` (open_mmap_source). A write copies the page for this process only: the file
  // and other processes never see it; later reads of this source (and views of the same bytes)
  // do. Storages viewing such memory say Storage::writable.
  virtual bool writable() const { return false; }
  // Says that [offset, offset + len) will not be read again soon: a file mapping drops those
  // pages from the process (they stay in the page cache, so a later read is a cheap fault).
  // Openers call it for metadata they have parsed (data.pkl), so that opening does not leave
  // megabytes of mapped metadata in the process's resident set.
  virtual void drop(uint64_t offset, uint64_t len) const {
    (void)offset;
    (void)len;
  }
  // For a file mapping: a pread source over the same open file (not reopened by name, so a file
  // replaced since is not read), for copies that should not make the mapping's pages resident.
  virtual std::shared_ptr<const ByteSource> pread_twin() const { return nullptr; }
};

// Random-access bytes. What every source does is three methods: size(), name() and read_into()
// (read() and read_batch() have defaults built on read_into). The rest is optional: in_memory()
// for zero-copy views, preferred_read_size() for sources that want large reads. A source of your
// own implements the three.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // The name used in errors: the path, or "<memory>".
  virtual const std::string& name() const = 0;

  // Copies [offset, offset + dst.size()) into dst. Throws Error{kTruncated} when the range passes
  // the end, Error{kIo} on an OS error. Counts one read.
  virtual void read_into(uint64_t offset, std::span<std::byte> dst) const = 0;

  // Returns the bytes of [offset, offset + len): a view into the source's own memory when it has
  // one (in_memory()), else a fresh buffer. Throws like read_into. Counts one read.
  virtual Bytes read(uint64_t offset, uint64_t len) const;

  // Several reads; a remote source may serve them with a few parallel requests. Default: in turn.
  virtual void read_batch(std::span<const ReadRequest> requests) const;

  // Optional: the source's memory, when all of it is in this process (InMemory above).
  virtual const InMemory* in_memory() const { return nullptr; }

  // Optional: the read size that keeps the source busy. A remote source answers its connections
  // times its chunk size, and loaders then read in pieces of that size (one read = several
  // parallel requests) instead of 1 MiB slices. 0 (local sources): the loaders' own sizes.
  virtual uint64_t preferred_read_size() const { return 0; }

  // Shorthands over in_memory(): nullptr / null / false / nothing / null without it.
  const std::byte* memory() const {
    const InMemory* m = in_memory();
    return m ? m->base() : nullptr;
  }
  std::shared_ptr<const void> memory_owner() const {
    const InMemory* m = in_memory();
    return m ? m->owner() : nullptr;
  }
  bool memory_writable() const {
    const InMemory* m = in_memory();
    return m && m->writable();
  }
  void release(uint64_t offset, uint64_t len) const {
    if (const InMemory* m = in_memory()) m->drop(offset, len);
  }
  std::shared_ptr<const ByteSource> pread_twin() const {
    const InMemory* m = in_memory();
    return m ? m->pread_twin() : nullptr;
  }

  SourceStats& stats() const { return stats_; }

 protected:
  void count(uint64_t bytes) const {
    stats_.reads.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes.fetch_add(bytes, std::memory_order_relaxed);
    internal::count_process_bytes(bytes);
  }
  // count() for a source that reads through another source (a window of a file, a cache of open
  // files): this source's stats only, since the source it reads from counts the bytes for the
  // process (process_bytes_read() counts each byte read from storage once).
  void count_forwarded(uint64_t bytes) const {
    stats_.reads.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Throws Error{kTruncated} naming this source if [offset, offset+len) is not inside it.
  void check_range(uint64_t offset, uint64_t len) const;

 private:
  mutable SourceStats stats_;
};

using SourcePtr = std::shared_ptr<const ByteSource>;

// A file read with pread. Only regular files are opened (opened with O_NONBLOCK, so that a FIFO
// cannot block the call): a directory, FIFO, device or socket is Error{kInvalidArgument}. Throws
// Error{kNotFound} or Error{kIo} as well.
SourcePtr open_file_source(const std::string& path);
// A file mapped with MAP_PRIVATE, PROT_READ|PROT_WRITE and MAP_NORESERVE: copy-on-write memory,
// charged only for pages a caller writes. With `writable_views` the mapping is handed out as
// writable (memory_writable(); views of it are Storage::writable): a caller may change tensors in
// place, and the writes stay in this process, never reaching the file. Without it views are
// read-only by contract (Storage::writable false). The mapping lives while any view's owner
// (memory_owner()) does, also after the file is deleted or renamed over; truncating the file in
// place meanwhile is undefined, as for any mapping. Throws like open_file_source.
SourcePtr open_mmap_source(const std::string& path, bool writable_views = false);
// Bytes in memory; `name` is used in errors.
SourcePtr memory_source(std::vector<std::byte> bytes, std::string name = "<memory>");
SourcePtr memory_source(std::string_view bytes, std::string name = "<memory>");

}  // namespace ckpt
