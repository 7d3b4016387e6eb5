// Interruption: on SIGINT, SIGTERM or SIGHUP every command removes its temporaries (an atomic
// writer's ".<name>.tmp-XXXXXX" file, extract's temporary folder) and exits 128 + the signal:
// 130, 143, 129. Nothing partial is left, and a destination that existed is untouched.

#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "common.h"

namespace ckpt::cli {
namespace {

bool g_stderr_tty = false;
volatile sig_atomic_t g_defer = 0, g_deferred = 0;

extern "C" void on_interrupt(int sig) {
  if (g_defer && !g_deferred) {
    // An upload in progress: let the command abort it (interrupted_by() is polled), once.
    g_deferred = sig;
    const char* m = "\nckpt: interrupted; aborting the upload (again to end at once)\n";
    ssize_t ignored = ::write(STDERR_FILENO, g_stderr_tty ? m : m + 1, std::strlen(m) - 1);
    (void)ignored;
    return;
  }
  remove_temporaries_now();
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  // write(2) only: async-signal-safe. On a terminal, first end a progress line or the "^C".
  char line[96] = "\nckpt: interrupted by ";
  const char* start = g_stderr_tty ? line : line + 1;
  std::strcat(line, name);
  std::strcat(line, "; temporary files removed\n");
  ssize_t ignored = ::write(STDERR_FILENO, start, std::strlen(start));
  (void)ignored;
  ::_exit(128 + sig);
}

}  // namespace

void defer_interrupts() { g_defer = 1; }
int interrupted_by() { return g_deferred; }

void install_interrupt_cleanup() {
  g_stderr_tty = ::isatty(STDERR_FILENO) == 1;
  install_signal_cleanup(&on_interrupt);
}

}  // namespace ckpt::cli
