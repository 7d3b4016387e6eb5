#pragma once
// Where a URL's requests go and how they are signed: http(s) URLs as given, s3://bucket/key
// resolved to an endpoint (path-style for custom endpoints) with SigV4 credentials from
// RemoteOptions, the AWS_* environment, or ~/.aws/credentials and ~/.aws/config.

#include <curl/curl.h>

#include <string>

#include "ckpt/options.h"

namespace ckpt::internal {

struct Target {
  std::string url;   // what requests are sent to
  std::string name;  // what errors show (no credentials, no query string)
  bool s3 = false;
  bool sign = false;  // SigV4 (credentials found and not unsigned_requests)
  std::string sigv4;  // "aws:amz:REGION:s3"
  std::string key_id, secret, token;
  std::string bucket_url;  // s3: the bucket's URL without the key (multipart uploads)
  std::string ca_file;     // CURLOPT_CAINFO when not empty (RemoteOptions::ca_file or env)
};

// Parses `url`; throws Error{kInvalidArgument} for a URL ckpt cannot use.
Target resolve_target(const std::string& url, const RemoteOptions& options);

// curl_global_init, once per process.
void curl_init_once();

// Sets the options every request of `t` carries (URL, signing, timeouts, the common headers in
// `headers`, which the caller frees after the transfer).
void apply_target(CURL* easy, const Target& t, const std::string& url, const RemoteOptions& o,
                  curl_slist*& headers);

// The "<Code>...</Code>" of an S3 XML error body, else the first line of a short text body; never
// anything that could hold a secret (bounded, printable).
std::string error_body_summary(const std::string& body);

// Percent-encodes every byte but A-Za-z0-9-._~ and '/'.
std::string s3_encode_key(const std::string& key);

}  // namespace ckpt::internal
