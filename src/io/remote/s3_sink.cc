// An S3 upload as a ByteSink (include/ckpt/remote.h): the bytes are buffered into parts of
// RemoteOptions::chunk_size (at least 5 MiB, S3's smallest part); a checkpoint that ends within
// the first part is sent with one PUT at commit(), a larger one as a multipart upload whose
// parts go out as they fill, up to `connections` at once (memory: about connections + 1 parts).
// commit() completes the upload (the object appears whole then); destruction without commit()
// aborts it, so no partial object is ever visible. Each request is retried like a source's
// ranges (5xx, 408, 429, transport errors; full-jitter backoff) within timeout_s.

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "io/remote/target.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMinPart = 5ull << 20;

struct Response {
  long status = 0;
  CURLcode rc = CURLE_OK;
  std::string body, etag, error;
};

struct Body {
  const std::byte* data;
  size_t size, pos = 0;
};

size_t read_body(char* out, size_t sz, size_t n, void* ud) {
  Body& b = *static_cast<Body*>(ud);
  size_t k = std::min(sz * n, b.size - b.pos);
  std::memcpy(out, b.data + b.pos, k);
  b.pos += k;
  return k;
}

size_t keep_body(char* p, size_t sz, size_t n, void* ud) {
  auto& s = *static_cast<std::string*>(ud);
  if (s.size() < (64 << 10)) s.append(p, std::min(sz * n, (64 << 10) - s.size()));
  return sz * n;
}

size_t keep_etag(char* p, size_t sz, size_t n, void* ud) {
  std::string line(p, sz * n);
  if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0) {
    std::string v = line.substr(5);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.erase(v.begin());
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
    *static_cast<std::string*>(ud) = v;
  }
  return sz * n;
}

std::string xml_field(const std::string& body, const char* tag) {
  const std::string open = std::string("<") + tag + ">", close = std::string("</") + tag + ">";
  size_t a = body.find(open);
  if (a == std::string::npos) return {};
  a += open.size();
  size_t b = body.find(close, a);
  return b == std::string::npos ? std::string() : body.substr(a, b - a);
}

class S3Sink final : public ByteSink {
 public:
  S3Sink(internal::Target t, RemoteOptions o) : t_(std::move(t)), o_(std::move(o)) {
    o_.chunk_size = std::clamp<uint64_t>(o_.chunk_size, kMinPart, 5ull << 30);
    o_.connections = std::clamp(o_.connections, 1, 64);
    buf_.reserve(o_.chunk_size);
  }
  ~S3Sink() override {
    if (committed_) return;
    for (auto& f : inflight_)
      if (f.valid()) f.wait();
    if (!upload_id_.empty()) {
      try {
        request("DELETE", "?uploadId=" + upload_id_, {}, 2);
      } catch (...) {
      }
    }
  }
  const std::string& name() const override { return t_.name; }
  uint64_t position() const override { return sent_ + buf_.size(); }

  void write(std::span<const std::byte> bytes) override {
    check_open();
    while (!bytes.empty()) {
      const size_t k = std::min<size_t>(bytes.size(), o_.chunk_size - buf_.size());
      buf_.insert(buf_.end(), bytes.begin(), bytes.begin() + static_cast<long>(k));
      bytes = bytes.subspan(k);
      if (buf_.size() == o_.chunk_size) send_part();
    }
  }
  using ByteSink::write;

  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    if (offset < sent_ || offset + bytes.size() > position())
      throw Error(ErrorCode::kUnsupported,
                  "an upload cannot change bytes already sent (write through a local file)",
                  t_.name, {}, offset);
    std::memcpy(buf_.data() + (offset - sent_), bytes.data(), bytes.size());
  }

  void commit() override {
    check_open();
    if (upload_id_.empty()) {
      // Small: one PUT.
      Response r = request("PUT", "", buf_, o_.retries);
      if (r.status != 200) fail("PUT", r);
    } else {
      if (!buf_.empty()) send_part();
      collect(0);
      std::string xml = "<CompleteMultipartUpload>";
      for (size_t i = 0; i < etags_.size(); ++i)
        xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags_[i] +
               "</ETag></Part>";
      xml += "</CompleteMultipartUpload>";
      Response r = request(
          "POST", "?uploadId=" + upload_id_,
          std::span<const std::byte>(reinterpret_cast<const std::byte*>(xml.data()), xml.size()),
          o_.retries);
      // S3 may answer 200 and put an error in the body.
      if (r.status != 200 || r.body.find("<Error>") != std::string::npos)
        fail("completing the multipart upload", r);
    }
    committed_ = true;
  }

 private:
  void check_open() const {
    if (committed_) throw Error(ErrorCode::kInvalidArgument, "upload already committed", t_.name);
    if (failed_) throw Error(ErrorCode::kIo, "upload failed earlier", t_.name);
  }

  [[noreturn]] void fail(const std::string& what, const Response& r) {
    failed_ = true;
    std::string m = what + ": ";
    ErrorCode code = ErrorCode::kIo;
    if (r.rc != CURLE_OK) {
      m += r.error.empty() ? curl_easy_strerror(r.rc) : r.error;
    } else {
      m += "HTTP " + std::to_string(r.status);
      std::string c = internal::error_body_summary(r.body);
      if (!c.empty()) m += " " + c;
      if (r.status == 401 || r.status == 403) code = ErrorCode::kAuth;
      if (r.status == 404) code = ErrorCode::kNotFound;  // no such bucket
    }
    throw Error(code, m, t_.name);
  }

  void send_part() {
    if (upload_id_.empty()) {
      Response r = request("POST", "?uploads=", {}, o_.retries);
      upload_id_ = xml_field(r.body, "UploadId");
      if (r.status != 200 || upload_id_.empty()) fail("starting a multipart upload", r);
    }
    collect(static_cast<size_t>(o_.connections) - 1);
    const size_t number = etags_.size() + inflight_.size() + 1;
    auto part = std::make_shared<std::vector<std::byte>>(std::move(buf_));
    buf_ = {};
    buf_.reserve(o_.chunk_size);
    sent_ += part->size();
    inflight_.push_back(std::async(std::launch::async, [this, part, number] {
      Response r =
          request("PUT", "?partNumber=" + std::to_string(number) + "&uploadId=" + upload_id_, *part,
                  o_.retries);
      return r;
    }));
  }

  // Waits until at most `keep` parts are in flight; throws the first failure.
  void collect(size_t keep) {
    while (inflight_.size() > keep) {
      Response r = inflight_.front().get();
      inflight_.erase(inflight_.begin());
      if (r.status != 200 || r.etag.empty()) {
        for (auto& f : inflight_) f.wait();
        fail("uploading a part", r);
      }
      etags_.push_back(r.etag);
    }
  }

  Response request(const std::string& method, const std::string& query,
                   std::span<const std::byte> body, int retries) const {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o_.timeout_s));
    thread_local std::mt19937_64 rng{std::random_device{}()};
    Response r;
    for (int attempt = 0;; ++attempt) {
      r = Response{};
      CURL* e = curl_easy_init();
      if (!e) throw Error(ErrorCode::kIo, "curl_easy_init failed", t_.name);
      curl_slist* headers = nullptr;
      internal::apply_target(e, t_, t_.url + query, o_, headers);
      char errbuf[CURL_ERROR_SIZE] = {};
      Body b{body.data(), body.size()};
      curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &keep_body);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, &r.body);
      curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &keep_etag);
      curl_easy_setopt(e, CURLOPT_HEADERDATA, &r.etag);
      if (method == "PUT") {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, &read_body);
        curl_easy_setopt(e, CURLOPT_READDATA, &b);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
      } else if (method == "POST") {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(body.data()));
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      } else {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method.c_str());
      }
      r.rc = curl_easy_perform(e);
      curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
      r.error = errbuf;
      curl_easy_cleanup(e);
      curl_slist_free_all(headers);
      const bool retry = r.rc != CURLE_OK ? r.rc != CURLE_COULDNT_RESOLVE_HOST
                                          : (r.status >= 500 || r.status == 408 || r.status == 429);
      if (!retry || attempt >= retries) return r;
      const double cap =
          std::min(o_.retry_max_s, o_.retry_base_s * double(1u << std::min(attempt, 20)));
      const auto when =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                             std::uniform_real_distribution<double>(0, cap)(rng)));
      if (when >= deadline) return r;
      std::this_thread::sleep_until(when);
    }
  }

  internal::Target t_;
  RemoteOptions o_;
  std::vector<std::byte> buf_;
  uint64_t sent_ = 0;
  std::string upload_id_;
  std::vector<std::string> etags_;  // of the parts done, in order
  std::vector<std::future<Response>> inflight_;
  bool committed_ = false, failed_ = false;
};

}  // namespace

std::unique_ptr<ByteSink> create_s3_sink(const std::string& url, const RemoteOptions& options) {
  internal::curl_init_once();
  internal::Target t = internal::resolve_target(url, options);
  if (!t.s3)
    throw Error(ErrorCode::kInvalidArgument, "uploads go to s3://bucket/key URLs only", t.name);
  return std::make_unique<S3Sink>(std::move(t), options);
}

}  // namespace ckpt
