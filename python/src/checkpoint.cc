// _ckpt.Checkpoint: an opened checkpoint's tables, tree and byte operations for ckpt.open,
// ckpt.safe_open and Checkpoint.stream (python/ckpt/__init__.py). Loads are in load.cc.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"

namespace ckpt::py {

OpenOptions open_options(bool strict, const std::string& key, const std::string& password) {
  OpenOptions o;
  o.strict = strict;
  o.decrypt_key = key;
  o.decrypt_password = password;
  return o;
}

LoadOptions load_options(bool verify, int threads, const std::string& device) {
  LoadOptions o;
  o.verify = verify;
  o.threads = threads;
  o.device = Device::parse(device);
  o.allocator = torch_device_allocator(o.device);
  return o;
}

pyb::list storage_spans(const Checkpoint& c, const std::vector<size_t>& which,
                        const LoadOptions& lo) {
  std::vector<StoragePtr> st(which.size());
  {
    pyb::gil_scoped_release nogil;
    for (size_t i = 0; i < which.size(); ++i) {
      if (which[i] >= c.storages().size() || c.storages()[which[i]].meta) continue;
      st[i] = c.storage(which[i], lo);
      if (!owned(st[i])) {  // a read-only view: a copy of our own instead
        LoadOptions o = lo;
        o.copy = true;
        st[i].reset();
        st[i] = c.storage(which[i], o);
      }
    }
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(st.size()));
  if (!out) throw pyb::error_already_set();
  auto list = pyb::reinterpret_steal<pyb::list>(out);
  SpanMaker spans;
  for (size_t i = 0; i < st.size(); ++i)
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i),
                    st[i] ? spans.make(hand_off(st[i]), owned(st[i])) : Py_NewRef(Py_None));
  return list;
}

pyb::list loaded_spans(const Checkpoint& c, const std::vector<Tensor>& loaded) {
  const auto& infos = c.tensors();
  std::vector<const StoragePtr*> by_storage(c.storages().size(), nullptr);
  for (size_t i = 0; i < loaded.size() && i < infos.size(); ++i)
    if (!by_storage[infos[i].storage]) by_storage[infos[i].storage] = &loaded[i].storage();
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(by_storage.size()));
  if (!out) throw pyb::error_already_set();
  auto list = pyb::reinterpret_steal<pyb::list>(out);
  SpanMaker spans;
  for (size_t i = 0; i < by_storage.size(); ++i) {
    const StoragePtr* st = by_storage[i];
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i),
                    st && *st ? spans.make(hand_off(*st), owned(*st)) : Py_NewRef(Py_None));
  }
  return list;
}

namespace {

using PyClass = pyb::class_<PyCheckpoint>;

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

pyb::dict report_dict(const ConvertReport& r) {
  auto texts = [](const std::vector<std::string>& v) {
    pyb::list l;
    for (auto& x : v) l.append(text(x));
    return l;
  };
  pyb::dict d;
  d["format"] = convert_format_name(r.format);
  d["tensors"] = r.tensors;
  d["tensor_bytes"] = r.tensor_bytes;
  d["bytes_written"] = r.bytes_written;
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
  pyb::list rules, aliases;  // transforms (include/ckpt/transform.h)
  for (auto& x : r.transforms.rules) rules.append(pyb::make_tuple(text(x.rule), x.matched));
  for (auto& [a, b] : r.aliases_dropped) aliases.append(pyb::make_tuple(text(a), text(b)));
  d["transforms"] = rules;
  d["unmatched_rules"] = texts(r.transforms.unmatched);
  d["aliases_dropped"] = aliases;
  d["model_files_copied"] = texts(r.model_files_copied);
  return d;
}

// Opening: a path (mapped with writable copy-on-write views when `mmap`), a URL, or bytes.
void bind_open(PyClass& c) {
  c.def_static(
      "open",
      [](const std::string& path, bool mmap, bool strict, const std::string& key,
         const std::string& password) {
        pyb::gil_scoped_release nogil;
        OpenOptions o = open_options(strict, key, password);
        o.mmap = mmap;
        o.writable_views = mmap;
        return PyCheckpoint{Checkpoint::open(path, o)};
      },
      pyb::arg("path"), pyb::arg("mmap"), pyb::arg("strict"), pyb::arg("key"),
      pyb::arg("password"));
  c.def_static("open_bytes", [](pyb::bytes data, const std::string& name, bool strict,
                                const std::string& key, const std::string& password) {
    std::string_view view = data;
    SourcePtr src = memory_source(view, name);
    pyb::gil_scoped_release nogil;
    return PyCheckpoint{Checkpoint::open(src, open_options(strict, key, password))};
  });
}

// What the file says, no bytes read.
void bind_tables(PyClass& c) {
  c.def_property_readonly("format", [](const PyCheckpoint& p) { return format_name(p.c.format()); })
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
      .def("state_dict_entries", [](const PyCheckpoint& p) {
        FlatStateDict f;
        {
          pyb::gil_scoped_release nogil;
          f = flatten_state_dict(p.c);
        }
        pyb::list out;
        for (auto& e : f.entries) out.append(pyb::make_tuple(text(e.name), e.tensor));
        return out;
      });
}

// Whole-file operations: verify, digests, convert.
void bind_checks(PyClass& c) {
  c.def("verify",
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
      .def(
          "convert",
          [](const PyCheckpoint& p, const std::string& dst, const std::string& format,
             uint32_t alignment, bool copy_shared, const std::string& meta, const std::string& key,
             const std::string& key_file, const std::string& password, bool store_digests,
             uint64_t max_shard_size, bool fsync, const pyb::object& progress_fn,
             uint32_t dcp_files, uint64_t memory_budget, const std::string& recipe) {
            ConvertOptions o;
            if (!recipe.empty())
              o.transforms = parse_transform_recipe(recipe);  // JSON text, transform.h
            o.fsync = fsync;
            if (memory_budget) o.memory_budget = memory_budget;
            PyProgress progress(progress_fn);
            // On this thread; raising aborts the conversion, except at the end (done == total,
            // the output written): what the callback raises there comes after the commit, and
            // is raised once convert() returns, marked committed (ckpt_committed).
            if (progress.active())
              o.progress = [&progress](uint64_t done, uint64_t total) {
                if (done < total) return progress.report(done, total, false);
                try {
                  progress.report(done, total, true);
                } catch (const Error&) {  // kept by progress, raised below
                }
              };
            // Keywords become settings; which format owns which, and the refusal of a keyword for
            // a format without it, are the library's (parse_target).
            TargetSettings ts;
            ts.alignment = alignment;
            ts.copy_shared = copy_shared;
            if (meta != "refuse") ts.meta = parse_meta_tensors(meta);
            ts.store_digests = store_digests;
            ts.encryption.key = key;
            ts.encryption.key_file = key_file;
            ts.encryption.password = password;
            ts.dcp_files = dcp_files;
            o.target = parse_target(format.empty() ? dst : format, ts);
            o.max_shard_size = max_shard_size;
            ConvertReport r;
            try {
              pyb::gil_scoped_release nogil;
              r = convert(p.c, dst, o);
            } catch (const Error&) {
              progress.rethrow();
              throw;
            }
            progress.set_committed(dst);
            progress.rethrow();  // the callback raised at the end: the output is complete
            return report_dict(r);
          },
          pyb::arg("dst"), pyb::arg("format"), pyb::arg("alignment"), pyb::arg("copy_shared"),
          pyb::arg("meta"), pyb::arg("key"), pyb::arg("key_file"), pyb::arg("password"),
          pyb::arg("store_digests"), pyb::arg("max_shard_size"), pyb::arg("fsync") = true,
          pyb::arg("progress") = pyb::none(), pyb::arg("dcp_files") = 0,
          pyb::arg("memory_budget") = 0, pyb::arg("recipe") = "");
}

// Bytes for the Python builder: storages by index (safe_open), streamed tensors.
void bind_bytes(PyClass& c) {
  c.def(
       "storages",
       [](const PyCheckpoint& p, const std::vector<size_t>& which, bool verify,
          const std::string& device) {
         return storage_spans(p.c, which, load_options(verify, 0, device));
       },
       pyb::arg("which"), pyb::arg("verify"), pyb::arg("device") = "cpu")
      // The box [begin, end) of tensor i, row-major (safe_open's get_slice: of a folder of chunks,
      // only the chunks that meet the box are read).
      .def("read_slice",
           [](const PyCheckpoint& p, size_t i, const std::vector<int64_t>& begin,
              const std::vector<int64_t>& end) {
             uint64_t n = i < p.c.tensors().size() ? dtype_size(p.c.tensors()[i].dtype) : 0;
             for (size_t d = 0; d < begin.size() && d < end.size(); ++d)
               n *= end[d] > begin[d] ? static_cast<uint64_t>(end[d] - begin[d]) : 0;
             std::string out(n, '\0');
             {
               pyb::gil_scoped_release nogil;
               p.c.read_slice(i, begin, end,
                              std::span<std::byte>(reinterpret_cast<std::byte*>(out.data()), n));
             }
             return pyb::bytes(out);
           })
      .def("stream",
           [](const PyCheckpoint& p, uint64_t budget, const pyb::function& fn, bool verify) {
             pyb::gil_scoped_release nogil;
             p.c.stream(
                 budget,
                 [&](const Tensor& t) {
                   pyb::gil_scoped_acquire gil;
                   // The slot is reused after the call: the Span is read-only and the Python side
                   // copies what it keeps before returning.
                   SpanMaker spans;
                   HandOff h = hand_off(t.storage());
                   h.owner = t.storage();
                   auto span = pyb::reinterpret_steal<pyb::object>(spans.make(h, false));
                   fn(info_tuple(t.info()), span);
                 },
                 load_options(verify, 0));
           });
}

}  // namespace

void bind_checkpoint(pyb::module_& m) {
  PyClass c(m, "Checkpoint");
  bind_open(c);
  bind_tables(c);
  bind_checks(c);
  bind_bytes(c);
  // A recipe file (JSON or YAML, transform.h) as the JSON text convert(recipe=) takes, read and
  // checked by the library: Checkpoint.convert adds its keywords to it.
  m.def("transform_recipe_json", [](const std::string& path) {
    pyb::gil_scoped_release nogil;
    return transform_recipe_json(path);
  });
}

}  // namespace ckpt::py
