#pragma once
// Where a conversion writes (docs/design/writers.md): the few outputs that really differ. The
// one write pipeline (convert.cc) makes one of them once everything that can be refused was
// refused, hands it to the writer, and commits it.
//
//   one file    a path (atomic file sink), a caller's sink, or an upload that only appends
//   upload      through a local temporary file (a writer that patches bytes already written)
//   folder      a folder that appears whole or not at all (dcp)
//   shard set   shards and their index (shard_files.h)

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/convert.h"
#include "formats/writer.h"

namespace ckpt::internal {

class ConvertOutput : public WriteOutput {
 public:
  // Commits what was written: sets r.bytes_written (and r.files, r.index where the output is
  // several files), then makes the last progress call (done == total == the bytes written).
  virtual void commit(ConvertReport& r) = 0;
};

// The one file `sink`; progress counted on it. `owned`: the sink the output owns (may be null
// when the caller owns `sink`).
std::unique_ptr<ConvertOutput> one_file_output(ByteSink& sink, std::unique_ptr<ByteSink> owned,
                                               uint64_t total, const ConvertOptions& o);
// A local file at `path` (ConvertOptions::atomic, fsync). `make_folders`: missing folders are
// made (and removed on failure), and r.files names the file (the one file of a shard set).
std::unique_ptr<ConvertOutput> file_output(const std::string& path, uint64_t total,
                                           const ConvertOptions& o, bool make_folders);
// An upload (ConvertOptions::remote) written to a temporary file in $TMPDIR first.
std::unique_ptr<ConvertOutput> upload_via_file(const std::string& url, uint64_t total,
                                               const ConvertOptions& o);
// A folder of files; progress is called once, at the commit.
std::unique_ptr<ConvertOutput> folder_output(const std::string& dir, const ConvertOptions& o);

}  // namespace ckpt::internal
