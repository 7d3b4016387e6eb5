// torch tensors made in C++ for the common case of a load (python/ckpt/_build.py makes the
// rest): a plain tensor that is the first user of its storage, through DLPack (handoff.cc) and
// torch.from_dlpack, re-strided in place where it is not the whole storage.

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
// (the Python builder makes those).
bool plain(const TensorInfo& t, const std::vector<StorageInfo>& sinfos) {
  return !t.quantization && !t.requires_grad && !t.is_parameter && t.storage < sinfos.size() &&
         !sinfos[t.storage].meta;
}

// tensor_over(h, t), re-strided to t's layout where it came back as the whole storage in one
// dimension: resize_ (contiguous from offset 0, cheaper) or as_strided_. A new reference, or
// nullptr with no Python error set (the Python builder makes it, or reports why not).
PyObject* make_tensor(const HandOff& h, const TensorInfo& t, PyObject* from_dlpack) {
  auto tensor = pyb::reinterpret_steal<pyb::object>(tensor_over(h, t, from_dlpack));
  if (!tensor) return nullptr;
  const uint64_t size = dtype_size(t.dtype);
  if (t.storage_offset == 0 && t.is_contiguous() && t.numel() * size == h.nbytes)
    return tensor.release().ptr();  // made as the tensor itself
  static PyObject* resize = PyUnicode_InternFromString("resize_");
  static PyObject* as_strided = PyUnicode_InternFromString("as_strided_");
  PyObject* r = nullptr;
  pyb::tuple shape = int_tuple(t.shape);
  if (t.storage_offset == 0 && t.is_contiguous()) {
    PyObject* args[] = {tensor.ptr(), shape.ptr()};
    r = PyObject_VectorcallMethod(resize, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  } else {
    pyb::tuple strides = int_tuple(t.strides);
    pyb::int_ offset(t.storage_offset);
    PyObject* args[] = {tensor.ptr(), shape.ptr(), strides.ptr(), offset.ptr()};
    r = PyObject_VectorcallMethod(as_strided, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  if (!r) {
    PyErr_Clear();
    return nullptr;
  }
  Py_DECREF(r);
  return tensor.release().ptr();
}

}  // namespace

// The common tensor of a load: plain, the first user of its storage, its storage a writable Span
// in `storages`. tensors[i] and storages[si] become that tensor (later tensors of the storage
// share its torch storage: the Python builder set_s them onto it). On a 20,000-tensor file a
// Python loop's own overhead was ~2/3 of this work. Tensors not made here (dtypes without a
// DLPack type, shared storages, anything torch refuses) are left to ckpt._build.Builder.
size_t plain_tensors(const Checkpoint& c, const pyb::list& storages, const pyb::list& tensors,
                     PyObject* from_dlpack) {
  const auto& infos = c.tensors();
  const auto& sinfos = c.storages();
  const size_t n_out = static_cast<size_t>(PyList_GET_SIZE(tensors.ptr()));
  const size_t n_st = static_cast<size_t>(PyList_GET_SIZE(storages.ptr()));
  size_t made = 0;
  for (size_t i = 0; i < infos.size() && i < n_out; ++i) {
    const TensorInfo& t = infos[i];
    if (PyList_GET_ITEM(tensors.ptr(), i) != Py_None) {  // made already (view_tensors)
      ++made;
      continue;
    }
    if (!plain(t, sinfos) || t.storage >= n_st) continue;
    PyObject* s = PyList_GET_ITEM(storages.ptr(), static_cast<Py_ssize_t>(t.storage));
    HandOff h;
    if (!span_view(s, &h)) continue;  // a read-only Span, None, or a tensor already
    PyObject* made_t = make_tensor(h, t, from_dlpack);
    if (!made_t) continue;
    Py_INCREF(made_t);
    PyList_SetItem(storages.ptr(), static_cast<Py_ssize_t>(t.storage), made_t);  // drops the Span
    PyList_SetItem(tensors.ptr(), static_cast<Py_ssize_t>(i), made_t);
    ++made;
  }
  return made;
}

// mmap=True's common case without a Storage or a Span per storage: a plain tensor that is the
// first user of its storage, whose bytes are a view of a writable mapping (Checkpoint::view,
// ByteSource::memory_writable), is made straight over them. tensors[i] and storages[si] become
// that tensor, as plain_tensors leaves them. Returns the storage indices that the tensors not
// made here need (Checkpoint::storage then).
std::vector<size_t> view_tensors(const Checkpoint& c, const pyb::list& storages,
                                 const pyb::list& tensors, PyObject* from_dlpack) {
  const auto& infos = c.tensors();
  const auto& sinfos = c.storages();
  if (static_cast<size_t>(PyList_GET_SIZE(tensors.ptr())) != infos.size() ||
      static_cast<size_t>(PyList_GET_SIZE(storages.ptr())) != sinfos.size())
    throw pyb::value_error("view_tensors: list sizes differ from the checkpoint's tables");
  std::vector<uint8_t> need(sinfos.size(), 0);
  // One HandOff for every view (the mapping's owner copied once, not per tensor). Only a single
  // file opened through a writable mapping: a sharded set's views are into the shards' own
  // (read-only) mappings, which the set's source (its index) does not own.
  HandOff h;
  if (from_dlpack && c.source().memory_writable() && c.shards().empty())
    h.owner = c.source().memory_owner();
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& t = infos[i];
    if (PyList_GET_ITEM(tensors.ptr(), i) != Py_None || t.storage >= sinfos.size()) continue;
    PyObject* have = PyList_GET_ITEM(storages.ptr(), static_cast<Py_ssize_t>(t.storage));
    const StorageInfo& si = sinfos[t.storage];
    if (h.owner && have == Py_None && plain(t, sinfos)) {
      if (const std::byte* data = c.view(t.storage)) {
        h.data = data;
        h.nbytes = static_cast<size_t>(si.nbytes);
        if (PyObject* made = make_tensor(h, t, from_dlpack)) {
          Py_INCREF(made);
          PyList_SetItem(storages.ptr(), static_cast<Py_ssize_t>(t.storage), made);
          PyList_SetItem(tensors.ptr(), static_cast<Py_ssize_t>(i), made);
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
