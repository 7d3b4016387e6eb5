// The C ABI (include/ckpt/ckpt_c.h) over the public C++ API. Every exported function catches
// everything: a ckpt::Error becomes its code (the CLI's exit status) and the thread's last error,
// std::bad_alloc and anything else CKPT_ERR_UNEXPECTED. Nothing C++ crosses the boundary.

#include "ckpt/ckpt_c.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/options.h"

struct ckpt_options {
  std::map<std::string, std::string> values;
};

struct ckpt_checkpoint {
  ckpt::Checkpoint checkpoint;
  std::vector<std::string> dtype_names;  // per tensor, for ckpt_tensor_info.dtype
};

struct ckpt_loaded {
  std::vector<ckpt::Tensor> tensors;
};

namespace {

struct LastError {
  std::string message, source, record;
  bool has_offset = false;
  uint64_t offset = 0;
  void clear() {
    message.clear();
    source.clear();
    record.clear();
    has_offset = false;
    offset = 0;
  }
};

LastError& last_error() {
  thread_local LastError e;
  return e;
}

ckpt_status fail(ckpt_status status, std::string message) {
  LastError& e = last_error();
  e.clear();
  e.message = std::move(message);
  return status;
}

// Runs `fn`, mapping what it throws to a status and the thread's last error.
template <class Fn>
ckpt_status guarded(Fn&& fn) noexcept {
  last_error().clear();
  try {
    return fn();
  } catch (const ckpt::Error& err) {
    LastError& e = last_error();
    e.message = err.what();
    e.source = err.source();
    e.record = err.record();
    e.has_offset = err.offset().has_value();
    e.offset = err.offset().value_or(0);
    return static_cast<ckpt_status>(ckpt::exit_status(err.code()));
  } catch (const std::bad_alloc&) {
    return fail(CKPT_ERR_UNEXPECTED, "out of memory");
  } catch (const std::exception& err) {
    return fail(CKPT_ERR_UNEXPECTED, err.what());
  } catch (...) {
    return fail(CKPT_ERR_UNEXPECTED, "unknown failure");
  }
}

ckpt_status null_argument(const char* what) {
  return fail(CKPT_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL [invalid_argument]");
}

bool parse_bool(const std::string& v, bool& out) {
  if (v == "1" || v == "true" || v == "yes" || v == "on") return out = true, true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return out = false, true;
  return false;
}

bool parse_int(const std::string& v, long long& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size();
}

// The keys ckpt_options_set accepts, with a check of the value's form.
enum class Kind { kBool, kInt, kText, kSize, kFormat };
const std::map<std::string, Kind>& known_keys() {
  static const std::map<std::string, Kind> keys = {
      {"mmap", Kind::kBool},
      {"strict", Kind::kBool},
      {"verify", Kind::kBool},
      {"threads", Kind::kInt},
      {"decrypt_password", Kind::kText},
      {"remote.region", Kind::kText},
      {"remote.endpoint", Kind::kText},
      {"remote.access_key", Kind::kText},
      {"remote.secret_key", Kind::kText},
      {"remote.session_token", Kind::kText},
      {"remote.ca_file", Kind::kText},
      {"remote.connections", Kind::kInt},
      {"format", Kind::kFormat},
      {"max_shard_size", Kind::kSize},
      {"memory_budget", Kind::kSize},
  };
  return keys;
}

const std::string* get(const ckpt_options* o, const char* key) {
  if (!o) return nullptr;
  auto it = o->values.find(key);
  return it == o->values.end() ? nullptr : &it->second;
}

bool get_bool(const ckpt_options* o, const char* key, bool fallback) {
  const std::string* v = get(o, key);
  bool b = fallback;
  if (v) parse_bool(*v, b);
  return b;
}

ckpt::OpenOptions open_options(const ckpt_options* o) {
  ckpt::OpenOptions oo;
  oo.mmap = get_bool(o, "mmap", oo.mmap);
  oo.strict = get_bool(o, "strict", oo.strict);
  if (const std::string* v = get(o, "decrypt_password")) oo.decrypt_password = *v;
  ckpt::RemoteOptions& r = oo.remote;
  if (const std::string* v = get(o, "remote.region")) r.region = *v;
  if (const std::string* v = get(o, "remote.endpoint")) r.endpoint = *v;
  if (const std::string* v = get(o, "remote.access_key")) r.access_key_id = *v;
  if (const std::string* v = get(o, "remote.secret_key")) r.secret_access_key = *v;
  if (const std::string* v = get(o, "remote.session_token")) r.session_token = *v;
  if (const std::string* v = get(o, "remote.ca_file")) r.ca_file = *v;
  long long n = 0;
  if (const std::string* v = get(o, "remote.connections"); v && parse_int(*v, n))
    r.connections = static_cast<int>(n);
  return oo;
}

ckpt::LoadOptions load_options(const ckpt_options* o) {
  ckpt::LoadOptions lo;
  lo.verify = get_bool(o, "verify", lo.verify);
  long long n = 0;
  if (const std::string* v = get(o, "threads"); v && parse_int(*v, n))
    lo.threads = static_cast<int>(n);
  return lo;
}

}  // namespace

extern "C" {

const char* ckpt_version(void) { return CKPT_VERSION_STRING; }

int ckpt_abi_version(void) { return CKPT_C_ABI_VERSION; }

const char* ckpt_status_name(int status) {
  switch (status) {
    case CKPT_OK:
      return "ok";
    case CKPT_ERR_UNEXPECTED:
      return "unexpected";
    case CKPT_ERR_NOT_FOUND:
      return "not_found";
    case CKPT_ERR_IO:
      return "io";
    case CKPT_ERR_TRUNCATED:
      return "truncated";
    case CKPT_ERR_CORRUPT:
      return "corrupt";
    case CKPT_ERR_UNSUPPORTED:
      return "unsupported";
    case CKPT_ERR_LIMIT_EXCEEDED:
      return "limit_exceeded";
    case CKPT_ERR_INVALID_ARGUMENT:
      return "invalid_argument";
    case CKPT_ERR_AUTH:
      return "auth";
    case CKPT_ERR_NOT_VERIFIED:
      return "not_verified";
    default:
      return "unknown";
  }
}

const char* ckpt_last_error(void) { return last_error().message.c_str(); }
const char* ckpt_last_error_source(void) { return last_error().source.c_str(); }
const char* ckpt_last_error_record(void) { return last_error().record.c_str(); }
int ckpt_last_error_has_offset(void) { return last_error().has_offset ? 1 : 0; }
uint64_t ckpt_last_error_offset(void) { return last_error().offset; }

ckpt_options* ckpt_options_new(void) {
  last_error().clear();
  return new (std::nothrow) ckpt_options();
}

void ckpt_options_free(ckpt_options* options) { delete options; }

ckpt_status ckpt_options_set(ckpt_options* options, const char* key, const char* value) {
  return guarded([&]() -> ckpt_status {
    if (!options) return null_argument("options");
    if (!key) return null_argument("key");
    if (!value) return null_argument("value");
    auto it = known_keys().find(key);
    if (it == known_keys().end())
      return fail(CKPT_ERR_INVALID_ARGUMENT,
                  std::string("unknown option \"") + key + "\" [invalid_argument]");
    std::string v = value;
    bool ok = true, b = false;
    long long n = 0;
    switch (it->second) {
      case Kind::kBool:
        ok = parse_bool(v, b);
        break;
      case Kind::kInt:
        ok = parse_int(v, n) && n >= 0;
        break;
      case Kind::kSize:
        ckpt::parse_byte_size(v);
        break;  // throws kInvalidArgument
      case Kind::kFormat:
        ckpt::parse_convert_format(v);
        break;  // throws kInvalidArgument
      case Kind::kText:
        break;
    }
    if (!ok)
      return fail(CKPT_ERR_INVALID_ARGUMENT, std::string("option \"") + key + "\": \"" + v +
                                                 "\" is not a valid value [invalid_argument]");
    options->values[key] = std::move(v);
    return CKPT_OK;
  });
}

ckpt_status ckpt_open(const char* path, const ckpt_options* options, ckpt_checkpoint** out) {
  if (out) *out = nullptr;
  return guarded([&]() -> ckpt_status {
    if (!path) return null_argument("path");
    if (!out) return null_argument("out");
    auto c = std::make_unique<ckpt_checkpoint>(
        ckpt_checkpoint{ckpt::Checkpoint::open(path, open_options(options)), {}});
    for (const ckpt::TensorInfo& t : c->checkpoint.tensors())
      c->dtype_names.emplace_back(ckpt::dtype_name(t.dtype));
    *out = c.release();
    return CKPT_OK;
  });
}

void ckpt_close(ckpt_checkpoint* checkpoint) { delete checkpoint; }

const char* ckpt_format(const ckpt_checkpoint* checkpoint) {
  return checkpoint ? ckpt::format_name(checkpoint->checkpoint.format()) : "";
}

size_t ckpt_tensor_count(const ckpt_checkpoint* checkpoint) {
  return checkpoint ? checkpoint->checkpoint.tensors().size() : 0;
}

size_t ckpt_file_count(const ckpt_checkpoint* checkpoint) {
  return checkpoint ? checkpoint->checkpoint.files().size() : 0;
}

const char* ckpt_file_name(const ckpt_checkpoint* checkpoint, size_t index) {
  if (!checkpoint || index >= checkpoint->checkpoint.files().size()) return nullptr;
  return checkpoint->checkpoint.files()[index].c_str();
}

ckpt_status ckpt_tensor_info_at(const ckpt_checkpoint* checkpoint, size_t index,
                                ckpt_tensor_info* info) {
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!info) return null_argument("info");
    if (info->struct_size < sizeof(ckpt_tensor_info))
      return fail(CKPT_ERR_INVALID_ARGUMENT,
                  "info->struct_size is smaller than this library's ckpt_tensor_info "
                  "[invalid_argument]");
    const ckpt::Checkpoint& c = checkpoint->checkpoint;
    if (index >= c.tensors().size())
      return fail(CKPT_ERR_NOT_FOUND,
                  "tensor index " + std::to_string(index) + " is past the last tensor [not_found]");
    const ckpt::TensorInfo& t = c.tensors()[index];
    const ckpt::StorageInfo& s = c.storages()[t.storage];
    info->name = t.name.c_str();
    info->dtype = checkpoint->dtype_names[index].c_str();
    info->element_size = ckpt::dtype_size(t.dtype);
    info->ndim = t.shape.size();
    static const int64_t kNoDims[1] = {0};  // never NULL, also for a 0-d tensor
    info->shape = t.shape.empty() ? kNoDims : t.shape.data();
    info->strides = t.strides.empty() ? kNoDims : t.strides.data();
    info->nbytes = t.nbytes();
    info->file_offset =
        s.offset == ckpt::kNoOffset || s.meta ? UINT64_MAX : s.offset + t.byte_offset();
    info->file_index = c.files_of(index)[0];
    info->contiguous = t.is_contiguous() ? 1 : 0;
    return CKPT_OK;
  });
}

ckpt_status ckpt_find_tensor(const ckpt_checkpoint* checkpoint, const char* name, size_t* index) {
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!name) return null_argument("name");
    if (!index) return null_argument("index");
    std::optional<size_t> i = checkpoint->checkpoint.find(name);
    if (!i)
      return fail(CKPT_ERR_NOT_FOUND, std::string("no tensor named \"") + name + "\" [not_found]");
    *index = *i;
    return CKPT_OK;
  });
}

ckpt_status ckpt_read_tensor(const ckpt_checkpoint* checkpoint, size_t index, void* dst,
                             size_t dst_bytes, const ckpt_options* options) {
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!dst && dst_bytes) return null_argument("dst");
    checkpoint->checkpoint.read_into(index, {static_cast<std::byte*>(dst), dst_bytes},
                                     load_options(options));
    return CKPT_OK;
  });
}

ckpt_status ckpt_read_slice(const ckpt_checkpoint* checkpoint, size_t index, const int64_t* begin,
                            const int64_t* end, size_t ndim, void* dst, size_t dst_bytes,
                            const ckpt_options* options) {
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (ndim && (!begin || !end)) return null_argument("begin/end");
    if (!dst && dst_bytes) return null_argument("dst");
    checkpoint->checkpoint.read_slice(index, {begin, ndim}, {end, ndim},
                                      {static_cast<std::byte*>(dst), dst_bytes},
                                      load_options(options));
    return CKPT_OK;
  });
}

ckpt_status ckpt_tensor_data(const ckpt_checkpoint* checkpoint, size_t index, const void** data) {
  if (data) *data = nullptr;
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!data) return null_argument("data");
    const ckpt::Checkpoint& c = checkpoint->checkpoint;
    if (index >= c.tensors().size())
      return fail(CKPT_ERR_NOT_FOUND,
                  "tensor index " + std::to_string(index) + " is past the last tensor [not_found]");
    const ckpt::TensorInfo& t = c.tensors()[index];
    const std::byte* base = t.is_contiguous() ? c.view(t.storage) : nullptr;
    if (!base)
      return fail(CKPT_ERR_UNSUPPORTED, "tensor \"" + t.name +
                                            "\" has no zero-copy view (not a mapped raw "
                                            "contiguous tensor): read it instead [unsupported]");
    *data = base + t.byte_offset();
    return CKPT_OK;
  });
}

ckpt_status ckpt_load_into(const ckpt_checkpoint* checkpoint, void* const* dst,
                           const size_t* dst_bytes, size_t count, const ckpt_options* options) {
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    const ckpt::Checkpoint& c = checkpoint->checkpoint;
    const size_t n = c.tensors().size();
    if (count != n)
      return fail(CKPT_ERR_INVALID_ARGUMENT, "count is " + std::to_string(count) +
                                                 " but the checkpoint has " + std::to_string(n) +
                                                 " tensors [invalid_argument]");
    if (n && (!dst || !dst_bytes)) return null_argument("dst/dst_bytes");
    for (size_t i = 0; i < n; ++i)  // every size first: nothing is read on a mistake
      if (dst[i] && dst_bytes[i] != c.tensors()[i].nbytes())
        return fail(CKPT_ERR_INVALID_ARGUMENT, "tensor \"" + c.tensors()[i].name + "\" has " +
                                                   std::to_string(c.tensors()[i].nbytes()) +
                                                   " bytes, dst_bytes[" + std::to_string(i) +
                                                   "] is " + std::to_string(dst_bytes[i]) +
                                                   " [invalid_argument]");
    ckpt::LoadOptions lo = load_options(options);
    unsigned workers = lo.threads > 0
                           ? static_cast<unsigned>(lo.threads)
                           : std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    workers = static_cast<unsigned>(std::min<size_t>(workers, std::max<size_t>(n, 1)));
    lo.threads = 1;
    std::atomic<size_t> next{0};
    std::exception_ptr first;
    std::atomic<bool> failed{false};
    std::mutex m;
    auto work = [&] {
      for (size_t i; !failed && (i = next++) < n;) {
        if (!dst[i]) continue;
        try {
          c.read_into(i, {static_cast<std::byte*>(dst[i]), dst_bytes[i]}, lo);
        } catch (...) {
          std::lock_guard<std::mutex> g(m);
          if (!first) first = std::current_exception();
          failed = true;
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    if (first) std::rethrow_exception(first);
    return CKPT_OK;
  });
}

ckpt_status ckpt_load_all(const ckpt_checkpoint* checkpoint, const ckpt_options* options,
                          ckpt_loaded** out) {
  if (out) *out = nullptr;
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!out) return null_argument("out");
    ckpt::LoadOptions lo = load_options(options);
    lo.copy = true;  // owned memory: the result outlives ckpt_close
    auto loaded = std::make_unique<ckpt_loaded>();
    loaded->tensors = checkpoint->checkpoint.load_all(lo);
    for (ckpt::Tensor& t : loaded->tensors)  // the ABI promises row-major contiguous bytes
      if (!t.info().is_contiguous() && t.storage() && t.storage()->on_host())
        t = ckpt::Tensor::copy_of(t.name(), t.dtype(), t.shape(), t.contiguous_bytes());
    *out = loaded.release();
    return CKPT_OK;
  });
}

const void* ckpt_loaded_data(const ckpt_loaded* loaded, size_t index) {
  if (!loaded || index >= loaded->tensors.size()) return nullptr;
  return loaded->tensors[index].data();
}

uint64_t ckpt_loaded_nbytes(const ckpt_loaded* loaded, size_t index) {
  if (!loaded || index >= loaded->tensors.size()) return 0;
  return loaded->tensors[index].info().nbytes();
}

void ckpt_loaded_free(ckpt_loaded* loaded) { delete loaded; }

ckpt_status ckpt_verify(const ckpt_checkpoint* checkpoint, size_t* records) {
  if (records) *records = 0;
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    size_t n = checkpoint->checkpoint.verify();
    if (records) *records = n;
    if (n == 0)
      return fail(CKPT_ERR_NOT_VERIFIED,
                  checkpoint->checkpoint.source().name() +
                      ": nothing was verified: the checkpoint stores no checksums [not_verified]");
    return CKPT_OK;
  });
}

ckpt_status ckpt_convert(const ckpt_checkpoint* checkpoint, const char* out_path,
                         const ckpt_options* options, size_t* written) {
  if (written) *written = 0;
  return guarded([&]() -> ckpt_status {
    if (!checkpoint) return null_argument("checkpoint");
    if (!out_path) return null_argument("out_path");
    ckpt::ConvertOptions co;
    const std::string* format = get(options, "format");
    co.target = ckpt::default_target(format ? ckpt::parse_convert_format(*format)
                                            : ckpt::convert_format_for_path(out_path));
    co.load = load_options(options);
    co.remote = open_options(options).remote;
    if (const std::string* v = get(options, "max_shard_size"))
      co.max_shard_size = ckpt::parse_byte_size(*v);
    if (const std::string* v = get(options, "memory_budget"))
      co.memory_budget = ckpt::parse_byte_size(*v);
    ckpt::ConvertReport report = ckpt::convert(checkpoint->checkpoint, out_path, co);
    if (written) *written = report.tensors;
    return CKPT_OK;
  });
}

}  // extern "C"
