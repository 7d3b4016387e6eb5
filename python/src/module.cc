// ckpt._ckpt: the C++ half of the Python module. Thin: it opens checkpoints, moves bytes with the
// GIL released, and hands Python buffers (the buffer protocol) and plain tuples; python/ckpt/
// turns them into torch tensors or numpy arrays. Errors become ckpt.Error subclasses.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <string>
#include <vector>

#include "binding.h"

namespace ckpt::py {
namespace {

// Checkpoints whose last Python reference went away are destroyed on a thread of their own:
// freeing a 20,000-tensor model (its object tree, tensor and record tables) takes ~3 ms, which
// ckpt.load would otherwise spend after its tensors are made. drain_reaped() (atexit) waits
// for them; a forked child never waits for its parent's threads.
struct Reaped {
  std::mutex mu;
  std::condition_variable done;
  size_t running = 0;
  pid_t pid = 0;
  // Loads in progress (ckpt.load and friends, load_begin/load_end): a reaping thread waits
  // (up to kMaxWait) until none is, so that its frees do not run beside a load's allocations
  // (both in malloc's main arena: loading back to back, a load beside a reaper took 2x).
  size_t loads = 0;
  std::condition_variable idle;
};
constexpr auto kMaxWait = std::chrono::seconds(2);
size_t reap_threshold = 1000;  // tensors; _ckpt.set_reap_threshold changes it (benchmarks)

Reaped& reaped() {
  static Reaped* r = new Reaped;  // never destroyed: a reaping thread may outlive static dtors
  return *r;
}

void reap(Checkpoint&& c) {
  Reaped& r = reaped();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.pid != getpid()) {  // first use, or a forked child: its parent's threads are not here
      r.pid = getpid();
      r.running = 0;
    }
    ++r.running;
  }
  auto* doomed = new Checkpoint(std::move(c));
  try {
    std::thread([doomed] {
      {
        Reaped& r = reaped();
        std::unique_lock<std::mutex> lock(r.mu);
        r.idle.wait_for(lock, kMaxWait, [&] { return r.loads == 0; });
      }
      delete doomed;
      Reaped& r = reaped();
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.pid == getpid() && r.running > 0) --r.running;
      r.done.notify_all();
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: free it here
    delete doomed;
    std::lock_guard<std::mutex> lock(r.mu);
    --r.running;
  }
}

void load_begin() {
  Reaped& r = reaped();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.loads;
}

void load_end() {
  Reaped& r = reaped();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.loads > 0) --r.loads;
  if (r.loads == 0) r.idle.notify_all();
}

void drain_reaped() {
  pyb::gil_scoped_release nogil;
  Reaped& r = reaped();
  std::unique_lock<std::mutex> lock(r.mu);
  if (r.pid != getpid()) return;
  r.done.wait_for(lock, std::chrono::seconds(30), [&] { return r.running == 0; });
}

// A Checkpoint and whether its source is a private writable mapping (open_private_map).
struct PyCheckpoint {
  Checkpoint c;
  bool private_map = false;

  PyCheckpoint(Checkpoint ck, bool pm) : c(std::move(ck)), private_map(pm) {}
  PyCheckpoint(PyCheckpoint&& o) noexcept : c(std::move(o.c)), private_map(o.private_map) {
    o.moved = true;
  }
  PyCheckpoint(const PyCheckpoint&) = default;
  PyCheckpoint& operator=(const PyCheckpoint&) = delete;
  ~PyCheckpoint() {
    if (!moved && reap_threshold && c.tensors().size() >= reap_threshold) reap(std::move(c));
  }
  bool moved = false;  // `c` was moved out: nothing to free

  // Memory torch may write: owned by the storage, or inside our private mapping (not a
  // shard's read-only library mapping, which a sharded set opens by itself).
  bool writable(const StoragePtr& st) const {
    if (st->writable) return true;
    if (!private_map) return false;
    const std::byte* base = c.source().memory();
    return base && st->data >= base && st->data + st->info.nbytes <= base + c.source().size();
  }
};

OpenOptions open_options(bool strict, const std::string& key, const std::string& password,
                         bool mmap) {
  OpenOptions o;
  o.strict = strict;
  o.decrypt_key = key;
  o.decrypt_password = password;
  o.mmap = mmap;
  return o;
}

pyb::object opt_index(const std::optional<size_t>& i) {
  return i ? pyb::object(pyb::int_(*i)) : pyb::object(pyb::none());
}

// (name, dtype, shape, strides, storage_offset, storage, requires_grad, is_parameter,
//  quantization or None, type, contiguous from the storage's start)
pyb::tuple info_tuple(const TensorInfo& t) {
  pyb::object q = pyb::none();
  if (t.quantization) {
    const Quantization& z = *t.quantization;
    q = pyb::make_tuple(z.scheme, z.scale, z.zero_point, z.axis, opt_index(z.scales_tensor),
                        opt_index(z.zero_points_tensor));
  }
  pyb::object items[] = {text(t.name),
                         dtype_str(t.dtype),
                         int_tuple(t.shape),
                         int_tuple(t.strides),
                         pyb::int_(t.storage_offset),
                         pyb::int_(t.storage),
                         pyb::bool_(t.requires_grad),
                         pyb::bool_(t.is_parameter),
                         q,
                         text(t.type),
                         pyb::bool_(t.is_contiguous() && t.storage_offset == 0)};
  PyObject* out = PyTuple_New(11);
  if (!out) throw pyb::error_already_set();
  for (Py_ssize_t i = 0; i < 11; ++i) PyTuple_SET_ITEM(out, i, items[i].release().ptr());
  return pyb::reinterpret_steal<pyb::tuple>(out);
}

LoadOptions load_options(bool verify, int threads) {
  LoadOptions o;
  o.verify = verify;
  o.threads = threads;
  return o;
}

// The owner that keeps a storage's bytes alive (the storage itself when it names none).
std::shared_ptr<const void> owner_of(const StoragePtr& st) {
  return st->owner ? st->owner : std::shared_ptr<const void>(st);
}

// Spans of every storage a tensor uses, from loaded tensors (in checkpoint.tensors() order).
pyb::list storage_buffers(const PyCheckpoint& pc, const std::vector<Tensor>& loaded) {
  const auto& infos = pc.c.tensors();
  std::vector<const StoragePtr*> by_storage(pc.c.storages().size(), nullptr);
  for (size_t i = 0; i < loaded.size() && i < infos.size(); ++i)
    if (!by_storage[infos[i].storage]) by_storage[infos[i].storage] = &loaded[i].storage();
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(by_storage.size()));
  if (!out) throw pyb::error_already_set();
  auto list = pyb::reinterpret_steal<pyb::list>(out);
  SpanMaker spans;
  for (size_t i = 0; i < by_storage.size(); ++i) {
    const StoragePtr* st = by_storage[i];
    PyObject* o = st && *st ? spans.make((*st)->data, static_cast<size_t>((*st)->info.nbytes),
                                         owner_of(*st), pc.writable(*st))
                            : Py_NewRef(Py_None);
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), o);
  }
  return list;
}

const char* kErrorsModule = "ckpt._errors";

void raise_error(const Error& e) {
  try {
    pyb::module_ errors = pyb::module_::import(kErrorsModule);
    pyb::object cls = errors.attr("class_for")(error_code_name(e.code()));
    pyb::object offset = e.offset() ? pyb::object(pyb::int_(*e.offset())) : pyb::none();
    pyb::object exc = cls(text(e.what()), error_code_name(e.code()), text(e.source()),
                          text(e.record()), offset, text(e.message()));
    PyErr_SetObject(cls.ptr(), exc.ptr());
  } catch (pyb::error_already_set& err) {
    err.restore();
  }
}

pyb::dict report_dict(const ConvertReport& r) {
  pyb::dict d;
  d["format"] = convert_format_name(r.format);
  d["tensors"] = r.tensors;
  d["tensor_bytes"] = r.tensor_bytes;
  d["bytes_written"] = r.bytes_written;
  auto texts = [](const std::vector<std::string>& v) {
    pyb::list l;
    for (auto& x : v) l.append(text(x));
    return l;
  };
  d["not_written"] = texts(r.not_written);
  d["metadata_not_written"] = texts(r.metadata_not_written);
  pyb::list shared;
  for (auto& [a, b] : r.copied_shared) shared.append(pyb::make_tuple(text(a), text(b)));
  d["copied_shared"] = shared;
  d["meta_zeroed"] = texts(r.meta_zeroed);
  d["meta_skipped"] = texts(r.meta_skipped);
  d["files"] = texts(r.files);
  d["index"] = text(r.index);
  d["key"] = pyb::bytes(r.key);
  return d;
}

std::vector<Tensor> named_tensors(PyToValue& conv, const pyb::list& items) {
  // items: [(name, tensor)]; each tensor described by ckpt._tree.describe.
  std::vector<Tensor> out;
  for (auto it : items) {
    auto pair = it.cast<pyb::tuple>();
    ValuePtr v = conv.convert(pair[1]);
    if (v->kind() != Value::Kind::kTensor)
      throw Error(ErrorCode::kInvalidArgument, "not a tensor: " + pair[0].cast<std::string>());
    Tensor t = conv.tensors[v->tensor_index()];
    t.info().name = pair[0].cast<std::string>();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace
}  // namespace ckpt::py

using namespace ckpt;
using namespace ckpt::py;

PYBIND11_MODULE(_ckpt, m) {
  m.doc() = "C++ core of the ckpt module (use the `ckpt` package, not this).";
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e);
    }
  });

  add_span_type(m);
  pyb::class_<Buffer> buffer_class(m, "Buffer", pyb::buffer_protocol());
  buffer_class
      .def_buffer([](Buffer& b) {
        return pyb::buffer_info(const_cast<std::byte*>(b.data), 1, "B", 1,
                                {static_cast<pyb::ssize_t>(b.size)}, {1}, !b.writable);
      })
      .def("__len__", [](const Buffer& b) { return b.size; })
      .def_property_readonly("writable", [](const Buffer& b) { return b.writable; });
  // The same buffer (bytes, "B", one dimension, read-only unless writable) without pybind11's
  // generic path, which allocates a buffer_info per request: torch.frombuffer asks once per
  // tensor, ~0.2 us each of a 20,000-tensor load.
  {
    auto* type = reinterpret_cast<PyTypeObject*>(buffer_class.ptr());
    type->tp_as_buffer->bf_getbuffer = [](PyObject* obj, Py_buffer* view, int flags) -> int {
      const Buffer* b = nullptr;
      try {
        // Only instances of Buffer (or a subclass) reach this slot: its value, without
        // pybind11's cast and its type lookup.
        b = reinterpret_cast<pyb::detail::instance*>(obj)
                ->get_value_and_holder()
                .value_ptr<Buffer>();
      } catch (...) {
        b = nullptr;
      }
      if (!b) {
        PyErr_SetString(PyExc_BufferError, "not a ckpt buffer");
        return -1;
      }
      return PyBuffer_FillInfo(view, obj, const_cast<std::byte*>(b->data),
                               static_cast<Py_ssize_t>(b->size), b->writable ? 0 : 1, flags);
    };
    type->tp_as_buffer->bf_releasebuffer = nullptr;
  }

  pyb::class_<PyCheckpoint>(m, "Checkpoint")
      .def_static(
          "open",
          [](const std::string& path, bool private_map, bool strict, const std::string& key,
             const std::string& password) {
            pyb::gil_scoped_release nogil;
            // Without the private mapping: pread into owned memory (a read-only library
            // mapping would hand torch non-writable buffers).
            OpenOptions o = open_options(strict, key, password, private_map);
            if (private_map) return PyCheckpoint{Checkpoint::open(open_private_map(path), o), true};
            return PyCheckpoint{Checkpoint::open(path, o), false};
          },
          pyb::arg("path"), pyb::arg("private_map"), pyb::arg("strict"), pyb::arg("key"),
          pyb::arg("password"))
      .def_static("open_bytes",
                  [](pyb::bytes data, const std::string& name, bool strict, const std::string& key,
                     const std::string& password) {
                    std::string_view view = data;
                    SourcePtr src = memory_source(view, name);
                    pyb::gil_scoped_release nogil;
                    return PyCheckpoint{
                        Checkpoint::open(src, open_options(strict, key, password, true)), false};
                  })
      .def_static(
          "open_and_load",
          [](const std::string& path, bool strict, const std::string& key,
             const std::string& password, bool verify, int threads,
             const pyb::object& build) -> pyb::tuple {
            // build(checkpoint, buffers) -> result, called while the reader threads still fill
            // the buffers (LoadOptions::on_placed): the Python side makes its tensors and tree
            // meanwhile, never reading the bytes. Returns (checkpoint, buffers, result), result
            // None when build was not called (a sharded set); a Python error raised by build is
            // raised once the load has stopped.
            pyb::object result = pyb::none();
            std::optional<pyb::error_already_set> build_error;
            LoadOptions lo = load_options(verify, threads);
            if (!build.is_none()) {
              lo.on_placed = [&](const Checkpoint& c, const std::vector<Tensor>& tensors) {
                pyb::gil_scoped_acquire gil;
                try {
                  PyCheckpoint pc{c, false};
                  pyb::list bufs = storage_buffers(pc, tensors);
                  result = build(pyb::cast(pc), bufs);
                } catch (pyb::error_already_set& e) {
                  build_error.emplace(std::move(e));
                  throw Error(ErrorCode::kInvalidArgument, "building the Python objects failed");
                }
              };
            }
            std::optional<LoadedCheckpoint> l;
            try {
              pyb::gil_scoped_release nogil;
              l.emplace(Checkpoint::open_and_load(path, open_options(strict, key, password, true),
                                                  lo));
            } catch (const Error&) {
              result = pyb::none();  // made over bytes that never all arrived
              if (build_error) throw std::move(*build_error);
              throw;
            }
            if (!result.is_none()) return pyb::make_tuple(pyb::none(), pyb::none(), result);
            PyCheckpoint pc{l->checkpoint, false};
            pyb::list bufs = storage_buffers(pc, l->tensors);
            return pyb::make_tuple(pyb::cast(pc), bufs, pyb::none());
          })
      .def_property_readonly("format",
                             [](const PyCheckpoint& p) { return format_name(p.c.format()); })
      .def_property_readonly("name",
                             [](const PyCheckpoint& p) { return text(p.c.source().name()); })
      .def_property_readonly("size", [](const PyCheckpoint& p) { return p.c.source().size(); })
      .def_property_readonly("properties",
                             [](const PyCheckpoint& p) {
                               pyb::dict d;
                               for (auto& [k, v] : p.c.properties()) d[text(k)] = text(v);
                               return d;
                             })
      .def("tensor_infos",
           [](const PyCheckpoint& p) {
             pyb::list out;
             for (auto& t : p.c.tensors()) out.append(info_tuple(t));
             return out;
           })
      .def("storage_infos",
           [](const PyCheckpoint& p) {
             pyb::list out;
             for (auto& s : p.c.storages())
               out.append(pyb::make_tuple(text(s.key), dtype_str(s.dtype), s.nbytes, s.meta,
                                          text(s.device)));
             return out;
           })
      .def("tensor_count", [](const PyCheckpoint& p) { return p.c.tensors().size(); })
      .def("storage_count", [](const PyCheckpoint& p) { return p.c.storages().size(); })
      .def("dtype_names",
           [](const PyCheckpoint& p) {
             // The dtypes its tensors use, without a tuple per tensor (tensor_infos).
             bool seen[kNumDTypes] = {};
             pyb::list out;
             for (auto& t : p.c.tensors())
               if (!seen[static_cast<int>(t.dtype)]) {
                 seen[static_cast<int>(t.dtype)] = true;
                 out.append(dtype_str(t.dtype));
               }
             return out;
           })
      .def("find",
           [](const PyCheckpoint& p, const std::string& name) { return opt_index(p.c.find(name)); })
      .def("load_all",
           [](const PyCheckpoint& p, bool verify, int threads) {
             std::vector<Tensor> loaded;
             {
               pyb::gil_scoped_release nogil;
               loaded = p.c.load_all(load_options(verify, threads));
             }
             return storage_buffers(p, loaded);
           })
      .def("storages",
           [](const PyCheckpoint& p, const std::vector<size_t>& which, bool verify) {
             // Views of a mapped source where the bytes are raw, else loaded one by one.
             std::vector<StoragePtr> st(which.size());
             {
               pyb::gil_scoped_release nogil;
               for (size_t i = 0; i < which.size(); ++i)
                 if (which[i] < p.c.storages().size() && !p.c.storages()[which[i]].meta) {
                   st[i] = p.c.storage(which[i], load_options(verify, 0));
                   if (!p.writable(st[i])) {  // a read-only view: a copy of our own instead
                     LoadOptions o = load_options(verify, 0);
                     o.copy = true;
                     st[i].reset();
                     st[i] = p.c.storage(which[i], o);
                   }
                 }
             }
             PyObject* out = PyList_New(static_cast<Py_ssize_t>(st.size()));
             if (!out) throw pyb::error_already_set();
             auto list = pyb::reinterpret_steal<pyb::list>(out);
             SpanMaker spans;
             for (size_t i = 0; i < st.size(); ++i) {
               PyObject* o = st[i] ? spans.make(st[i]->data, static_cast<size_t>(st[i]->info.nbytes),
                                                owner_of(st[i]), p.writable(st[i]))
                                   : Py_NewRef(Py_None);
               PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), o);
             }
             return list;
           })
      .def("tree",
           [](const PyCheckpoint& p, const pyb::list& tensors, const pyb::module_& helpers,
              uint32_t max_depth) {
             try {
               return tree_to_python(*p.c.root(), tensors, helpers, max_depth);
             } catch (Error& e) {
               e.with_source(p.c.source().name());
               throw;
             }
           })
      .def("state_dict_entries",
           [](const PyCheckpoint& p) {
             FlatStateDict f;
             {
               pyb::gil_scoped_release nogil;
               f = flatten_state_dict(p.c);
             }
             pyb::list out;
             for (auto& e : f.entries) out.append(pyb::make_tuple(text(e.name), e.tensor));
             return out;
           })
      .def("verify",
           [](const PyCheckpoint& p) {
             pyb::gil_scoped_release nogil;
             return p.c.verify();
           })
      .def("digests",
           [](const PyCheckpoint& p, bool verify) {
             std::vector<TensorDigest> d;
             {
               pyb::gil_scoped_release nogil;
               DigestOptions o;
               o.load.verify = verify;
               d = tensor_digests(p.c, o);
             }
             pyb::dict out;
             for (auto& t : d)
               out[text(t.name)] =
                   t.sha256 ? pyb::object(pyb::str(to_hex(*t.sha256))) : pyb::object(pyb::none());
             return out;
           })
      .def("file_digest",
           [](const PyCheckpoint& p) {
             FileDigest f;
             {
               pyb::gil_scoped_release nogil;
               f = file_digest(p.c.source());
             }
             return pyb::make_tuple(f.name, f.size, to_hex(f.sha256));
           })
      .def("convert",
           [](const PyCheckpoint& p, const std::string& dst, const std::string& format,
              uint32_t alignment, bool copy_shared, const std::string& meta, const std::string& key,
              const std::string& key_file, const std::string& password, bool store_digests,
              uint64_t max_shard_size) {
             ConvertOptions o;
             o.to = format.empty() ? ConvertFormat::kAuto : parse_convert_format(format);
             o.alignment = alignment;
             o.copy_shared = copy_shared;
             o.meta = parse_meta_tensors(meta);
             o.encryption.key = key;
             o.encryption.key_file = key_file;
             o.encryption.password = password;
             o.store_digests = store_digests;
             o.max_shard_size = max_shard_size;
             ConvertReport r;
             {
               pyb::gil_scoped_release nogil;
               r = convert(p.c, dst, o);
             }
             return report_dict(r);
           })
      .def("stream",
           [](const PyCheckpoint& p, uint64_t budget, const pyb::function& fn, bool verify) {
             pyb::gil_scoped_release nogil;
             p.c.stream(
                 budget,
                 [&](const Tensor& t) {
                   pyb::gil_scoped_acquire gil;
                   // The slot is reused after the call: the buffer is marked read-only and the
                   // Python side copies what it keeps before returning.
                   Buffer b{t.storage()->data, static_cast<size_t>(t.storage()->info.nbytes),
                            t.storage(), false};
                   fn(info_tuple(t.info()), b);
                 },
                 load_options(verify, 0));
           });

  m.def("set_reap_threshold", [](size_t n) { reap_threshold = n; },
        "Checkpoints of at least n tensors are freed on a thread of their own (0: never).");
  m.def("set_kept_memory_limit", [](uint64_t b) { set_kept_memory_limit(b); }, pyb::arg("max_bytes"));
  m.def("kept_memory_limit", [] { return kept_memory_limit(); });
  m.def("release_kept_memory", [] {
    pyb::gil_scoped_release nogil;
    return release_kept_memory();
  });
  m.def("kept_memory", [] { return kept_memory(); });
  m.def("load_begin", &load_begin, "A load starts (freeing threads wait until none runs).");
  m.def("load_end", &load_end, "A load ended.");
  m.def("drain_reaped", &drain_reaped,
        "Waits (up to 30 s) until checkpoints freed on background threads are gone (atexit).");
  m.def("view_tensors",
        [](const PyCheckpoint& p, const pyb::list& bufs, const pyb::list& tensors,
           const pyb::object& from_dlpack) {
          return view_tensors(p.c, p.private_map, bufs, tensors, from_dlpack);
        },
        pyb::arg("checkpoint"), pyb::arg("bufs"), pyb::arg("tensors"), pyb::arg("from_dlpack"));
  m.def("plain_tensors",
        [](const PyCheckpoint& p, const pyb::object& storages, const pyb::list& tensors,
           const pyb::dict& dtypes, const pyb::object& frombuffer,
           const pyb::object& from_dlpack) {
          return plain_tensors(p.c, storages, tensors, dtypes, frombuffer, from_dlpack);
        },
        pyb::arg("checkpoint"), pyb::arg("storages"), pyb::arg("tensors"), pyb::arg("dtypes"),
        pyb::arg("frombuffer"), pyb::arg("from_dlpack") = pyb::none());
  m.def("save_torch", [](const std::string& path, pyb::handle obj, const pyb::module_& helpers,
                         uint32_t alignment, const std::string& archive_name) {
    PyToValue conv(helpers, false);
    ValuePtr root = conv.convert(obj);
    SaveOptions o;
    if (alignment) o.alignment = alignment;
    o.archive_name = archive_name;
    pyb::gil_scoped_release nogil;
    save_torch(path, root, conv.tensors, o);
  });
  m.def("save_safetensors", [](const std::string& path, const pyb::list& items,
                               const std::map<std::string, std::string>& metadata,
                               const pyb::module_& helpers, uint64_t alignment) {
    PyToValue conv(helpers, true);
    std::vector<Tensor> tensors = named_tensors(conv, items);
    SafetensorsSaveOptions o;
    if (alignment) o.alignment = alignment;
    pyb::gil_scoped_release nogil;
    save_safetensors(path, tensors, metadata, o);
  });
  m.def("save_tensorizer",
        [](const std::string& path, const pyb::list& items, const pyb::module_& helpers,
           const std::string& key, const std::string& password) {
          PyToValue conv(helpers, true);
          std::vector<Tensor> tensors = named_tensors(conv, items);
          TensorizerSaveOptions o;
          if (!key.empty()) {
            o.encryption = TensorizerEncryption::kKey;
            o.key = key;
          } else if (!password.empty()) {
            o.encryption = TensorizerEncryption::kPassword;
            o.password = password;
          }
          std::string raw_key;
          {
            pyb::gil_scoped_release nogil;
            raw_key = save_tensorizer(path, tensors, o);
          }
          return pyb::bytes(raw_key);
        });
  m.def("error_exit_status", [](const std::string& name) {
    for (int c = 0; c <= static_cast<int>(ErrorCode::kAuth); ++c)
      if (name == error_code_name(static_cast<ErrorCode>(c)))
        return exit_status(static_cast<ErrorCode>(c));
    return 1;
  });
}
