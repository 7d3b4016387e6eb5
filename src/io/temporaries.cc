#include "io/temporaries.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "ckpt/error.h"
#include "ckpt/sink.h"

namespace ckpt {
namespace io {
namespace {

// The registry. A slot's path is written only by the thread that holds the slot in kClaimed, and
// read by remove_temporaries_now() only once it has moved the slot to kCleaning itself, so a
// handler never reads a path that is being written. 128 slots of PATH_MAX bytes: static storage,
// of which only the pages of slots in use are ever touched.
enum State : int {
  kFree,      // unused
  kClaimed,   // owned by a creating thread; path not valid
  kCreating,  // path valid; the file or folder may or may not exist yet (O_EXCL create under way)
  kLive,      // path valid and created by us
  kCleaning,  // taken by remove_temporaries_now(); never handed back
};
constexpr int kSlots = 128;
constexpr size_t kPathMax = PATH_MAX;

struct Slot {
  std::atomic<int> state{kFree};
  pid_t tid = 0;  // the creating thread, valid from kCreating on
  bool folder = false;
  char path[kPathMax];
};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the registry is read from signal handlers");

Slot g_slots[kSlots];
// Set by remove_temporaries_now(): from then on no temporary is created.
std::atomic<bool> g_exiting{false};
// 0: remove_temporaries_now() has not run; 1: running; 2: done.
std::atomic<int> g_cleanup{0};

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void sleep_us(long us) {
  timespec ts{0, us * 1000};
  ::nanosleep(&ts, nullptr);
}

int64_t monotonic_ms() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Removes `name` under the folder `at` whatever it is: a file or link is unlinked, a folder is
// emptied (to 16 levels) and removed. Only system calls that are async-signal-safe (openat,
// getdents64, unlinkat, lseek, close) and a 2 KiB buffer per level on the stack.
void remove_tree(int at, const char* name, int depth) {
  const int fd = ::openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    ::unlinkat(at, name, 0);
    return;
  }
  alignas(8) char buf[2048];
  // Removing entries while reading the folder may make getdents skip some: read it again until a
  // pass finds nothing (bounded: an entry that cannot be removed is left).
  for (int pass = 0; pass < 64; ++pass) {
    ::lseek(fd, 0, SEEK_SET);
    bool any = false;
    for (;;) {
      const ssize_t n = ::getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const dirent64*>(buf + off);
        off += d->d_reclen;
        const char* c = d->d_name;
        if (c[0] == '.' && (c[1] == 0 || (c[1] == '.' && c[2] == 0))) continue;
        any = true;
        if ((d->d_type == DT_DIR || d->d_type == DT_UNKNOWN) && depth < 16)
          remove_tree(fd, c, depth + 1);
        else
          ::unlinkat(fd, c, 0);
      }
    }
    if (!any) break;
  }
  ::close(fd);
  ::unlinkat(at, name, AT_REMOVEDIR);
}

[[noreturn]] void shutting_down(const std::string& dir) {
  throw Error(ErrorCode::kIo,
              "cannot create a temporary: the process is ending (its temporaries were removed)",
              dir);
}

}  // namespace

std::string random_suffix() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static std::atomic<uint64_t> counter{0};
  uint64_t x = 0;
  if (::getrandom(&x, sizeof x, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof x)) {
    timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);
    x = static_cast<uint64_t>(ts.tv_nsec) ^ (static_cast<uint64_t>(ts.tv_sec) << 30) ^
        (static_cast<uint64_t>(::getpid()) << 40);
  }
  x += counter.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  std::string s(6, 'A');
  for (char& ch : s) {
    ch = kAlphabet[x % 62];
    x /= 62;
  }
  return s;
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
std::string base_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

Temporary create_temporary(const std::string& dir, const std::string& base, bool folder,
                           mode_t mode) {
  if (g_exiting.load()) shutting_down(dir);
  // The registry holds absolute paths: a program may change its working folder meanwhile.
  std::string abs_dir = dir;
  if (dir.empty() || dir[0] != '/') {
    char cwd[PATH_MAX];
    abs_dir = ::getcwd(cwd, sizeof cwd) ? std::string(cwd) + "/" + dir : std::string();
  }
  const std::string prefix = "/." + base + ".tmp-";
  Slot* s = nullptr;
  int slot = -1;
  if (!abs_dir.empty() && abs_dir.size() + prefix.size() + 6 < kPathMax) {
    for (int i = 0; i < kSlots && !s; ++i) {
      int expect = kFree;
      if (g_slots[i].state.compare_exchange_strong(expect, kClaimed)) {
        s = &g_slots[i];
        slot = i;
      }
    }
  }
  // Without a slot (128 temporaries at once, or a path too long) the temporary is still made,
  // unregistered: a signal then leaves it to the next writer's sweep.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = prefix + random_suffix();
    const std::string path = dir + name;
    if (s) {
      const std::string abs = abs_dir + name;
      std::memcpy(s->path, abs.c_str(), abs.size() + 1);
      s->folder = folder;
      s->tid = this_tid();
      // Registered before it exists. With remove_temporaries_now() setting g_exiting before it
      // reads the slots (both sequentially consistent), either this thread sees g_exiting, or
      // the cleanup sees kCreating and waits for the outcome (or removes the path itself when
      // it interrupted this very thread).
      s->state.store(kCreating);
      if (g_exiting.load()) {
        int expect = kCreating;
        s->state.compare_exchange_strong(expect, kFree);
        shutting_down(dir);
      }
    }
    int fd = -1;
    if (folder) {
      if (::mkdir(path.c_str(), mode) == 0) {
        fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
          const int err = errno;
          ::rmdir(path.c_str());
          errno = err;
        }
      }
    } else {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    }
    const int err = errno;
    if (fd >= 0) {
      if (s) {
        int expect = kCreating;
        s->state.compare_exchange_strong(expect, kLive);  // fails only when being removed
      }
      return {path, fd, slot};
    }
    if (s) {
      int expect = kCreating;
      if (!s->state.compare_exchange_strong(expect, kClaimed)) shutting_down(dir);
    }
    if (err != EEXIST) {
      if (s) s->state.store(kFree);
      throw Error(ErrorCode::kIo,
                  std::string("cannot create temporary ") + (folder ? "folder" : "file") + " in " +
                      dir + ": " + std::strerror(err),
                  dir);
    }
  }
  if (s) s->state.store(kFree);
  throw Error(ErrorCode::kIo, "cannot find a free temporary name in " + dir, dir);
}

int adopt_temporary(const std::string& path, bool folder) noexcept {
  if (g_exiting.load()) return -1;
  std::string abs = path;
  if (path.empty() || path[0] != '/') {
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) return -1;
    abs = std::string(cwd) + "/" + path;
  }
  if (abs.size() + 1 > kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expect = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expect, kClaimed)) continue;
    std::memcpy(g_slots[i].path, abs.c_str(), abs.size() + 1);
    g_slots[i].folder = folder;
    g_slots[i].tid = this_tid();
    g_slots[i].state.store(kLive);
    return i;
  }
  return -1;
}

void release_temporary(int slot) noexcept {
  if (slot < 0 || slot >= kSlots) return;
  int expect = kLive;
  g_slots[slot].state.compare_exchange_strong(expect, kFree);  // kCleaning: the cleanup has it
}

void sweep_stale_temporaries(const std::string& dir, const std::string& base) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const std::string prefix = "." + base + ".tmp-";
  const time_t now = ::time(nullptr);
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n.size() != prefix.size() + 6 || n.compare(0, prefix.size(), prefix) != 0) continue;
    const int fd = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) &&
        now - st.st_mtime >= 60 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (S_ISREG(st.st_mode))
        ::unlinkat(::dirfd(d), e->d_name, 0);
      else
        remove_tree(::dirfd(d), e->d_name, 0);
    }
    ::close(fd);
  }
  ::closedir(d);
}

}  // namespace io

void remove_temporaries_now() noexcept {
  io::g_exiting.store(true);
  int expect = 0;
  if (!io::g_cleanup.compare_exchange_strong(expect, 1)) {
    // Another call (another thread's signal handler) is at work: wait for it, so that neither
    // ends the process while the other still removes. Bounded, in case that call is the one
    // this thread interrupted.
    for (int i = 0; i < 5000 && io::g_cleanup.load() != 2; ++i) io::sleep_us(1000);
    return;
  }
  const pid_t me = io::this_tid();
  for (io::Slot& s : io::g_slots) {
    int st = s.state.load();
    if (st == io::kCreating && s.tid != me) {
      // Another thread is creating it right now: wait (briefly) for the outcome.
      const int64_t until = io::monotonic_ms() + 1000;
      while ((st = s.state.load()) == io::kCreating && io::monotonic_ms() < until) io::sleep_us(50);
    }
    if (st != io::kLive && st != io::kCreating) continue;
    if (!s.state.compare_exchange_strong(st, io::kCleaning)) continue;
    if (s.folder)
      io::remove_tree(AT_FDCWD, s.path, 0);
    else
      ::unlink(s.path);
  }
  io::g_cleanup.store(2);
}

namespace {
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void cleanup_and_reraise(int sig) {
  const int saved = errno;
  remove_temporaries_now();
  // Then the default action: the signal is blocked while this handler runs, so the raise takes
  // effect when it returns, and the process ends by the signal as it would have without us.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved;
}
}  // namespace

void install_signal_cleanup() { install_signal_cleanup(&cleanup_and_reraise); }

void install_signal_cleanup(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  ::sigemptyset(&sa.sa_mask);
  for (int s : kCleanupSignals) ::sigaddset(&sa.sa_mask, s);
  for (int s : kCleanupSignals) {
    struct sigaction old {};
    if (::sigaction(s, nullptr, &old) != 0) continue;
    // A signal the process was told to ignore (nohup, `cmd &` in a script) stays ignored, and a
    // handler the program installed stays: it calls remove_temporaries_now() itself.
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    ::sigaction(s, &sa, nullptr);
  }
}

}  // namespace ckpt
