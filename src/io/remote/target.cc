#include "io/remote/target.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "ckpt/error.h"
#include "ckpt/remote.h"

namespace ckpt::internal {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string ca_file_of(const RemoteOptions& o) {
  if (!o.ca_file.empty()) return o.ca_file;
  for (const char* name : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"})
    if (std::string v = env(name); !v.empty()) return v;
  return {};
}

std::string trim(std::string s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// The key = value pairs of one [section] of an INI file (~/.aws/credentials, ~/.aws/config).
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& want) {
  std::map<std::string, std::string> out;
  std::ifstream f(path);
  if (!f) return out;
  std::string line, section;
  for (int lines = 0; lines < 100000 && std::getline(f, line); ++lines) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    if (section != want) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* env_name, const char* rel) {
  std::string p = env(env_name);
  if (!p.empty()) return p;
  std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

}  // namespace

std::string s3_encode_key(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_ALL); });
}

Target resolve_target(const std::string& url, const RemoteOptions& o) {
  Target t;
  t.name = redact_url(url);
  const std::string lower = [&] {
    std::string s = url.substr(0, url.find("://"));
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }();
  if (lower == "http" || lower == "https") {
    if (url.size() <= lower.size() + 3)
      throw Error(ErrorCode::kInvalidArgument, "a URL without a host", t.name);
    t.url = url;
    t.ca_file = ca_file_of(o);
    return t;
  }
  if (lower != "s3")
    throw Error(ErrorCode::kInvalidArgument, "not a URL ckpt reads (http, https, s3)", t.name);
  t.s3 = true;
  const std::string rest = url.substr(5);
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= rest.size())
    throw Error(ErrorCode::kInvalidArgument, "an S3 URL is s3://bucket/key", t.name);
  const std::string bucket = rest.substr(0, slash), key = rest.substr(slash + 1);
  for (char c : bucket)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'))
      throw Error(ErrorCode::kInvalidArgument, "not a bucket name: " + bucket, t.name);

  std::string profile = !o.profile.empty() ? o.profile : env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  const auto creds =
      ini_section(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), profile);
  const auto config = ini_section(home_file("AWS_CONFIG_FILE", ".aws/config"),
                                  profile == "default" ? "default" : "profile " + profile);
  auto get = [](const std::map<std::string, std::string>& m, const char* k) {
    auto it = m.find(k);
    return it == m.end() ? std::string() : it->second;
  };
  // Credentials: options, then the environment, then the profile (one source for all three).
  if (!o.access_key_id.empty()) {
    t.key_id = o.access_key_id;
    t.secret = o.secret_access_key;
    t.token = o.session_token;
  } else if (!env("AWS_ACCESS_KEY_ID").empty()) {
    t.key_id = env("AWS_ACCESS_KEY_ID");
    t.secret = env("AWS_SECRET_ACCESS_KEY");
    t.token = env("AWS_SESSION_TOKEN");
  } else {
    t.key_id = get(creds, "aws_access_key_id");
    t.secret = get(creds, "aws_secret_access_key");
    t.token = get(creds, "aws_session_token");
    if (t.key_id.empty()) {
      t.key_id = get(config, "aws_access_key_id");
      t.secret = get(config, "aws_secret_access_key");
      t.token = get(config, "aws_session_token");
    }
  }
  std::string region = o.region;
  if (region.empty()) region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty()) region = get(config, "region");
  if (region.empty()) region = "us-east-1";
  std::string endpoint = o.endpoint;
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = get(config, "endpoint_url");
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (!endpoint.empty()) {
    if (endpoint.find("://") == std::string::npos) endpoint = "https://" + endpoint;
    t.bucket_url = endpoint + "/" + bucket;  // path-style
  } else if (bucket.find('.') != std::string::npos) {
    t.bucket_url = "https://s3." + region + ".amazonaws.com/" + bucket;
  } else {
    t.bucket_url = "https://" + bucket + ".s3." + region + ".amazonaws.com";
  }
  t.url = t.bucket_url + "/" + s3_encode_key(key);
  t.sign = !o.unsigned_requests && !t.key_id.empty();
  t.ca_file = ca_file_of(o);
  t.sigv4 = "aws:amz:" + region + ":s3";
  return t;
}

void apply_target(CURL* e, const Target& t, const std::string& url, const RemoteOptions& o,
                  curl_slist*& headers) {
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(o.low_speed_bytes));
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(o.low_speed_time_s + 0.5)));
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024);
  // Redirects only for plain HTTP(S) (presigned or mirrored objects); curl never sends the
  // credentials of one host to another.
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, t.s3 ? 0L : 1L);
  curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
  // HTTP and HTTPS only, for the URL and for every redirect (never ftp://, file://, ...).
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_USERAGENT, "ckpt");
  if (!t.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, t.ca_file.c_str());
  if (t.s3) {
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (t.sign) {
      curl_easy_setopt(e, CURLOPT_AWS_SIGV4, t.sigv4.c_str());
      curl_easy_setopt(e, CURLOPT_USERNAME, t.key_id.c_str());
      curl_easy_setopt(e, CURLOPT_PASSWORD, t.secret.c_str());
      if (!t.token.empty())
        headers = curl_slist_append(headers, ("x-amz-security-token: " + t.token).c_str());
    }
  }
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
}

std::string error_body_summary(const std::string& body) {
  auto code = body.find("<Code>");
  std::string s;
  if (code != std::string::npos) {
    auto end = body.find("</Code>", code);
    if (end != std::string::npos) s = body.substr(code + 6, end - code - 6);
  }
  if (s.size() > 64) s.resize(64);
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) return {};
  return s;
}

}  // namespace ckpt::internal
