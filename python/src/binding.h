#pragma once
// Shared pieces of the Python binding (ckpt._ckpt): a byte buffer with the buffer protocol, the
// private copy-on-write file mapping behind mmap=True, and the object-tree conversions. Public
// API only (<ckpt/...>); no format logic lives here.

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/ckpt.h"

namespace ckpt::py {

namespace pyb = pybind11;

// Bytes exported to Python through the buffer protocol (memoryview, torch.frombuffer,
// numpy.frombuffer). `owner` keeps them alive for as long as this object (and so any tensor or
// array made over it) lives. `writable`: memory nobody else reads as the file's contents (an
// eager load's own memory, or a page of a private copy-on-write mapping).
struct Buffer {
  const std::byte* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  bool writable = false;
};

// Span (span.cc): the Python object a load hands out per storage, exporting `data`/`size`
// through the buffer protocol and holding a capsule of the shared owner of its memory.
void add_span_type(pyb::module_& m);  // registers ckpt._ckpt.Span; call once at import
PyTypeObject* span_type();
// The bytes of a Span (and *size), or nullptr when `o` is not exactly a Span.
const std::byte* span_data(PyObject* o, size_t* size);
// The shared owner of a Span's memory (nullptr when `o` is not a Span), and whether torch may
// write that memory.
const std::shared_ptr<const void>* span_owner(PyObject* o);
bool span_writable(PyObject* o);
// A torch tensor over a Span through torch._C._from_dlpack (dlpack.cc) when `t` is the whole of
// its storage, contiguous, of a dtype with a DLPack code; a new reference, or nullptr with no
// Python error set where not applicable (or torch refused): the caller uses frombuffer then.
PyObject* dlpack_tensor(PyObject* span, const TensorInfo& t, PyObject* from_dlpack);
// The same over `n` bytes at `data` (writable memory) that `owner` keeps alive.
PyObject* dlpack_tensor(const std::byte* data, size_t n, const std::shared_ptr<const void>& owner,
                        const TensorInfo& t, PyObject* from_dlpack);
// tensors.cc: small Python values made without pybind11's casts (a tuple of ints; a dtype's
// name, interned once), and the C++ loops that make the common tensors of a load (module.cc
// binds them as _ckpt.plain_tensors and _ckpt.view_tensors; see there).
pyb::tuple int_tuple(const std::vector<int64_t>& v);
pyb::object dtype_str(DType d);
size_t plain_tensors(const Checkpoint& c, const pyb::object& storages, const pyb::list& tensors,
                     const pyb::dict& dtypes, const pyb::object& frombuffer,
                     const pyb::object& from_dlpack);
std::vector<size_t> view_tensors(const Checkpoint& c, bool private_map, const pyb::list& bufs,
                                 const pyb::list& tensors, const pyb::object& from_dlpack);
// Makes Spans, one capsule per distinct owner (the arena or mapping most storages share).
class SpanMaker {
 public:
  SpanMaker() = default;
  SpanMaker(const SpanMaker&) = delete;
  SpanMaker& operator=(const SpanMaker&) = delete;
  ~SpanMaker();
  // A new reference; throws pyb::error_already_set.
  PyObject* make(const std::byte* data, size_t size, const std::shared_ptr<const void>& owner,
                 bool writable);

 private:
  std::unordered_map<const void*, PyObject*> owners_;
};

// A source over a private (MAP_PRIVATE, PROT_READ|PROT_WRITE) mapping of a file: views into it
// are writable copy-on-write memory, so torch accepts them without a read-only warning and a
// write never reaches the file. The mapping lives while any view's owner does. Throws Error
// (kNotFound, kIo; an empty file is opened as a plain file source, which reports it).
SourcePtr open_private_map(const std::string& path);

// Text from a file: UTF-8, undecodable bytes kept as surrogates (never a UnicodeDecodeError).
inline pyb::object text(const std::string& s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!o) throw pyb::error_already_set();
  return pyb::reinterpret_steal<pyb::object>(o);
}

// The object tree -> Python objects. `tensors[i]` is the Python object of tensor i (None where
// not made); `helpers` is the module ckpt._tree (constructors for what is not a builtin).
pyb::object tree_to_python(const Value& root, const pyb::list& tensors, const pyb::module_& helpers,
                           uint32_t max_depth);

// Python objects -> an object tree for save_torch. Tensors are recognised and described by
// `describe` (ckpt._tree.describe_tensor), which returns None for a non-tensor or a tuple
// (key, address, nbytes, dtype, shape, strides, offset, requires_grad, is_parameter, keepalive,
// quantization or None, meta).
// `keep` collects what must stay alive until the write is done.
struct PyToValue {
  // flat: for safetensors/tensorizer, where numpy arrays are tensors too.
  PyToValue(pyb::module_ h, bool flat) : helpers(std::move(h)), flat(flat) {}
  pyb::module_ helpers;
  bool flat = false;
  std::vector<Tensor> tensors;
  pyb::list keep;
  ValuePtr convert(pyb::handle obj, uint32_t depth = 0);

 private:
  std::unordered_map<PyObject*, ValuePtr> memo_;
  std::unordered_map<uintptr_t, StoragePtr> storages_;
  std::unordered_map<PyObject*, size_t> tensor_of_;
  ValuePtr tensor(pyb::handle obj, const pyb::tuple& d);
};

}  // namespace ckpt::py
