#pragma once
// The data files of a DCP folder, as sources. A folder may hold thousands of them (one per rank
// of a large job, or `ckpt convert --dcp-files 4096`), more than a process may have open (a soft
// RLIMIT_NOFILE of 1024 is common, and raising it to the hard limit does not help where the
// hard limit is as low). So a local data file is opened once to learn its size (and that it
// exists), then read through a small cache of open descriptors shared by the folder's files:
// the least recently used is closed when the cache is full, and a file is opened again by name
// when it is read after that. A file that changed size since the folder was opened is refused
// (Error{kIo}). A URL's data files hold no descriptors and are opened as any URL.

#include <cstddef>
#include <memory>
#include <string>

#include "ckpt/options.h"
#include "ckpt/source.h"

namespace ckpt::internal {

class DataFiles;

// A cache for the data files of one folder: at most `capacity` open at once (0: a quarter of
// the soft RLIMIT_NOFILE, at least 16 and at most 512), plus those being read at the moment.
std::shared_ptr<DataFiles> data_files(size_t capacity = 0);

// Opens a data file (a path or URL) through the cache. Throws what open_source throws.
SourcePtr open_data_file(const std::shared_ptr<DataFiles>& files, const std::string& path,
                         const RemoteOptions& remote);

}  // namespace ckpt::internal
