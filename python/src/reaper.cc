// Background frees of large checkpoints (binding.h: reap, LoadScope, drain_reaped).
//
// Why it stays: a load's result no longer needs its Checkpoint (the tensors hold the memory's
// owners), and freeing a 20,000-tensor checkpoint (object tree, tensor and record tables,
// ~100,000 small blocks) takes ~3 ms, ~10% of an mmap load of that file, which ckpt.load would
// spend after its tensors are made. The thread waits (at most kMaxWait) until no load runs:
// those frees beside a load's own allocations (both in malloc's main arena) made a load that
// followed at once up to twice as slow. drain_reaped() (atexit) waits for the threads; a forked
// child never waits for its parent's.

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "binding.h"

namespace ckpt::py {
namespace {

struct Reaped {
  std::mutex mu;
  std::condition_variable done;
  size_t running = 0;
  pid_t pid = 0;
  size_t loads = 0;  // LoadScopes alive
  std::condition_variable idle;
};
constexpr auto kMaxWait = std::chrono::seconds(2);

Reaped& reaped() {
  static Reaped* r = new Reaped;  // never destroyed: a reaping thread may outlive static dtors
  return *r;
}

}  // namespace

size_t& reap_threshold() {
  static size_t n = 1000;  // tensors; _ckpt.set_reap_threshold changes it (benchmarks)
  return n;
}

void reap(Checkpoint&& c) {
  Reaped& r = reaped();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.pid != getpid()) {  // first use, or a forked child: its parent's threads are not here
      r.pid = getpid();
      r.running = 0;
    }
    ++r.running;
  }
  auto* doomed = new Checkpoint(std::move(c));
  try {
    std::thread([doomed] {
      {
        Reaped& r = reaped();
        std::unique_lock<std::mutex> lock(r.mu);
        r.idle.wait_for(lock, kMaxWait, [&] { return r.loads == 0; });
      }
      delete doomed;
      Reaped& r = reaped();
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.pid == getpid() && r.running > 0) --r.running;
      r.done.notify_all();
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: free it here
    delete doomed;
    std::lock_guard<std::mutex> lock(r.mu);
    --r.running;
  }
}

LoadScope::LoadScope() {
  Reaped& r = reaped();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.loads;
}

LoadScope::~LoadScope() {
  Reaped& r = reaped();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.loads > 0) --r.loads;
  if (r.loads == 0) r.idle.notify_all();
}

void drain_reaped() {
  pyb::gil_scoped_release nogil;
  Reaped& r = reaped();
  std::unique_lock<std::mutex> lock(r.mu);
  if (r.pid != getpid()) return;
  r.done.wait_for(lock, std::chrono::seconds(30), [&] { return r.running == 0; });
}

}  // namespace ckpt::py
