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

extern "C" void on_interrupt(int sig) {
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

void install_interrupt_cleanup() {
  g_stderr_tty = ::isatty(STDERR_FILENO) == 1;
  install_signal_cleanup(&on_interrupt);
}

}  // namespace ckpt::cli
