// ckpt._ckpt.Span: a storage's bytes through the buffer protocol, made without pybind11.
//
// A load hands Python one buffer per storage (20,000 for a 20,000-tensor checkpoint). As a
// pybind11 object each cost ~0.3 us (instance registration, a shared_ptr holder); a Span is a
// plain C object: a pointer, a length and a reference to the object that keeps the bytes alive
// (one capsule per distinct owner: the arena of an eager load, or the file mapping).

#include "binding.h"

namespace ckpt::py {
namespace {

struct SpanObject {
  PyObject_HEAD
  PyObject* owner;
  const std::byte* data;
  Py_ssize_t size;
  int writable;
};

void span_dealloc(PyObject* self) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(s->owner);
  type->tp_free(self);
  Py_DECREF(type);  // heap type: instances hold a reference to it
}

int span_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  return PyBuffer_FillInfo(view, self, const_cast<std::byte*>(s->data), s->size,
                           s->writable ? 0 : 1, flags);
}

Py_ssize_t span_length(PyObject* self) { return reinterpret_cast<SpanObject*>(self)->size; }

PyObject* span_writable(PyObject* self, void*) {
  return PyBool_FromLong(reinterpret_cast<SpanObject*>(self)->writable);
}

PyGetSetDef span_getset[] = {
    {"writable", span_writable, nullptr, "whether torch may write the bytes", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot span_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(span_dealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(span_getbuffer)},
    {Py_sq_length, reinterpret_cast<void*>(span_length)},
    {Py_tp_getset, span_getset},
    {Py_tp_doc, const_cast<char*>("Bytes of one storage (buffer protocol); alive while used.")},
    {0, nullptr}};

PyType_Spec span_spec = {"ckpt._ckpt.Span", sizeof(SpanObject), 0, Py_TPFLAGS_DEFAULT,
                         span_slots};

PyTypeObject* span_type_ = nullptr;

void drop_owner(PyObject* capsule) {
  delete static_cast<std::shared_ptr<const void>*>(PyCapsule_GetPointer(capsule, nullptr));
}

}  // namespace

PyTypeObject* span_type() { return span_type_; }

void add_span_type(pyb::module_& m) {
  PyObject* t = PyType_FromSpec(&span_spec);
  if (!t) throw pyb::error_already_set();
  span_type_ = reinterpret_cast<PyTypeObject*>(t);
  m.add_object("Span", pyb::reinterpret_borrow<pyb::object>(t));  // the module keeps one ref
}

const std::byte* span_data(PyObject* o, size_t* size) {
  if (Py_TYPE(o) != span_type_) return nullptr;
  auto* s = reinterpret_cast<SpanObject*>(o);
  *size = static_cast<size_t>(s->size);
  return s->data;
}

const std::shared_ptr<const void>* span_owner(PyObject* o) {
  if (Py_TYPE(o) != span_type_) return nullptr;
  PyObject* cap = reinterpret_cast<SpanObject*>(o)->owner;
  if (!cap) return nullptr;
  return static_cast<const std::shared_ptr<const void>*>(PyCapsule_GetPointer(cap, nullptr));
}

bool span_writable(PyObject* o) {
  return Py_TYPE(o) == span_type_ && reinterpret_cast<SpanObject*>(o)->writable;
}

PyObject* SpanMaker::make(const std::byte* data, size_t size,
                          const std::shared_ptr<const void>& owner, bool writable) {
  PyObject*& cap = owners_[owner.get()];
  if (!cap) {
    cap = PyCapsule_New(new std::shared_ptr<const void>(owner), nullptr, drop_owner);
    if (!cap) throw pyb::error_already_set();
  }
  PyObject* o = span_type_->tp_alloc(span_type_, 0);
  if (!o) throw pyb::error_already_set();
  auto* s = reinterpret_cast<SpanObject*>(o);
  Py_INCREF(cap);
  s->owner = cap;
  s->data = data;
  s->size = static_cast<Py_ssize_t>(size);
  s->writable = writable ? 1 : 0;
  return o;
}

SpanMaker::~SpanMaker() {
  for (auto& [k, cap] : owners_) Py_XDECREF(cap);
}

}  // namespace ckpt::py
