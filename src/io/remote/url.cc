// The parts of ckpt/remote.h that need no libcurl: telling a URL from a path, showing a URL
// without its secrets, and open_source() (a path opens as a file in every build).

#include <cctype>
#include <string>

#include "ckpt/remote.h"

namespace ckpt {

bool is_url(const std::string& path) {
  auto starts = [&](const char* p) {
    size_t n = std::char_traits<char>::length(p);
    if (path.size() < n) return false;
    for (size_t i = 0; i < n; ++i)
      if (std::tolower(static_cast<unsigned char>(path[i])) != p[i]) return false;
    return true;
  };
  return starts("http://") || starts("https://") || starts("s3://");
}

std::string redact_url(const std::string& url) {
  if (url.find("://") == std::string::npos) return url;  // a path
  std::string u = url;
  size_t q = u.find_first_of("?#");
  if (q != std::string::npos) u = u.substr(0, q) + "?...";
  size_t scheme = u.find("://");
  if (scheme == std::string::npos) return u;
  size_t host = scheme + 3;
  size_t slash = u.find('/', host);
  size_t at = u.rfind('@', slash == std::string::npos ? u.size() : slash);
  if (at != std::string::npos && at >= host) u = u.substr(0, host) + u.substr(at + 1);
  return u;
}

SourcePtr open_source(const std::string& path, bool mmap, const RemoteOptions& options) {
  if (is_url(path)) return open_url_source(path, options);
  return mmap ? open_mmap_source(path) : open_file_source(path);
}

}  // namespace ckpt
