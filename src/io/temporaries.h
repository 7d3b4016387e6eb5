#pragma once
// The temporaries of atomic writers (FileSink's ".<name>.tmp-XXXXXX" files, FolderSink's folders
// of the same name) in one process-wide registry, so that remove_temporaries_now()
// (include/ckpt/sink.h) can remove them from a signal handler: fixed-size slots in static
// storage with atomic states, nothing allocated or locked on the handler's side.

#include <sys/types.h>

#include <string>

namespace ckpt::io {

struct Temporary {
  std::string path;  // "<dir>/.<base>.tmp-XXXXXX", as `dir` was given
  int fd = -1;       // a file: open O_RDWR; a folder: open O_RDONLY | O_DIRECTORY
  int slot = -1;     // registry slot, -1 when it could not be registered (all slots taken)
};

// Creates "<dir>/.<base>.tmp-XXXXXX" under a fresh name with O_EXCL (a regular file with `mode`,
// or a folder with `mode`; the umask applies), registered from before it exists until
// release_temporary(). The caller takes an exclusive flock on `fd` (the sign of a live writer,
// see sweep_stale_temporaries). Throws Error{kIo} naming `dir`, also once
// remove_temporaries_now() has run (the process is going down).
Temporary create_temporary(const std::string& dir, const std::string& base, bool folder,
                           mode_t mode);
// Registers `path` (a file or folder that exists or is about to) as if it were a temporary, so
// that remove_temporaries_now() removes it until release_temporary(): files renamed into place
// that are not yet part of a committed whole (the shards of a set before its index), a folder
// made for an output that has not appeared. -1 when it could not be registered.
int adopt_temporary(const std::string& path, bool folder) noexcept;
// Forgets a registered temporary: call it once the temporary was renamed away or removed.
void release_temporary(int slot) noexcept;

// Removes debris of writers that died before they could clean up (SIGKILL, power loss):
// ".<base>.tmp-XXXXXX" files and folders in `dir` that are older than a minute and whose flock
// can be taken (a live writer holds it). Best effort: any error leaves the entry alone.
void sweep_stale_temporaries(const std::string& dir, const std::string& base);

// Six random characters of [A-Za-z0-9], for a fresh name.
std::string random_suffix();

// "a/b" -> "a", "b" -> ".", "/b" -> "/"; and the last component.
std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);

}  // namespace ckpt::io
