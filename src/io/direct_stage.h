#pragma once
// Large writes of a file sink that is fsynced on commit, past the page cache (O_DIRECT): the
// bytes are copied into one of two aligned 4 MiB buffers, and a full buffer is written by a
// helper thread while the caller fills the other. A buffered write of a new file spends most of
// its time in the kernel's copy into fresh page-cache pages (~70% of a DCP -> bf16 conversion's
// CPU time here); a direct write hands the buffer to the device, and the fsync that follows
// anyway then finds nothing left to write back. The file's last partial block goes through the
// page cache. Durability is unchanged: the sink's commit still fsyncs the file (direct writes
// do not flush the device's cache nor the file's metadata).

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

namespace ckpt::io {

class DirectStage {
 public:
  // File offsets, lengths and buffers are multiples of this (every block device's sector).
  static constexpr uint64_t kAlign = 4096;
  static constexpr size_t kBuffer = 4 << 20;

  // Direct writes to `fd` from file offset `at` (a multiple of kAlign) on, or null (nothing
  // changed) where the file system does not take O_DIRECT (tmpfs among them: nothing to gain).
  static std::unique_ptr<DirectStage> start(int fd, uint64_t at, const std::string& path);
  ~DirectStage();  // waits for the write in flight; the file's flags as they were
  DirectStage(const DirectStage&) = delete;
  DirectStage& operator=(const DirectStage&) = delete;

  // Appends `bytes` to the file. Throws Error{kIo} naming the file and the offset (a failed
  // write of a full buffer shows here, or in finish()).
  void write(std::span<const std::byte> bytes);
  // Writes what is staged (the partial block at the end through the page cache) and leaves
  // direct mode; returns the file offset after the last byte. The sink writes on from there.
  uint64_t finish();

 private:
  DirectStage(int fd, uint64_t at, int flags, const std::string& path);
  void submit(size_t len);  // hands buf_[cur_] (len bytes, a multiple of kAlign) to the helper
  void wait_idle();         // the write in flight done; throws its error
  void loop();
  void write_at(const std::byte* p, size_t len, uint64_t off);  // on the helper thread

  const int fd_;
  const int flags_;  // the file's status flags before direct mode
  const std::string path_;
  std::unique_ptr<std::byte, void (*)(void*)> mem_;
  std::byte* buf_[2];
  int cur_ = 0;
  size_t fill_ = 0;     // bytes in buf_[cur_]
  uint64_t at_;         // the file offset of buf_[cur_]
  bool direct_ = true;  // false once the file system refused a direct write (EINVAL)

  std::mutex mu_;
  std::condition_variable cv_;
  const std::byte* job_ = nullptr;
  size_t job_len_ = 0;
  uint64_t job_off_ = 0;
  bool stop_ = false;
  int err_ = 0;  // errno of a failed write, at err_off_
  uint64_t err_off_ = 0;
  std::thread thread_;  // last: starts once the rest is initialized
};

}  // namespace ckpt::io
