// The one way bytes reach Python: DLPack. A storage's bytes become a DLPack capsule
// ("dltensor", DLManagedTensor of Debian's libdlpack-dev header) whose DLDevice says where the
// bytes are and whose deleter drops the library's owner of them (the Storage, the eager load's
// arena, the file mapping). torch takes the capsule through its public torch.from_dlpack.
//
// Span (ckpt._ckpt.Span) is the per-storage object a load hands the Python builder: the bytes,
// their device and their owner, offered as __dlpack__/__dlpack_device__ (torch.from_dlpack(span))
// and, for CPU memory, through the buffer protocol for numpy: numpy.from_dlpack makes read-only
// arrays from a DLPack 0.x capsule (numpy 1.x always; numpy 2 unless the capsule is a versioned
// DLPack 1.0 one, which Debian's header lacks), and ckpt.load's arrays are writable.
//
// A Span is a plain C object (a 20,000-tensor file makes 20,000 of them where Python builds the
// tensors): a pointer, a length, a device and a reference to one capsule per distinct owner.

#include "binding.h"

namespace ckpt::py {
namespace {

constexpr int kMaxDims = 16;

struct Context {
  DLManagedTensor managed{};
  std::shared_ptr<const void> owner;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

// Called by the consumer (torch, under or without the GIL) or by drop_capsule: touches no
// Python object.
void delete_context(DLManagedTensor* m) { delete static_cast<Context*>(m->manager_ctx); }

// A capsule nobody consumed (its name is still "dltensor") frees its tensor here.
void drop_capsule(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

// --- Span -------------------------------------------------------------------------------------

struct SpanObject {
  PyObject_HEAD PyObject* owner;  // capsule of a std::shared_ptr<const void>
  const std::byte* data;
  Py_ssize_t size;
  int writable;
  DLDevice device;
};

SpanObject* as_span(PyObject* o) { return reinterpret_cast<SpanObject*>(o); }

const std::shared_ptr<const void>& owner_ref(const SpanObject* s) {
  static const std::shared_ptr<const void> none;
  if (!s->owner) return none;
  return *static_cast<const std::shared_ptr<const void>*>(PyCapsule_GetPointer(s->owner, nullptr));
}

void span_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(as_span(self)->owner);
  type->tp_free(self);
  Py_DECREF(type);  // heap type: instances hold a reference to it
}

int span_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  SpanObject* s = as_span(self);
  if (s->device.device_type != kDLCPU) {
    PyErr_SetString(PyExc_BufferError, "the bytes are not in host memory (use DLPack)");
    view->obj = nullptr;
    return -1;
  }
  return PyBuffer_FillInfo(view, self, const_cast<std::byte*>(s->data), s->size,
                           s->writable ? 0 : 1, flags);
}

Py_ssize_t span_length(PyObject* self) { return as_span(self)->size; }

PyObject* span_writable(PyObject* self, void*) { return PyBool_FromLong(as_span(self)->writable); }

// __dlpack__(stream=None, max_version=None, dl_device=None, copy=None): a 1-D uint8 capsule over
// every byte. `stream` needs no wait: the bytes are complete when a Span is handed out. A copy
// or another device is not offered (the consumer copies). A read-only Span (a stream's reused
// slot) is exported too: its consumer copies before the callback returns.
PyObject* span_dlpack(PyObject* self, PyObject* args, PyObject* kwargs) {
  (void)args;
  if (kwargs) {
    PyObject* copy = PyDict_GetItemString(kwargs, "copy");
    if (copy && copy == Py_True) {
      PyErr_SetString(PyExc_BufferError, "Span.__dlpack__: copy=True is not supported");
      return nullptr;
    }
  }
  SpanObject* s = as_span(self);
  try {
    return bytes_capsule(HandOff{s->data, static_cast<size_t>(s->size), owner_ref(s), s->device})
        .release()
        .ptr();
  } catch (pyb::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}

PyObject* span_dlpack_device(PyObject* self, PyObject*) {
  const DLDevice& d = as_span(self)->device;
  return Py_BuildValue("(ii)", static_cast<int>(d.device_type), d.device_id);
}

PyMethodDef span_methods[] = {
    {"__dlpack__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(span_dlpack)),
     METH_VARARGS | METH_KEYWORDS, "A DLPack capsule (1-D uint8) over the bytes."},
    {"__dlpack_device__", span_dlpack_device, METH_NOARGS, "(device type, device id)."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef span_getset[] = {
    {"writable", span_writable, nullptr, "whether the consumer may write the bytes", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot span_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(span_dealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(span_getbuffer)},
    {Py_sq_length, reinterpret_cast<void*>(span_length)},
    {Py_tp_methods, span_methods},
    {Py_tp_getset, span_getset},
    {Py_tp_doc, const_cast<char*>("Bytes of one storage (DLPack; buffer protocol on the CPU).")},
    {0, nullptr}};

PyType_Spec span_spec = {"ckpt._ckpt.Span", sizeof(SpanObject), 0, Py_TPFLAGS_DEFAULT, span_slots};

PyTypeObject* span_type_ = nullptr;

void drop_owner(PyObject* capsule) {
  delete static_cast<std::shared_ptr<const void>*>(PyCapsule_GetPointer(capsule, nullptr));
}

}  // namespace

bool dl_type(DType d, DLDataType* out) {
  const DTypeInfo& i = dtype_info(d);
  uint8_t code;
  switch (d) {
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      code = kDLFloat;
      break;
    case DType::kBFloat16:
      code = kDLBfloat;
      break;
    case DType::kComplex64:
    case DType::kComplex128:
      code = kDLComplex;
      break;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      code = kDLInt;
      break;
    case DType::kUInt8:
      code = kDLUInt;
      break;
    default:
      return false;  // bool, uint16+, float8, complex32, quantized: no code torch 1.13 takes
  }
  *out = DLDataType{code, static_cast<uint8_t>(i.bits), 1};
  return true;
}

pyb::object dlpack_capsule(const HandOff& h, DLDataType type, std::span<const int64_t> shape,
                           std::span<const int64_t> strides) {
  if (shape.size() > static_cast<size_t>(kMaxDims) || strides.size() != shape.size())
    throw pyb::value_error("dlpack_capsule: too many dimensions");
  auto* c = new Context;
  c->owner = h.owner;
  for (size_t k = 0; k < shape.size(); ++k) {
    c->shape[k] = shape[k];
    c->strides[k] = strides[k];
  }
  DLTensor& d = c->managed.dl_tensor;
  d.data = const_cast<std::byte*>(h.data);
  d.device = h.device;
  d.ndim = static_cast<int>(shape.size());
  d.dtype = type;
  d.shape = c->shape;
  d.strides = c->strides;
  d.byte_offset = 0;
  c->managed.manager_ctx = c;
  c->managed.deleter = delete_context;
  PyObject* cap = PyCapsule_New(&c->managed, "dltensor", drop_capsule);
  if (!cap) {
    delete c;
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::object>(cap);
}

pyb::object bytes_capsule(const HandOff& h) {
  const int64_t n = static_cast<int64_t>(h.nbytes), one = 1;
  return dlpack_capsule(h, DLDataType{kDLUInt, 8, 1}, {&n, 1}, {&one, 1});
}

PyObject* tensor_over(const HandOff& h, const TensorInfo& t, PyObject* from_dlpack) {
  DLDataType type;
  if (!h.data || !h.owner || !dl_type(t.dtype, &type) || t.shape.size() > kMaxDims) return nullptr;
  const uint64_t size = type.bits / 8;
  if (h.nbytes == 0 || h.nbytes % size) return nullptr;
  // The whole storage as the tensor itself, or as one dimension the caller re-strides.
  const bool whole = t.storage_offset == 0 && t.is_contiguous() && t.numel() * size == h.nbytes;
  const int64_t n = static_cast<int64_t>(h.nbytes / size), one = 1;
  pyb::object cap = whole ? dlpack_capsule(h, type, t.shape, t.strides)
                          : dlpack_capsule(h, type, {&n, 1}, {&one, 1});
  PyObject* tensor = PyObject_CallOneArg(from_dlpack, cap.ptr());
  if (!tensor) PyErr_Clear();  // the caller makes it another way and reports any error
  return tensor;
}

void add_span_type(pyb::module_& m) {
  PyObject* t = PyType_FromSpec(&span_spec);
  if (!t) throw pyb::error_already_set();
  span_type_ = reinterpret_cast<PyTypeObject*>(t);
  m.add_object("Span", pyb::reinterpret_borrow<pyb::object>(t));  // the module keeps one ref
}

bool span_view(PyObject* o, HandOff* out) {
  if (Py_TYPE(o) != span_type_) return false;
  SpanObject* s = as_span(o);
  *out = HandOff{s->data, static_cast<size_t>(s->size), owner_ref(s), s->device};
  return s->writable != 0;
}

PyObject* SpanMaker::make(const HandOff& h, bool writable) {
  PyObject*& cap = owners_[h.owner.get()];
  if (!cap) {
    cap = PyCapsule_New(new std::shared_ptr<const void>(h.owner), nullptr, drop_owner);
    if (!cap) throw pyb::error_already_set();
  }
  PyObject* o = span_type_->tp_alloc(span_type_, 0);
  if (!o) throw pyb::error_already_set();
  SpanObject* s = as_span(o);
  Py_INCREF(cap);
  s->owner = cap;
  s->data = h.data;
  s->size = static_cast<Py_ssize_t>(h.nbytes);
  s->writable = writable ? 1 : 0;
  s->device = h.device;
  return o;
}

SpanMaker::~SpanMaker() {
  for (auto& [k, cap] : owners_) Py_XDECREF(cap);
}

}  // namespace ckpt::py
