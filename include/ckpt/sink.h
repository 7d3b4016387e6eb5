#pragma once
// ByteSink: where writers put bytes. Sequential writes, positional patches of bytes already
// written, and an atomic commit. Two optional speed-ups with sequential defaults, so a sink need
// not implement them: reserve() (a size hint) and write_sliced() (a large block written in slices,
// possibly from two threads, with a callback per slice for the caller's checksum).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ckpt {

// Thread-safety: a sink is used by one writer at a time (write_sliced() may use a second thread
// internally, and says so); different sinks are independent.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual const std::string& name() const = 0;
  // Appends bytes. Throws Error{kIo}.
  virtual void write(std::span<const std::byte> bytes) = 0;
  void write(std::string_view s) {
    write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }
  // Overwrites bytes already written at [offset, offset + bytes.size()). Throws Error{kIo} or
  // Error{kInvalidArgument} when the range was not written yet.
  virtual void patch(uint64_t offset, std::span<const std::byte> bytes) = 0;
  // Bytes written so far.
  virtual uint64_t position() const = 0;

  // Hint: about `size` more bytes are about to be appended. A file sink preallocates them
  // (fallocate, keeping the size), which makes ext4's page-cache writes ~1.5x faster than its
  // delayed allocation; other sinks ignore it. It changes no content: reserving more than is then
  // written only leaves blocks allocated past the end. Throws Error{kIo} when there is no room.
  virtual void reserve(uint64_t size) { (void)size; }

  // Called by write_sliced() on each slice, on the thread that writes it, before it is written:
  // `index` numbers the slices of the block from 0, `offset` is the slice's offset in the block.
  using SliceVisitor =
      std::function<void(size_t index, uint64_t offset, std::span<const std::byte> slice)>;
  // Appends `bytes` like write(), cut into slices of at most `slice` bytes, calling `visit` on each
  // just before writing it, so a caller can checksum a slice while it is in cache. The cuts fall
  // where position() is a multiple of `slice` (a file's page-cache pages are then written whole),
  // so the first and the last slice may be shorter: there are at most size / slice + 2.
  // A sink may write the slices of a large block from two threads at once (a file sink does, which
  // overlaps one thread's checksum with the other's write), so `visit` must be safe to call
  // concurrently on different slices; each slice is visited once, and the slices one thread
  // visits come in increasing order. If `visit` or a write throws, the first exception is
  // rethrown once no thread is still at work. The default visits and writes the slices in order
  // on the calling thread. Throws Error{kInvalidArgument} if `slice` is 0, else what write() does.
  virtual void write_sliced(std::span<const std::byte> bytes, size_t slice,
                            const SliceVisitor& visit);

  // Makes the result visible (for a file: fsync, rename over the target, fsync the folder).
  // Nothing is visible under the target name before this returns.
  virtual void commit() = 0;
};

struct FileSinkOptions {
  bool atomic = true;  // write "<dir>/.<name>.tmp-XXXXXX", rename on commit
  bool fsync = true;   // fsync file and folder on commit
  // Mode 0600 (key files): only the owner may read it, from its creation on. Else 0666 & ~umask,
  // or (atomic) the permission bits of the file it replaces.
  bool owner_only = false;
  // false: never replace an existing file (key files): commit() (or, when not atomic, the
  // creation) throws Error{kInvalidArgument} naming the file when one exists by then, and leaves
  // it as it is. Atomic sinks use renameat2(RENAME_NOREPLACE), else link() + unlink().
  bool replace = true;
};
// A file sink. If destroyed without commit(), the temporary file is removed and the target is
// untouched. Throws Error{kIo}.
std::unique_ptr<ByteSink> create_file_sink(const std::string& path, FileSinkOptions options = {});

// A folder of files that appears whole or not at all: the files are written into a new sibling
// folder "<parent>/.<name>.tmp-XXXXXX", and commit() renames it into place. Missing parents are
// created. A target that exists must be a folder (not a link to one); an empty one is replaced;
// a non-empty one is refused (Error{kInvalidArgument}) unless `replace`, which swaps the new
// folder in with one renameat2(RENAME_EXCHANGE) and then removes the old one whole (where the
// file system cannot exchange, the old folder is first renamed aside to ".<name>.old-XXXXXX":
// for a moment there is no folder at the path, never a partial one). Destroyed without commit(),
// the temporary folder is removed and the target is untouched.
struct FolderSinkOptions {
  bool replace = false;  // replace a non-empty existing folder, whole
  bool fsync = true;     // on commit: syncfs the files, fsync the folder and its parent
};
class FolderSink {
 public:
  virtual ~FolderSink() = default;
  // The target folder, as given.
  virtual const std::string& path() const = 0;
  // A new file in the folder: `name` is one path component. Commit it (a plain, non-atomic file
  // sink: the folder is the unit) before the folder's commit(). Throws Error{kInvalidArgument}
  // for a name that is not one component, else what create_file_sink() does.
  virtual std::unique_ptr<ByteSink> create(const std::string& name) = 0;
  // Renames the folder into place (above). Throws Error{kIo}, or Error{kInvalidArgument} when a
  // non-empty folder appeared at the path meanwhile and `replace` is off.
  virtual void commit() = 0;
};
std::unique_ptr<FolderSink> create_folder_sink(const std::string& path,
                                               FolderSinkOptions options = {});

// Interruption. Every temporary of a file sink (atomic) or folder sink is registered in a
// process-wide table from before it exists until it is renamed into place or removed.
// remove_temporaries_now() removes every one still registered. It is async-signal-safe (fixed
// slots, atomic flags, only system calls: no allocation, no lock), for a signal handler of a
// process that is about to end: once called, creating a temporary fails with Error{kIo}, and a
// writer still at work fails at its commit. A temporary created while 128 others are live is
// not registered (it is left to the next writer's sweep, like one of a SIGKILLed process).
void remove_temporaries_now() noexcept;
// Installs a handler for SIGINT, SIGTERM and SIGHUP that calls remove_temporaries_now() and then
// ends the process by the same signal (default action). Signals whose disposition is not the
// default are left alone: an ignored one (nohup) stays ignored, and a program with handlers of
// its own calls remove_temporaries_now() from them. The second form installs `handler` under the
// same rules, with the three signals blocked while it runs (the ckpt CLI's exits 128 + signal).
void install_signal_cleanup();
void install_signal_cleanup(void (*handler)(int));

// A sink that counts the bytes written through it for a progress callback and passes everything
// on to `inner` (reserve() and write_sliced() included, so that the inner sink's fast paths stay
// in use): what convert() reports through ConvertOptions::progress, what the CLI's progress line
// and the Python module's progress= callbacks draw. `fn(done, total)` runs on the thread that
// made the sink only (never on a sink's helper thread), at most once per `every`, with `done`
// never going back and `total` raised to `done` when the bytes pass it; a large write is passed
// on in 8 MiB pieces so that progress moves through it. finish() makes the last call, with
// done == total == base + position(). `base`: bytes written before this sink (earlier files of
// one output), added to what it reports. An exception from `fn` propagates from the write.
class ProgressSink final : public ByteSink {
 public:
  using Callback = std::function<void(uint64_t done, uint64_t total)>;
  ProgressSink(ByteSink& inner, uint64_t total, Callback fn,
               std::chrono::steady_clock::duration every = std::chrono::milliseconds(100),
               uint64_t base = 0);

  const std::string& name() const override { return inner_.name(); }
  void write(std::span<const std::byte> bytes) override;
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    inner_.patch(offset, bytes);
  }
  uint64_t position() const override { return inner_.position(); }
  void reserve(uint64_t size) override { inner_.reserve(size); }
  void write_sliced(std::span<const std::byte> bytes, size_t slice,
                    const SliceVisitor& visit) override;
  void commit() override { inner_.commit(); }
  void finish();

 private:
  void tick(uint64_t done);

  ByteSink& inner_;
  const uint64_t total_;
  const uint64_t base_;
  const Callback fn_;
  const std::chrono::steady_clock::duration every_;
  const std::thread::id caller_;
  std::chrono::steady_clock::time_point last_;
  uint64_t reported_ = 0;
};

// A sink in memory; commit() is a no-op. bytes() is valid until the sink dies.
class MemorySink final : public ByteSink {
 public:
  explicit MemorySink(std::string name = "<memory>") : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  void write(std::span<const std::byte> bytes) override;
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override;
  uint64_t position() const override { return buf_.size(); }
  void commit() override {}
  const std::vector<std::byte>& bytes() const { return buf_; }
  std::vector<std::byte> take() { return std::move(buf_); }

 private:
  std::string name_;
  std::vector<std::byte> buf_;
};

}  // namespace ckpt
