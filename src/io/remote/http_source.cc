// A ByteSource over ranged HTTP GETs (libcurl): http(s) URLs and S3 objects (io/remote/target.h).
//
// Requests: a large read is cut into chunk_size ranges that run with curl multi, up to
// `connections` in flight, each written straight into its place in the destination; a read of
// at most kBlock bytes that no cached block holds fetches a kBlock block into a small cache, so
// an opener's many small metadata reads cost a request or two. Opening costs one request: a
// suffix range of kTail bytes pins the object's size and ETag and is kept as the first block
// (a zip's end records and, mostly, its directory; a small object whole). Every later range
// sends If-Match with the pinned ETag (else If-Unmodified-Since with the pinned Last-Modified):
// an object replaced mid-read fails with 412. Every response is also checked against the first
// one's validators (ETag, Last-Modified, the object's length), so a server that ignores the
// condition, or stops sending a validator, fails too: never a mix of two versions. An object
// with neither validator is checked by its length only, and RemoteOptions::on_note says so.
// A response that is refused (a 200 to a range, another object) is abandoned at its first byte;
// an error response after its first 2 KiB (enough for an S3 error code).
// Faults: 5xx, 408, 429, resets, stalls (low-speed limit) and cut bodies are retried with
// full-jitter exponential backoff (Retry-After honoured), a cut range resuming from the byte it
// reached, within RemoteOptions::timeout_s per range, counted from the range's first request and
// enforced during transfers too (a server that trickles or never ends its body); then an Error
// naming the URL (redacted), the range and the HTTP status or curl's error.
// A server that ignores Range (a 200 with the whole object to the opening range) is refused for an
// object over kTail, or with RemoteOptions::download_whole read whole, once, into an unlinked
// temporary file whose mapping then serves every read.
// Each concurrent caller drives a multi handle of its own from a pool (idle handles keep their
// connections alive for the next read).

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "io/remote/target.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;
using internal::Target;

constexpr uint64_t kTail = 1 << 20;   // the opening suffix range
constexpr uint64_t kBlock = 1 << 20;  // a small read's block (and the most a small read is)
constexpr size_t kMaxBlocks = 8;

double jitter(double max_s) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0, max_s)(rng);
}

// One range in flight (or waiting for its retry).
struct Piece {
  uint64_t offset = 0;  // absolute offset of dst[0]
  std::byte* dst = nullptr;
  uint64_t len = 0;      // bytes wanted (for the opening request: the most accepted)
  uint64_t got = 0;      // bytes written so far (a retry resumes here)
  bool opening = false;  // suffix request: size and ETag unknown yet
  bool whole = false;    // the whole object, into the source's temporary file (no Range)
  int attempts = 0;
  Clock::time_point not_before{}, deadline{};
  // Per attempt:
  bool checked = false;   // response status and Content-Range checked at the first byte
  bool usable = false;    // the body is the range's bytes
  bool overflow = false;  // the server sent more than asked
  long status = 0;
  std::string body;        // an error response's first bytes
  std::string mismatch;    // why a 2xx response was refused
  bool timed_out = false;  // the range's deadline passed
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* headers = nullptr;
  CURL* easy = nullptr;
  class HttpSource* src = nullptr;
};

std::string header(CURL* e, const char* name) {
  struct curl_header* h = nullptr;
  if (curl_easy_header(e, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h) return {};
  return h->value ? std::string(h->value) : std::string();
}

// "bytes A-B/T": false when it is not that.
bool parse_content_range(const std::string& v, uint64_t& a, uint64_t& b, uint64_t& t) {
  unsigned long long x, y, z;
  if (std::sscanf(v.c_str(), "bytes %llu-%llu/%llu", &x, &y, &z) != 3 || y < x || y >= z)
    return false;
  a = x, b = y, t = z;
  return true;
}

struct Multi {
  CURLM* m = nullptr;
  std::vector<CURL*> idle;
  Multi() {
    m = curl_multi_init();
    if (!m) throw Error(ErrorCode::kIo, "curl_multi_init failed");
  }
  ~Multi() {
    for (CURL* e : idle) curl_easy_cleanup(e);
    if (m) curl_multi_cleanup(m);
  }
  CURL* easy() {
    if (!idle.empty()) {
      CURL* e = idle.back();
      idle.pop_back();
      curl_easy_reset(e);
      return e;
    }
    CURL* e = curl_easy_init();
    if (!e) throw Error(ErrorCode::kIo, "curl_easy_init failed");
    return e;
  }
};

class HttpSource final : public ByteSource {
 public:
  HttpSource(Target t, RemoteOptions o) : t_(std::move(t)), o_(std::move(o)) {
    o_.connections = std::clamp(o_.connections, 1, 64);
    o_.chunk_size = std::clamp<uint64_t>(o_.chunk_size, 64 << 10, 1ull << 30);
    o_.retries = std::clamp(o_.retries, 0, 100);
  }

  ~HttpSource() override {
    if (spill_fd_ >= 0) ::close(spill_fd_);
  }

  void open() {
    auto tail = std::make_shared<std::vector<std::byte>>(kTail);
    std::vector<Piece> p(1);
    p[0].opening = true;
    p[0].dst = tail->data();
    p[0].len = kTail;
    run(p);
    if (p[0].whole) {
      // The server ignores Range: the object is in the temporary file.
      size_ = p[0].got;
      whole_ = open_mmap_source("/proc/self/fd/" + std::to_string(spill_fd_));
      ::close(spill_fd_);
      spill_fd_ = -1;
      return;
    }
    tail->resize(p[0].len);
    if (!tail->empty()) cache_.push_back({p[0].offset, std::move(tail)});
    if (tag_.empty() && modified_.empty() && size_ > p[0].len && o_.on_note)
      o_.on_note(t_.name +
                 ": the server sends neither ETag nor Last-Modified, so the object cannot be "
                 "pinned: a change while it is read shows only if its length changes");
  }

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return t_.name; }
  uint64_t preferred_read_size() const override {
    return o_.chunk_size * static_cast<uint64_t>(o_.connections);
  }

  const InMemory* in_memory() const override { return whole_ ? whole_->in_memory() : nullptr; }

  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    if (whole_) return whole_->read_into(offset, dst);
    check_range(offset, dst.size());
    count(dst.size());
    if (dst.empty()) return;
    if (Bytes b = cached(offset, dst.size()); b.owner) {
      std::memcpy(dst.data(), b.data.data(), dst.size());
      return;
    }
    if (dst.size() <= kBlock) {
      Bytes b = fetch_block(offset, dst.size());
      std::memcpy(dst.data(), b.data.data(), dst.size());
      return;
    }
    std::vector<Piece> pieces;
    cut(offset, dst, pieces);
    run(pieces);
  }

  Bytes read(uint64_t offset, uint64_t len) const override {
    if (whole_) return whole_->read(offset, len);
    check_range(offset, len);
    count(len);
    if (Bytes b = cached(offset, len); b.owner || len == 0) return b;
    if (len <= kBlock) return fetch_block(offset, len);
    auto buf = std::make_shared<std::vector<std::byte>>(len);
    std::vector<Piece> pieces;
    cut(offset, *buf, pieces);
    run(pieces);
    return {std::span<const std::byte>(buf->data(), buf->size()), buf};
  }

  // Requests no cached block holds are sorted and grouped: small neighbours (each under kBlock,
  // less than kBlock apart) are read as one range into a scratch buffer (a tensorizer's headers
  // between small tensors), the rest straight into their destinations (never copied through a
  // scratch buffer). All the ranges run in one window of `connections` requests.
  void read_batch(std::span<const ReadRequest> requests) const override {
    if (whole_) return whole_->read_batch(requests);
    std::vector<size_t> todo;
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& r = requests[i];
      check_range(r.offset, r.dst.size());
      count(r.dst.size());
      if (r.dst.empty()) continue;
      if (Bytes b = cached(r.offset, r.dst.size()); b.owner) {
        std::memcpy(r.dst.data(), b.data.data(), r.dst.size());
        continue;
      }
      todo.push_back(i);
    }
    std::sort(todo.begin(), todo.end(),
              [&](size_t a, size_t b) { return requests[a].offset < requests[b].offset; });
    struct Group {
      uint64_t begin, end;
      std::vector<size_t> members;
      std::vector<std::byte> scratch;
      bool small;  // every member under kBlock: neighbours may share a range
    };
    std::vector<Group> groups;
    for (size_t i : todo) {
      const auto& r = requests[i];
      const uint64_t end = r.offset + r.dst.size();
      const bool small = r.dst.size() < kBlock;
      if (small && !groups.empty() && groups.back().small &&
          r.offset <= groups.back().end + kBlock) {
        groups.back().end = std::max(groups.back().end, end);
        groups.back().members.push_back(i);
      } else {  // a large read goes straight into its destination
        groups.push_back({r.offset, end, {i}, {}, small});
      }
    }
    std::vector<Piece> pieces;
    for (auto& g : groups) {
      if (g.members.size() == 1) {
        cut(g.begin, requests[g.members[0]].dst, pieces);
        continue;
      }
      g.scratch.resize(g.end - g.begin);
      cut(g.begin, g.scratch, pieces);
    }
    run(pieces);
    for (auto& g : groups)
      if (g.members.size() > 1)
        for (size_t i : g.members)
          std::memcpy(requests[i].dst.data(), g.scratch.data() + (requests[i].offset - g.begin),
                      requests[i].dst.size());
  }

  // Called by curl on each block of a body.
  static size_t on_write(char* p, size_t sz, size_t n, void* ud);

 private:
  struct Block {
    uint64_t offset;
    std::shared_ptr<std::vector<std::byte>> data;
  };

  Bytes cached(uint64_t offset, uint64_t len) const {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (const auto& b : cache_)
      if (offset >= b.offset && offset - b.offset <= b.data->size() &&
          len <= b.data->size() - (offset - b.offset))
        return {std::span<const std::byte>(b.data->data() + (offset - b.offset), len), b.data};
    return {};
  }

  Bytes fetch_block(uint64_t offset, uint64_t len) const {
    const uint64_t n = std::min<uint64_t>(std::max(len, kBlock), size_ - offset);
    auto data = std::make_shared<std::vector<std::byte>>(n);
    std::vector<Piece> p(1);
    p[0].offset = offset;
    p[0].dst = data->data();
    p[0].len = n;
    run(p);
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() >= kMaxBlocks) cache_.erase(cache_.begin() + 1);  // keep the tail
      cache_.push_back({offset, data});
    }
    return {std::span<const std::byte>(data->data(), len), data};
  }

  void cut(uint64_t offset, std::span<std::byte> dst, std::vector<Piece>& out) const {
    for (uint64_t done = 0; done < dst.size(); done += o_.chunk_size) {
      Piece p;
      p.offset = offset + done;
      p.dst = dst.data() + done;
      p.len = std::min<uint64_t>(o_.chunk_size, dst.size() - done);
      out.push_back(std::move(p));
    }
  }

  std::unique_ptr<Multi> take_multi() const {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      if (!pool_.empty()) {
        auto m = std::move(pool_.back());
        pool_.pop_back();
        return m;
      }
    }
    return std::make_unique<Multi>();
  }
  void give_multi(std::unique_ptr<Multi> m) const {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_.size() < 4) pool_.push_back(std::move(m));
  }

  void start(Multi& m, Piece& p, std::vector<std::pair<CURL*, Piece*>>& active) const;
  // Runs every piece to completion; throws the first piece's error that retries cannot mend.
  void run(std::vector<Piece>& pieces) const;
  [[noreturn]] void fail(const Piece& p, CURLcode rc) const;
  std::string range_text(const Piece& p) const {
    if (p.opening) return "the last " + std::to_string(p.len) + " bytes";
    if (p.whole) return "the whole object";
    return "bytes " + std::to_string(p.offset) + "-" + std::to_string(p.offset + p.len - 1);
  }

  Target t_;
  RemoteOptions o_;
  uint64_t size_ = 0;
  std::string etag_;      // strong ETag pinned by the first response (If-Match), else ""
  std::string tag_;       // the first response's ETag, weak or strong ("" when it had none)
  std::string modified_;  // the first response's Last-Modified ("" when it had none)
  int spill_fd_ = -1;     // RemoteOptions::download_whole: the unlinked temporary file
  SourcePtr whole_;       // ... and its mapping, which serves every read once it is complete

  // The temporary file a whole object goes to; false (with `why`) when it cannot be made.
  bool make_spill(std::string& why) {
    if (spill_fd_ >= 0)
      return ::ftruncate(spill_fd_, 0) == 0 || (why = std::strerror(errno), false);
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-download-XXXXXX";
    spill_fd_ = ::mkostemp(path.data(), O_CLOEXEC);
    if (spill_fd_ < 0) {
      why = "cannot create a temporary file in " + path.substr(0, path.rfind('/')) + ": " +
            std::strerror(errno);
      return false;
    }
    ::unlink(path.c_str());
    return true;
  }

  // Is a later response's object the first one's? Else false, with the reason in `why`.
  bool same_validators(const std::string& etag, const std::string& modified,
                       std::string& why) const {
    if (!tag_.empty() && etag != tag_) {
      why = etag.empty() ? "the server stopped sending the object's ETag (" + tag_ +
                               "): it cannot show that the object did not change while reading"
                         : "the object changed while reading (ETag " + tag_ + ", now " + etag + ")";
      return false;
    }
    if (!modified_.empty() && modified != modified_) {
      why = modified.empty()
                ? "the server stopped sending the object's Last-Modified (" + modified_ +
                      "): it cannot show that the object did not change while reading"
                : "the object changed while reading (Last-Modified " + modified_ + ", now " +
                      modified + ")";
      return false;
    }
    return true;
  }
  mutable std::mutex cache_mu_;
  mutable std::vector<Block> cache_;
  mutable std::mutex pool_mu_;
  mutable std::vector<std::unique_ptr<Multi>> pool_;
  friend struct Checker;
};

// The first bytes of a response: is it the range asked for?
struct Checker {
  static void check(HttpSource& s, Piece& p, CURL* e) {
    p.checked = true;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &p.status);
    const uint64_t want = p.offset + p.got;
    const std::string etag = header(e, "ETag");
    const std::string modified = header(e, "Last-Modified");
    auto pin = [&] {
      s.tag_ = etag;
      if (etag.rfind("W/", 0) != 0) s.etag_ = etag;
      s.modified_ = modified;
    };
    if (p.status == 206) {
      if (p.whole) {
        p.mismatch = "a 206 response to a request without Range";
        return;
      }
      uint64_t a, b, t;
      if (!parse_content_range(header(e, "Content-Range"), a, b, t)) {
        p.mismatch = "a 206 response without a usable Content-Range";
        return;
      }
      if (p.opening) {
        // The suffix range: the object's size, ETag and last bytes.
        s.size_ = t;
        pin();
        p.opening = false;
        p.offset = a;
        p.len = b - a + 1;
        if (p.len > kTail) {
          p.mismatch = "more bytes than the suffix range asked for";
          return;
        }
        p.usable = true;
        return;
      }
      if (t != s.size_) {
        p.mismatch = "the object's size changed from " + std::to_string(s.size_) + " to " +
                     std::to_string(t) + " bytes while reading";
        return;
      }
      if (!s.same_validators(etag, modified, p.mismatch)) return;
      if (a != want || b != p.offset + p.len - 1) {
        p.mismatch = "the server sent bytes " + std::to_string(a) + "-" + std::to_string(b);
        return;
      }
      p.usable = true;
      return;
    }
    if (p.status == 200) {
      // The whole object: usable when the whole object was asked for, or at opening when it
      // fits the suffix range (a server that ignores Range, a small object), or the whole
      // download of RemoteOptions::download_whole.
      curl_off_t cl = -1;
      curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
      if (p.whole) {  // a retry of the whole download
        if (cl < 0 || static_cast<uint64_t>(cl) != s.size_) {
          p.mismatch = "the object's size changed from " + std::to_string(s.size_) + " to " +
                       (cl < 0 ? std::string("unknown") : std::to_string(cl)) +
                       " bytes while reading";
          return;
        }
        if (!s.same_validators(etag, modified, p.mismatch)) return;
        if (!s.make_spill(p.mismatch)) return;
        p.got = 0;
        p.usable = true;
        return;
      }
      if (p.opening) {
        if (cl < 0 || static_cast<uint64_t>(cl) > kTail) {
          if (cl < 0) {  // an endless body, as far as anyone can tell
            p.mismatch = "the server ignores Range requests (200 for a range) and sends no length";
            return;
          }
          if (!s.o_.download_whole) {
            p.mismatch =
                "the server ignores Range requests (200 for a range) and the object is over 1 MiB; "
                "a load can download it whole (RemoteOptions::download_whole)";
            return;
          }
          if (!s.make_spill(p.mismatch)) return;
          s.size_ = static_cast<uint64_t>(cl);
          pin();
          p.opening = false;
          p.whole = true;
          p.offset = 0;
          p.got = 0;
          p.len = static_cast<uint64_t>(cl);
          p.usable = true;
          if (s.o_.on_note)
            s.o_.on_note(s.t_.name +
                         ": the server ignores Range requests: downloading the whole object (" +
                         std::to_string(cl) + " bytes) once, into a temporary file");
          return;
        }
        s.size_ = static_cast<uint64_t>(cl);
        pin();
        p.opening = false;
        p.offset = 0;
        p.len = s.size_;
        p.usable = true;
        return;
      }
      if (want == 0 && p.len == s.size_ && cl >= 0 && static_cast<uint64_t>(cl) == s.size_) {
        if (!s.same_validators(etag, modified, p.mismatch)) return;
        p.usable = true;
        return;
      }
      p.mismatch = "the server ignores Range requests (200 for a range)";
      return;
    }
    if (p.status >= 200 && p.status < 300)
      p.mismatch = "HTTP " + std::to_string(p.status) + " to a range request";
  }
};

size_t HttpSource::on_write(char* data, size_t sz, size_t n, void* ud) {
  Piece& p = *static_cast<Piece*>(ud);
  const size_t bytes = sz * n;
  if (!p.checked) Checker::check(*p.src, p, p.easy);
  if (!p.usable) {
    // A refused 2xx is abandoned at its first byte; an error response once its first 2 KiB (the
    // S3 error code) are kept, so neither an endless nor a large body is read.
    if (!p.mismatch.empty() || p.status < 300) return 0;  // CURLE_WRITE_ERROR
    const size_t keep = std::min<size_t>(bytes, 2048 - p.body.size());
    p.body.append(data, keep);
    return p.body.size() >= 2048 ? 0 : bytes;
  }
  if (bytes > p.len - p.got) {
    p.overflow = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  if (p.whole) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t w = ::write(p.src->spill_fd_, data + done, bytes - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        p.mismatch = std::string("cannot write the temporary file: ") + std::strerror(errno);
        return 0;
      }
      done += static_cast<size_t>(w);
    }
    p.got += bytes;
    return bytes;
  }
  std::memcpy(p.dst + p.got, data, bytes);
  p.got += bytes;
  return bytes;
}

void HttpSource::start(Multi& m, Piece& p, std::vector<std::pair<CURL*, Piece*>>& active) const {
  CURL* e = m.easy();
  p.easy = e;
  p.src = const_cast<HttpSource*>(this);
  p.checked = p.usable = p.overflow = p.timed_out = false;
  p.status = 0;
  p.body.clear();
  p.mismatch.clear();
  p.errbuf[0] = 0;
  if (p.headers) curl_slist_free_all(p.headers);
  p.headers = nullptr;
  if (!p.opening && !etag_.empty())
    p.headers = curl_slist_append(p.headers, ("If-Match: " + etag_).c_str());
  else if (!p.opening && !modified_.empty())
    p.headers = curl_slist_append(p.headers, ("If-Unmodified-Since: " + modified_).c_str());
  internal::apply_target(e, t_, t_.url, o_, p.headers);
  // The range's time, retries included, counts from its first request; curl enforces what is
  // left during the transfer (a trickling server, an endless body).
  const auto now = Clock::now();
  if (p.attempts == 0)
    p.deadline = now + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(std::max(1.0, o_.timeout_s)));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - now).count();
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(1, left)));
  const std::string range =
      p.opening ? "-" + std::to_string(p.len)
                : std::to_string(p.offset + p.got) + "-" + std::to_string(p.offset + p.len - 1);
  if (!p.whole) curl_easy_setopt(e, CURLOPT_RANGE, range.c_str());  // curl copies strings
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &HttpSource::on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &p);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, p.errbuf);
  curl_easy_setopt(e, CURLOPT_PRIVATE, &p);
  ++p.attempts;
  stats().requests.fetch_add(1, std::memory_order_relaxed);
  if (curl_multi_add_handle(m.m, e) != CURLM_OK) {
    m.idle.push_back(e);
    throw Error(ErrorCode::kIo, "curl_multi_add_handle failed", t_.name);
  }
  active.push_back({e, &p});
}

void HttpSource::fail(const Piece& p, CURLcode rc) const {
  ErrorCode code = ErrorCode::kIo;
  std::string what = "GET " + range_text(p);
  const std::string s3code = internal::error_body_summary(p.body);
  if (!p.mismatch.empty()) {
    what += ": " + p.mismatch;
  } else if (p.timed_out) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", std::max(1.0, o_.timeout_s));
    what += ": timed out: the range's " + std::string(b) +
            " s (RemoteOptions::timeout_s, retries included) ran out";
    if (p.errbuf[0]) what += std::string(" (") + p.errbuf + ")";
  } else if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && !p.usable && p.status >= 300)) {
    what += ": " + std::string(p.overflow ? "the server sent more bytes than asked for"
                                          : (p.errbuf[0] ? p.errbuf : curl_easy_strerror(rc)));
    if (p.status) what += " (HTTP " + std::to_string(p.status) + ")";
  } else {
    what += ": HTTP " + std::to_string(p.status);
    if (!s3code.empty()) what += " " + s3code;
    switch (p.status) {
      case 404:
        code = ErrorCode::kNotFound;
        what += " (no such object)";
        break;
      case 401:
      case 403:
        code = ErrorCode::kAuth;
        what += " (access denied: check the credentials)";
        break;
      case 412:
        what += " (the object changed while reading: its " +
                (etag_.empty() ? "Last-Modified is no longer " + modified_
                               : "ETag is no longer " + etag_) +
                ")";
        break;
      case 416:
        code = ErrorCode::kTruncated;
        what += " (range not satisfiable)";
        break;
      default:
        break;
    }
  }
  if (p.attempts > 1) what += " after " + std::to_string(p.attempts) + " attempts";
  throw Error(code, what, t_.name, {}, p.opening ? std::optional<uint64_t>() : p.offset + p.got);
}

void HttpSource::run(std::vector<Piece>& pieces) const {
  if (pieces.empty()) return;
  auto multi = take_multi();
  Multi& m = *multi;
  std::vector<std::pair<CURL*, Piece*>> active;
  std::deque<Piece*> waiting;
  for (auto& p : pieces) waiting.push_back(&p);
  auto finish = [&](bool keep) {
    for (auto& [e, p] : active) {
      curl_multi_remove_handle(m.m, e);
      m.idle.push_back(e);
    }
    active.clear();
    for (auto& p : pieces)
      if (p.headers) curl_slist_free_all(p.headers), p.headers = nullptr;
    if (keep) give_multi(std::move(multi));
  };
  try {
    while (!waiting.empty() || !active.empty()) {
      auto now = Clock::now();
      // Start what may start, oldest first.
      for (size_t i = 0;
           i < waiting.size() && active.size() < static_cast<size_t>(o_.connections);) {
        if (waiting[i]->not_before <= now) {
          Piece* p = waiting[i];
          waiting.erase(waiting.begin() + static_cast<long>(i));
          start(m, *p, active);
        } else {
          ++i;
        }
      }
      int running = 0;
      if (curl_multi_perform(m.m, &running) != CURLM_OK)
        throw Error(ErrorCode::kIo, "curl_multi_perform failed", t_.name);
      int left = 0;
      while (CURLMsg* msg = curl_multi_info_read(m.m, &left)) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL* e = msg->easy_handle;
        const CURLcode rc = msg->data.result;
        auto it =
            std::find_if(active.begin(), active.end(), [&](const auto& a) { return a.first == e; });
        if (it == active.end()) continue;
        Piece& p = *it->second;
        curl_multi_remove_handle(m.m, e);
        m.idle.push_back(e);
        active.erase(it);
        if (!p.checked) {  // no body at all (an empty range, a HEAD-like error response)
          curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &p.status);
          if (rc == CURLE_OK && (p.status == 200 || p.status == 206) && p.opening) {
            p.checked = true;
            curl_off_t cl = -1;
            curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
            if (cl == 0 && p.status == 200) {  // an empty object
              const_cast<HttpSource*>(this)->size_ = 0;
              p.opening = false;
              p.len = 0;
              continue;
            }
          }
          if (rc == CURLE_OK && p.opening && p.status == 416) {  // suffix of an empty object
            const_cast<HttpSource*>(this)->size_ = 0;
            p.opening = false;
            p.len = 0;
            p.offset = 0;
            continue;
          }
        }
        if (rc == CURLE_OK && p.usable && p.got == p.len) continue;  // done
        now = Clock::now();
        if (rc == CURLE_OPERATION_TIMEDOUT && now + std::chrono::milliseconds(100) >= p.deadline) {
          p.timed_out = true;
          fail(p, rc);
        }
        // An error response abandoned after its first bytes is that response, not a transport
        // error.
        const bool cut_error = rc == CURLE_WRITE_ERROR && !p.usable && p.status >= 300;
        // Retry what may mend: transport errors, cut bodies, 5xx, 408, 429.
        bool retry = false;
        double after = -1;
        if (!p.mismatch.empty() || p.overflow) {
          retry = false;
        } else if (p.status >= 500 || p.status == 408 || p.status == 429) {
          retry = true;
          std::string ra = header(e, "Retry-After");
          if (!ra.empty() && std::isdigit(static_cast<unsigned char>(ra[0])))
            after = std::min(std::atof(ra.c_str()), o_.retry_max_s);
        } else if (rc == CURLE_OK || cut_error) {
          retry = p.usable;  // a short body without a transport error
        } else {
          switch (rc) {
            case CURLE_COULDNT_RESOLVE_HOST:
            case CURLE_UNSUPPORTED_PROTOCOL:
            case CURLE_URL_MALFORMAT:
            case CURLE_PEER_FAILED_VERIFICATION:
            case CURLE_SSL_CERTPROBLEM:
            case CURLE_SSL_CACERT_BADFILE:
            case CURLE_LOGIN_DENIED:
            case CURLE_TOO_MANY_REDIRECTS:
              retry = false;
              break;
            default:
              retry = true;  // partial file, reset, timeout, nothing received, connect...
          }
        }
        if (retry && p.attempts <= o_.retries) {
          const double cap = std::min(o_.retry_max_s,
                                      o_.retry_base_s * double(1u << std::min(p.attempts - 1, 20)));
          const double delay = after >= 0 ? after : jitter(cap);
          const auto when = now + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(delay));
          if (when < p.deadline) {
            p.not_before = when;
            waiting.push_back(&p);
            continue;
          }
        }
        fail(p, rc);
      }
      if (active.empty() && waiting.empty()) break;
      int timeout_ms = 100;
      if (active.empty() && !waiting.empty()) {
        auto next = waiting.front()->not_before;
        for (Piece* p : waiting) next = std::min(next, p->not_before);
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count(), 0,
            1000));
        if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
        continue;
      }
      curl_multi_poll(m.m, nullptr, 0, timeout_ms, nullptr);
    }
  } catch (...) {
    finish(false);
    throw;
  }
  finish(true);
}

}  // namespace

SourcePtr open_url_source(const std::string& url, const RemoteOptions& options) {
  internal::curl_init_once();
  auto s = std::make_shared<HttpSource>(internal::resolve_target(url, options), options);
  s->open();
  return s;
}

}  // namespace ckpt
