// _ckpt.load and _ckpt.load_checkpoint: a whole load in one call from Python. The bytes arrive
// (an eager load's reader threads, or views of a writable mapping), the common tensors are made
// here (tensors.cc), the Python builder (ckpt._build.finish) makes only what is left (quantized
// tensors, Parameters, requires_grad, meta, shared storages, dtypes without a DLPack type; every
// tensor for numpy), and the result is built here: the object tree (tree.cc), the flat state
// dict (load_file), or a TorchScript archive's state dict (ckpt._script, the one Python step).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"

namespace ckpt::py {
namespace {

constexpr uint32_t kMaxDepth = 1000;  // the library's Limits::max_pickle_depth

// What the caller wants back and how tensors are made.
struct Want {
  bool flat = false;        // load_file: {flattened name: tensor}
  bool torch = false;       // torch tensors (else numpy arrays, all made by the builder)
  pyb::object from_dlpack;  // torch.from_dlpack, or None
  pyb::object build;        // ckpt._build
  pyb::module_ tree;        // ckpt._tree
  pyb::object script;       // ckpt._script
};

pyb::object new_list(size_t n) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(n));
  if (!l) throw pyb::error_already_set();
  for (size_t i = 0; i < n; ++i) PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i), Py_NewRef(Py_None));
  return pyb::reinterpret_steal<pyb::object>(l);
}

// Tensors over `storages` (a list by storage index: Spans, tensors made already, None), then
// the result. Reads no tensor byte: may run while reader threads still fill the memory.
// `ck` is the _ckpt.Checkpoint (one Python object per load: it is freed, in the background when
// large, once, when the load drops it).
pyb::object result(const pyb::object& ck, pyb::list storages, pyb::list tensors, const Want& w) {
  const Checkpoint& c = ck.cast<const PyCheckpoint&>().c;
  size_t made = w.torch ? plain_tensors(c, storages, tensors, w.from_dlpack.ptr()) : 0;
  if (made < c.tensors().size()) w.build.attr("finish")(ck, storages, tensors);
  if (w.flat) {
    pyb::dict out;
    for (auto it : ck.attr("state_dict_entries")()) {
      auto e = it.cast<pyb::tuple>();
      out[e[0]] = tensors[e[1]];
    }
    return out;
  }
  if (format_traits(c.format()).script) {
    // Its state dict (torch.load would run the TorchScript module), quantized Linear modules'
    // packed parameters included (ckpt/_script.py).
    pyb::cpp_function tree(
        [&c, tensors, &w] { return tree_to_python(*c.root(), tensors, w.tree, kMaxDepth); });
    return w.script.attr("state_dict")(ck, tensors, tree, w.torch);
  }
  try {
    return tree_to_python(*c.root(), tensors, w.tree, kMaxDepth);
  } catch (Error& e) {
    e.with_source(c.source().name());
    throw;
  }
}

// mmap=True: tensors straight over the writable mapping where the bytes are raw, the Storages
// of the rest loaded (decoded, or copied from a shard's read-only mapping).
pyb::object load_mapped(const pyb::object& ck, bool verify, const Want& w) {
  const Checkpoint& c = ck.cast<const PyCheckpoint&>().c;
  if (verify) {
    pyb::gil_scoped_release nogil;
    c.verify();
  }
  auto storages = pyb::reinterpret_steal<pyb::list>(new_list(c.storages().size()).release());
  auto tensors = pyb::reinterpret_steal<pyb::list>(new_list(c.tensors().size()).release());
  std::vector<size_t> need;
  if (w.torch) {
    need = view_tensors(c, storages, tensors, w.from_dlpack.ptr());
  } else {
    for (size_t s = 0; s < c.storages().size(); ++s) need.push_back(s);
  }
  if (!need.empty()) {
    pyb::list spans = storage_spans(c, need, load_options(false, 0));
    for (size_t k = 0; k < need.size(); ++k)
      PyList_SetItem(storages.ptr(), static_cast<Py_ssize_t>(need[k]),
                     Py_NewRef(PyList_GET_ITEM(spans.ptr(), static_cast<Py_ssize_t>(k))));
  }
  return result(ck, storages, tensors, w);
}

// Eager: the tensors and the result are made while the reader threads still fill the memory
// (LoadOptions::on_placed; after the load for a sharded set, which does not call it).
pyb::object load_eager(const std::string& path, const OpenOptions& oo, bool verify,
                       const std::string& device, const Want& w, PyProgress& progress,
                       bool drop_cache) {
  pyb::object out;
  std::optional<pyb::error_already_set> build_error;
  LoadOptions lo = load_options(verify, 0, device);
  lo.drop_cache = drop_cache;
  lo.progress = progress.fn();
  lo.on_placed = [&](const Checkpoint& c, const std::vector<Tensor>& loaded) {
    pyb::gil_scoped_acquire gil;
    try {
      out = result(pyb::cast(PyCheckpoint{c}), loaded_spans(c, loaded),
                   pyb::reinterpret_steal<pyb::list>(new_list(c.tensors().size()).release()), w);
    } catch (pyb::error_already_set& e) {
      build_error.emplace(std::move(e));
      throw Error(ErrorCode::kInvalidArgument, "building the Python objects failed");
    }
  };
  std::optional<LoadedCheckpoint> l;
  try {
    pyb::gil_scoped_release nogil;
    l.emplace(Checkpoint::open_and_load(path, oo, lo));
  } catch (const Error&) {
    out = pyb::object();  // made over bytes that never all arrived
    if (build_error) throw std::move(*build_error);
    progress.rethrow();
    throw;
  }
  progress.rethrow();
  if (out) return out;
  const Checkpoint& c = l->checkpoint;
  return result(pyb::cast(PyCheckpoint{c}), loaded_spans(c, l->tensors),
                pyb::reinterpret_steal<pyb::list>(new_list(c.tensors().size()).release()), w);
}

// Every storage read into memory of its own (ckpt.open(...).load(), a file object's bytes).
pyb::object load_all(const pyb::object& ck, bool verify, const Want& w,
                     const std::string& device = "cpu", PyProgress* progress = nullptr) {
  const Checkpoint& c = ck.cast<const PyCheckpoint&>().c;
  std::vector<Tensor> loaded;
  try {
    LoadOptions lo = load_options(verify, 0, device);
    if (progress) lo.progress = progress->fn();
    pyb::gil_scoped_release nogil;
    loaded = c.load_all(lo);
  } catch (const Error&) {
    if (progress) progress->rethrow();
    throw;
  }
  if (progress) progress->rethrow();
  return result(ck, loaded_spans(c, loaded),
                pyb::reinterpret_steal<pyb::list>(new_list(c.tensors().size()).release()), w);
}

Want want(bool flat, const pyb::object& from_dlpack, const pyb::object& build,
          const pyb::module_& tree, const pyb::object& script) {
  Want w;
  w.flat = flat;
  w.torch = !from_dlpack.is_none();
  w.from_dlpack = from_dlpack;
  w.build = build;
  w.tree = tree;
  w.script = script;
  return w;
}

}  // namespace

void bind_load(pyb::module_& m) {
  m.def(
      "load",
      [](const pyb::object& source, bool mmap, bool verify, bool strict, const std::string& key,
         const std::string& password, bool flat, const pyb::object& from_dlpack,
         const pyb::object& build, const pyb::module_& tree, const pyb::object& script,
         const std::string& device, const pyb::object& progress_fn, bool drop_cache) {
        LoadScope scope;
        PyProgress progress(progress_fn);
        Want w = want(flat, from_dlpack, build, tree, script);
        const bool host = Device::parse(device).is_cpu();
        OpenOptions oo = open_options(strict, key, password);
        if (pyb::isinstance<pyb::tuple>(source)) {  // (bytes, name): a file object's contents
          auto pair = source.cast<pyb::tuple>();
          std::string_view view = pair[0].cast<pyb::bytes>();
          SourcePtr src = memory_source(view, pair[1].cast<std::string>());
          std::optional<Checkpoint> c;
          {
            pyb::gil_scoped_release nogil;
            c.emplace(Checkpoint::open(src, oo));
          }
          return load_all(pyb::cast(PyCheckpoint{std::move(*c)}), verify, w, device, &progress);
        }
        const std::string path = source.cast<std::string>();
        // A device load copies: nothing to map. A URL is read, never mapped: the eager load
        // overlaps its reads with opening.
        if (mmap && host && !is_url(path)) {
          oo.writable_views = true;
          std::optional<Checkpoint> c;
          {
            pyb::gil_scoped_release nogil;
            c.emplace(Checkpoint::open(path, oo));
          }
          pyb::object ck = pyb::cast(PyCheckpoint{std::move(*c)});
          const Checkpoint& opened = ck.cast<const PyCheckpoint&>().c;
          // What has no writable mapping (a folder, whose storages are assembled) loads eagerly.
          if (!opened.source().memory_writable()) return load_all(ck, verify, w, device, &progress);
          const uint64_t size = opened.source().size();
          pyb::object out = load_mapped(ck, verify, w);
          try {  // views read nothing up front: one report, the file's size, once they exist
            progress.report(size, size, true);
          } catch (const Error&) {
            progress.rethrow();
            throw;
          }
          return out;
        }
        return load_eager(path, oo, verify, device, w, progress, drop_cache);
      },
      pyb::arg("source"), pyb::arg("mmap"), pyb::arg("verify"), pyb::arg("strict"), pyb::arg("key"),
      pyb::arg("password"), pyb::arg("flat"), pyb::arg("from_dlpack"), pyb::arg("build"),
      pyb::arg("tree"), pyb::arg("script"), pyb::arg("device") = "cpu",
      pyb::arg("progress") = pyb::none(), pyb::arg("drop_cache") = false,
      "A whole load: the object tree (flat: the flattened state dict) of a path, URL or "
      "(bytes, name), its tensors made through from_dlpack (None: numpy, by build.finish).");
  m.def(
      "load_checkpoint",
      [](const pyb::object& ck, bool verify, const pyb::object& from_dlpack,
         const pyb::object& build, const pyb::module_& tree, const pyb::object& script) {
        LoadScope scope;
        return load_all(ck, verify, want(false, from_dlpack, build, tree, script));
      },
      pyb::arg("checkpoint"), pyb::arg("verify"), pyb::arg("from_dlpack"), pyb::arg("build"),
      pyb::arg("tree"), pyb::arg("script"), "Checkpoint.load(): every storage read, the tree.");
}

}  // namespace ckpt::py
