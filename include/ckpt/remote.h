#pragma once
// Objects named by URL: http://host/path, https://host/path, s3://bucket/key.
// A URL source is a ByteSource over ranged GETs (libcurl): several requests in flight for a
// large read, small metadata reads served from a block cache, the object's ETag and size pinned by
// the first response and every later range sent with If-Match (an object replaced mid-read is an
// error, never a mix of two versions). Options: RemoteOptions (include/ckpt/options.h).
// Errors name the URL without credentials or query string: kNotFound (404), kAuth (401/403),
// kTruncated (a range past the end), kIo (anything else, after the retries; the HTTP status
// and the range are in the message).
// Thread-safe: a URL source serves concurrent reads (its block cache and connection pool are
// locked); an S3 sink, like every ByteSink, has one writer at a time (ckpt/sink.h).
// Every later response is also compared with the first one's length, ETag and Last-Modified (a
// server that ignores If-Match or drops a validator fails the read too); requests and redirects
// use http and https only; a refused response is abandoned at its first byte.

#include <memory>
#include <string>

#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/source.h"

namespace ckpt {

// True for "http://", "https://" and "s3://" (case-insensitive scheme).
bool is_url(const std::string& path);

// A source over the object at `url` (one request: a suffix range that pins size and validators
// and keeps the object's last bytes for the openers; for a server that ignores Range and
// RemoteOptions::download_whole, the whole object into a temporary file). Calls
// options.on_note, on this thread, for what the user should know. Throws Error as above.
SourcePtr open_url_source(const std::string& url, const RemoteOptions& options = {});

// A URL source for a URL, else a file (mapped when `mmap`): what Checkpoint::open(path) uses.
SourcePtr open_source(const std::string& path_or_url, bool mmap, const RemoteOptions& options = {});

// An S3 multipart upload to "s3://bucket/key": parts of options.chunk_size (at least 5 MiB)
// are sent as the bytes come, up to options.connections at once, so memory stays near
// connections x chunk_size. commit() completes the upload (the object appears whole then);
// destruction without commit() aborts it. patch() of bytes already sent is refused
// (Error{kUnsupported}); writers that patch (the torch zip writer) cannot stream to S3, and
// convert() writes those through a local temporary. Throws Error like a URL source.
std::unique_ptr<ByteSink> create_s3_sink(const std::string& url, const RemoteOptions& options = {});

// The name a URL is shown by (no credentials, no query string: no password, no presigned
// signature). Every output of ckpt shows URLs this way. A path (no "://") is returned unchanged.
std::string redact_url(const std::string& url);

}  // namespace ckpt
