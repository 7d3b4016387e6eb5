// Torch tensors made in C++ for the common case of a load (python/ckpt/_build.py makes the
// rest): plain_tensors over the buffers a load handed out, view_tensors straight over an mmap=True
// mapping; both through DLPack where they can (dlpack.cc), else torch.frombuffer.

#include <vector>

#include "binding.h"

namespace ckpt::py {

pyb::tuple int_tuple(const std::vector<int64_t>& v) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(v.size()));
  if (!t) throw pyb::error_already_set();
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* x = PyLong_FromLongLong(v[i]);
    if (!x) {
      Py_DECREF(t);
      throw pyb::error_already_set();
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), x);
  }
  return pyb::reinterpret_steal<pyb::tuple>(t);
}

// dtype names as interned Python strings, made once (a 20,000-tensor file asks 20,000 times).
pyb::object dtype_str(DType d) {
  static PyObject* names[kNumDTypes] = {};
  PyObject*& s = names[static_cast<int>(d)];
  if (!s) {
    s = PyUnicode_InternFromString(dtype_info(d).name);
    if (!s) throw pyb::error_already_set();
  }
  return pyb::reinterpret_borrow<pyb::object>(s);
}

namespace {

// A tensor these loops may make: not quantized, no requires_grad, not a Parameter, not meta
// (Builder makes those).
bool plain(const TensorInfo& t, const std::vector<StorageInfo>& sinfos) {
  return !t.quantization && !t.requires_grad && !t.is_parameter && t.storage < sinfos.size() &&
         !sinfos[t.storage].meta;
}

// PyObject_SetItem that reports a failure as the Python error it set.
void set_item(PyObject* d, PyObject* k, PyObject* v) {
  if (PyObject_SetItem(d, k, v) != 0) throw pyb::error_already_set();
}

// The common case of a load, a plain tensor (not quantized, no requires_grad, not a Parameter,
// not meta) that is the first user of its storage, made here rather than in a Python loop:
// torch.frombuffer(buffer, dtype=dtype), then resize_(shape) or as_strided_(...) when it is
// not the whole storage as one dimension; tensors[i] and storages[si] become that tensor. On a
// 20,000-tensor file the Python loop's own overhead was ~2/3 of its ~25 ms. Tensors this does
// not make (other dtypes, shared storages, anything torch refuses) are left to
// ckpt._build.Builder, which makes or reports them. Returns how many tensors exist now (made
// here or before).
// dtypes: torch dtype name -> (torch.dtype, element size).
}  // namespace

size_t plain_tensors(const Checkpoint& c, const pyb::object& storages, const pyb::list& tensors,
                     const pyb::dict& dtypes, const pyb::object& frombuffer,
                     const pyb::object& from_dlpack) {
  const auto& infos = c.tensors();
  const auto& sinfos = c.storages();
  pyb::tuple kwnames = pyb::make_tuple(pyb::str("dtype"));
  pyb::str resize = "resize_", as_strided = "as_strided_";
  size_t made = 0;
  const size_t n_out = static_cast<size_t>(PyList_GET_SIZE(tensors.ptr()));
  // storages: a dict (index -> buffer) or the list of a load's buffers by index (None: none),
  // where no dict was made yet: the common case makes every tensor here and needs none.
  PyObject* const st = storages.ptr();
  const bool by_list = PyList_Check(st);
  if (!by_list && !PyDict_Check(st)) throw pyb::type_error("storages: a list or a dict");
  auto storage_of = [&](size_t si) -> PyObject* {
    if (by_list) {
      if (si >= static_cast<size_t>(PyList_GET_SIZE(st))) return nullptr;
      PyObject* o = PyList_GET_ITEM(st, static_cast<Py_ssize_t>(si));
      return o == Py_None ? nullptr : o;
    }
    pyb::int_ key(si);
    PyObject* o = PyDict_GetItemWithError(st, key.ptr());
    if (!o && PyErr_Occurred()) throw pyb::error_already_set();
    return o;
  };
  auto set_storage = [&](size_t si, PyObject* v) {
    if (by_list) {
      Py_INCREF(v);
      PyList_SetItem(st, static_cast<Py_ssize_t>(si), v);  // steals v, drops the buffer
    } else {
      pyb::int_ key(si);
      set_item(st, key.ptr(), v);
    }
  };
  for (size_t i = 0; i < infos.size() && i < n_out; ++i) {
    const TensorInfo& t = infos[i];
    if (PyList_GET_ITEM(tensors.ptr(), i) != Py_None) {  // made already (view_tensors)
      ++made;
      continue;
    }
    if (!plain(t, sinfos)) continue;
    PyObject* ds = PyDict_GetItemWithError(dtypes.ptr(), dtype_str(t.dtype).ptr());
    if (!ds) {
      if (PyErr_Occurred()) throw pyb::error_already_set();
      continue;
    }
    if (!PyTuple_Check(ds) || PyTuple_GET_SIZE(ds) != 2) continue;
    PyObject* dtype = PyTuple_GET_ITEM(ds, 0);
    const long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(ds, 1));
    if (size <= 0) {
      PyErr_Clear();
      continue;
    }
    PyObject* s = storage_of(t.storage);
    if (!s) continue;
    size_t n = 0;
    if (!span_data(s, &n)) continue;  // not a Span: a tensor already (a shared storage)
    if (n == 0 || n % static_cast<size_t>(size)) continue;
    if (!from_dlpack.is_none()) {
      if (PyObject* dl = dlpack_tensor(s, t, from_dlpack.ptr())) {
        set_storage(t.storage, dl);
        PyList_SetItem(tensors.ptr(), static_cast<Py_ssize_t>(i), dl);  // steals
        ++made;
        continue;
      }
    }
    PyObject* args[] = {s, dtype};
    auto tensor = pyb::reinterpret_steal<pyb::object>(
        PyObject_Vectorcall(frombuffer.ptr(), args, 1, kwnames.ptr()));
    if (!tensor) {
      PyErr_Clear();  // Builder.tensor() makes it again and reports the error
      continue;
    }
    const bool dense = t.is_contiguous() && t.storage_offset == 0;
    PyObject* r = nullptr;
    if (!dense) {
      pyb::tuple shape = int_tuple(t.shape), strides = int_tuple(t.strides);
      pyb::int_ offset(t.storage_offset);
      PyObject* margs[] = {tensor.ptr(), shape.ptr(), strides.ptr(), offset.ptr()};
      r = PyObject_VectorcallMethod(as_strided.ptr(), margs,
                                    4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    } else if (t.shape.size() != 1 || static_cast<size_t>(t.shape[0]) * size != n) {
      pyb::tuple shape = int_tuple(t.shape);
      PyObject* margs[] = {tensor.ptr(), shape.ptr()};
      r = PyObject_VectorcallMethod(resize.ptr(), margs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                    nullptr);
    } else {
      r = Py_NewRef(Py_None);
    }
    if (!r) {
      PyErr_Clear();
      continue;
    }
    Py_DECREF(r);
    set_storage(t.storage, tensor.ptr());
    PyList_SetItem(tensors.ptr(), static_cast<Py_ssize_t>(i), tensor.release().ptr());
    ++made;
  }
  return made;
}

// mmap=True's common case without a Storage or a Span per storage: a tensor that is the first
// user of its storage, plain (as plain_tensors), the whole storage, and whose bytes are a view
// of the private mapping (Checkpoint::view) becomes a torch tensor over them through DLPack.
// tensors[i] and bufs[si] (a list by storage index) become that tensor, as plain_tensors leaves
// them. Returns the storage indices that tensors not made here need (for storages()).
std::vector<size_t> view_tensors(const Checkpoint& c, bool private_map, const pyb::list& bufs,
                                 const pyb::list& tensors, const pyb::object& from_dlpack) {
  const auto& infos = c.tensors();
  const auto& sinfos = c.storages();
  const size_t n_out = static_cast<size_t>(PyList_GET_SIZE(tensors.ptr()));
  const size_t n_bufs = static_cast<size_t>(PyList_GET_SIZE(bufs.ptr()));
  if (n_out != infos.size() || n_bufs != sinfos.size())
    throw pyb::value_error("view_tensors: list sizes differ from the checkpoint's tables");
  std::vector<uint8_t> need(sinfos.size(), 0);
  // Only the file opened through the private mapping: a sharded set's views are into the
  // shards' own (read-only) mappings.
  const bool ok = private_map && c.shards().empty() && !from_dlpack.is_none();
  std::shared_ptr<const void> owner = ok ? c.source().memory_owner() : nullptr;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& t = infos[i];
    if (PyList_GET_ITEM(tensors.ptr(), i) != Py_None || t.storage >= sinfos.size()) continue;
    PyObject* have = PyList_GET_ITEM(bufs.ptr(), static_cast<Py_ssize_t>(t.storage));
    const StorageInfo& si = sinfos[t.storage];
    if (owner && have == Py_None && plain(t, sinfos)) {
      if (const std::byte* data = c.view(t.storage)) {
        if (PyObject* dl = dlpack_tensor(data, static_cast<size_t>(si.nbytes), owner, t,
                                         from_dlpack.ptr())) {
          Py_INCREF(dl);
          PyList_SetItem(bufs.ptr(), static_cast<Py_ssize_t>(t.storage), dl);
          PyList_SetItem(tensors.ptr(), static_cast<Py_ssize_t>(i), dl);
          continue;
        }
      }
    }
    if (have == Py_None && !si.meta) need[t.storage] = 1;
  }
  std::vector<size_t> out;
  for (size_t s = 0; s < need.size(); ++s)
    if (need[s]) out.push_back(s);
  return out;
}

}  // namespace ckpt::py
