// A build without libcurl: URLs are told apart from paths (url.cc) but cannot be opened, and no
// S3 upload can start. Both refuse with Error{kUnsupported} saying what to install.

#include <string>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "util/features.h"

namespace ckpt {

SourcePtr open_url_source(const std::string& url, const RemoteOptions&) {
  throw internal::missing_feature("libcurl", "HTTP(S) and S3 need", redact_url(url));
}

std::unique_ptr<ByteSink> create_s3_sink(const std::string& url, const RemoteOptions&) {
  throw internal::missing_feature("libcurl", "HTTP(S) and S3 need", redact_url(url));
}

}  // namespace ckpt
