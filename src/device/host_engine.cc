// HostCopyEngine: the CopyEngine of the unit tests. Each lane is a worker thread that runs its
// queued copies in order, so the pipeline above sees the same asynchrony, ordering and failures
// as with CUDA streams. "Device" memory is as out of the host's reach as a GPU's: an allocation
// is an address range reserved without access (PROT_NONE), backed by a host buffer only the
// engine's own copies reach (they translate device addresses to it). Code that reads device
// memory on the host faults here as it would on a GPU machine.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "device/copy_engine.h"

namespace ckpt::internal {

struct HostCopyEngine::State {
  HostEngineOptions options;
  mutable std::mutex mu;
  uint64_t staging_now = 0, staging_peak = 0, device_now = 0;
  struct Block {
    uint64_t size;
    std::byte* backing;
  };
  std::map<uintptr_t, Block> blocks;     // device address -> its backing (under mu)
  std::map<uintptr_t, uint64_t> shared;  // options.unified: allocation -> size (under mu)
  // The backing of device address `p` (inside an allocation of this engine), else `p` itself
  // (host memory: staging, a caller's buffer).
  std::byte* host_of(const std::byte* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return const_cast<std::byte*>(p);
    --it;
    if (a >= it->first + std::max<uint64_t>(it->second.size, 1)) return const_cast<std::byte*>(p);
    return it->second.backing + (a - it->first);
  }
  std::atomic<uint64_t> copies{0}, direct_bytes{0}, staging_calls{0};
  std::atomic<int> busy{0}, busy_peak{0};
};

namespace {

class HostSession : public CopySession {
 public:
  HostSession(std::shared_ptr<HostCopyEngine::State> st, int slots, int lanes)
      : st_(std::move(st)), pending_(static_cast<size_t>(slots), 0), lanes_(lanes) {
    queues_.resize(static_cast<size_t>(lanes));
    for (int l = 0; l < lanes; ++l) workers_.emplace_back([this, l] { run(l); });
  }
  ~HostSession() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void copy(int slot, std::byte* dst, const std::byte* src, uint64_t n) override {
    const uint64_t number = st_->copies.fetch_add(1) + 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pending_.at(static_cast<size_t>(slot));
      queues_[static_cast<size_t>(slot % lanes_)].push_back({slot, dst, src, n, number});
    }
    cv_.notify_all();
  }

  void wait(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_.at(static_cast<size_t>(slot)) == 0; });
    if (failure_) std::rethrow_exception(failure_);
  }

  void finish() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      for (uint64_t p : pending_)
        if (p) return false;
      return true;
    });
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  struct Job {
    int slot;
    std::byte* dst;
    const std::byte* src;
    uint64_t n, number;
  };

  void run(int lane) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queues_[static_cast<size_t>(lane)].empty(); });
      auto& q = queues_[static_cast<size_t>(lane)];
      if (q.empty()) return;  // stopping
      Job job = q.front();
      q.pop_front();
      const bool fail = failure_ != nullptr || job.number == st_->options.fail_at;
      lock.unlock();
      if (!fail) {
        int busy = st_->busy.fetch_add(1) + 1;
        for (int peak = st_->busy_peak.load();
             busy > peak && !st_->busy_peak.compare_exchange_weak(peak, busy);) {
        }
        if (st_->options.delay_us)
          std::this_thread::sleep_for(std::chrono::microseconds(st_->options.delay_us));
        std::memcpy(st_->host_of(job.dst), st_->host_of(job.src), job.n);
        st_->busy.fetch_sub(1);
      }
      lock.lock();
      if (fail && !failure_ && job.number == st_->options.fail_at)
        failure_ = std::make_exception_ptr(
            Error(ErrorCode::kIo, "host copy engine: injected failure").with_offset(job.number));
      --pending_[static_cast<size_t>(job.slot)];
      cv_.notify_all();
    }
  }

  std::shared_ptr<HostCopyEngine::State> st_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> pending_;
  std::vector<std::deque<Job>> queues_;
  std::vector<std::thread> workers_;
  std::exception_ptr failure_;
  int lanes_;
  bool stop_ = false;
};

}  // namespace

HostCopyEngine::HostCopyEngine(HostEngineOptions options) : state_(std::make_shared<State>()) {
  state_->options = options;
}
HostCopyEngine::~HostCopyEngine() = default;

std::shared_ptr<std::byte> HostCopyEngine::allocate(uint64_t bytes) {
  std::shared_ptr<State> st = state_;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (bytes > st->options.device_bytes - std::min(st->device_now, st->options.device_bytes))
      throw Error(ErrorCode::kLimitExceeded,
                  "host copy engine: out of device memory for " + std::to_string(bytes) + " bytes");
    st->device_now += bytes;
  }
  const uint64_t span = std::max<uint64_t>(bytes, 1);
  if (st->options.unified) {  // host memory the host may touch, as an integrated GPU's
    auto* p = static_cast<std::byte*>(::operator new(span, std::align_val_t(256)));
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->shared[reinterpret_cast<uintptr_t>(p)] = bytes;
    }
    return std::shared_ptr<std::byte>(p, [st, bytes](std::byte* q) {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->shared.erase(reinterpret_cast<uintptr_t>(q));
        st->device_now -= bytes;
      }
      ::operator delete(q, std::align_val_t(256));
    });
  }
  void* reserved =
      ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->device_now -= bytes;
    throw Error(ErrorCode::kLimitExceeded,
                "host copy engine: cannot reserve " + std::to_string(bytes));
  }
  auto* p = static_cast<std::byte*>(reserved);
  auto* backing = static_cast<std::byte*>(::operator new(span, std::align_val_t(256)));
  {
    std::lock_guard<std::mutex> lock(st->mu);
    st->blocks[reinterpret_cast<uintptr_t>(p)] = {bytes, backing};
  }
  return std::shared_ptr<std::byte>(p, [st, bytes, span, backing](std::byte* q) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->blocks.erase(reinterpret_cast<uintptr_t>(q));
      st->device_now -= bytes;
    }
    ::operator delete(backing, std::align_val_t(256));
    ::munmap(q, span);
  });
}

std::shared_ptr<std::byte> HostCopyEngine::staging(uint64_t bytes) {
  std::shared_ptr<State> st = state_;
  const uint64_t call = ++st->staging_calls;
  if (st->options.on_staging) st->options.on_staging(call);
  {
    std::lock_guard<std::mutex> lock(st->mu);
    st->staging_now += bytes;
    st->staging_peak = std::max(st->staging_peak, st->staging_now);
  }
  auto* p =
      static_cast<std::byte*>(::operator new(std::max<uint64_t>(bytes, 1), std::align_val_t(4096)));
  return std::shared_ptr<std::byte>(p, [st, bytes](std::byte* q) {
    ::operator delete(q, std::align_val_t(4096));
    std::lock_guard<std::mutex> lock(st->mu);
    st->staging_now -= bytes;
  });
}

std::unique_ptr<CopySession> HostCopyEngine::start(int slots, int lanes) {
  return std::make_unique<HostSession>(state_, slots, std::max(1, lanes));
}

void HostCopyEngine::to_host(std::byte* dst, const std::byte* src, uint64_t n) {
  std::memcpy(state_->host_of(dst), state_->host_of(src), n);
}
void HostCopyEngine::to_device(std::byte* dst, const std::byte* src, uint64_t n) {
  std::memcpy(state_->host_of(dst), state_->host_of(src), n);
}
bool HostCopyEngine::owns(const std::byte* p) const { return state_->host_of(p) != p; }
bool HostCopyEngine::unified() const { return state_->options.unified; }
bool HostCopyEngine::host_accessible(const std::byte* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->shared.upper_bound(a);
  if (it == state_->shared.begin()) return false;
  --it;
  return a < it->first + std::max<uint64_t>(it->second, 1);
}

uint64_t HostCopyEngine::free_bytes() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->options.free_bytes - std::min(state_->device_now, state_->options.free_bytes);
}

namespace {
thread_local int fake_current_device = 0;
}
int HostCopyEngine::current_device() { return fake_current_device; }
void HostCopyEngine::set_current_device(int index) { fake_current_device = index; }
uint64_t HostCopyEngine::cached_staging() const { return 0; }
uint64_t HostCopyEngine::release_staging() { return 0; }

namespace {

// pread straight into the "device" memory.
class HostDirectFile : public DirectFile {
 public:
  // An O_DIRECT descriptor (what a load passes, as cuFile wants it) is opened again without:
  // pread into the engine's unaligned buffers needs the page cache.
  HostDirectFile(int fd, std::shared_ptr<HostCopyEngine::State> st) : fd_(fd), st_(std::move(st)) {
    if (int fl = ::fcntl(fd, F_GETFL); fl >= 0 && (fl & O_DIRECT)) {
      std::string self = "/proc/self/fd/" + std::to_string(fd);
      if ((own_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC)) >= 0) fd_ = own_;
    }
  }
  ~HostDirectFile() override {
    if (own_ >= 0) ::close(own_);
  }
  void read(uint64_t offset, std::byte* dst, uint64_t n) override {
    if (st_->options.direct_fails)
      throw Error(ErrorCode::kIo, "direct read: injected failure", {}, {}, offset);
    for (uint64_t done = 0; done < n;) {
      ssize_t r =
          ::pread(fd_, st_->host_of(dst) + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error(ErrorCode::kIo,
                    r < 0 ? std::string("direct read: ") + std::strerror(errno)
                          : std::string("direct read: end of file"),
                    {}, {}, offset + done);
      done += static_cast<uint64_t>(r);
    }
    st_->direct_bytes += n;
  }

 private:
  int fd_, own_ = -1;
  std::shared_ptr<HostCopyEngine::State> st_;
};

}  // namespace

std::unique_ptr<DirectFile> HostCopyEngine::open_direct(int fd, std::string& why) {
  why = direct_unavailable();
  if (!why.empty()) return nullptr;
  return std::make_unique<HostDirectFile>(fd, state_);
}
std::string HostCopyEngine::direct_unavailable() {
  return state_->options.direct ? "" : "host engine without direct reads (test)";
}
uint64_t HostCopyEngine::direct_bytes() const { return state_->direct_bytes.load(); }

uint64_t HostCopyEngine::staging_calls() const { return state_->staging_calls.load(); }
uint64_t HostCopyEngine::staging_peak() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->staging_peak;
}
uint64_t HostCopyEngine::device_in_use() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->device_now;
}
uint64_t HostCopyEngine::copies() const { return state_->copies.load(); }
int HostCopyEngine::max_lanes_busy() const { return state_->busy_peak.load(); }

}  // namespace ckpt::internal
