#pragma once
// Shared pieces of the Python binding (ckpt._ckpt): the hand-off of bytes (DLPack), the C++
// tensor loops and the object-tree conversions. Public API only (<ckpt/...>); no format logic
// lives here.

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/ckpt.h"

#if PY_VERSION_HEX < 0x030A0000
// Py_NewRef and PySet_CheckExact are CPython 3.10's; pyproject.toml's requires-python is 3.9.
inline PyObject* Py_NewRef(PyObject* o) {
  Py_INCREF(o);
  return o;
}
inline bool PySet_CheckExact(PyObject* o) { return Py_IS_TYPE(o, &PySet_Type); }
#endif

namespace ckpt::py {

namespace pyb = pybind11;

// --- the hand-off (handoff.cc) -----------------------------------------------------------------

// Bytes handed to Python: `nbytes` at `data` on `device` (kDLCPU for what the library loads
// today; the caller names it, so a GPU destination passes kDLCUDA), kept alive by `owner` (the
// Storage, the eager load's arena or the file mapping) for as long as anything made over them.
struct HandOff {
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owner;
  DLDevice device{kDLCPU, 0};
};

// The DLPack type of a dtype that torch 1.13 and later take (floats, bfloat16, complex64/128,
// int8-64, uint8); false for the rest (bool, uint16-64, float8, complex32, quantized), which
// go over as bytes (bytes_capsule) and get their dtype on the torch side (ckpt._build).
bool dl_type(DType d, DLDataType* out);
// A DLPack capsule ("dltensor") over h's bytes with this type, shape and strides (elements). Its
// deleter drops a copy of h.owner, without the GIL; a capsule never consumed frees it when
// collected. Throws pyb::error_already_set / pyb::value_error (more than 16 dimensions).
pyb::object dlpack_capsule(const HandOff& h, DLDataType type, std::span<const int64_t> shape,
                           std::span<const int64_t> strides);
// The same, 1-D uint8 over every byte.
pyb::object bytes_capsule(const HandOff& h);
// from_dlpack(capsule) (torch.from_dlpack) for tensor `t` over the whole of h: `t` itself when it
// is every byte of h (contiguous, offset 0), else a 1-D tensor of t's dtype over every byte for
// the caller to re-stride. A new reference, or nullptr with no Python error set where not
// applicable (no DLPack type, not a whole number of elements, torch refused).
PyObject* tensor_over(const HandOff& h, const TensorInfo& t, PyObject* from_dlpack);

// Span (ckpt._ckpt.Span): the per-storage object the Python builder receives, a HandOff with
// __dlpack__/__dlpack_device__ and, for CPU memory, the buffer protocol (numpy).
void add_span_type(pyb::module_& m);  // registers ckpt._ckpt.Span; call once at import
// Fills *out from a Span and returns whether its consumer may write the bytes; false (out
// untouched) when `o` is not exactly a Span.
bool span_view(PyObject* o, HandOff* out);
// Makes Spans, one owner capsule per distinct owner (the arena or mapping most storages share).
class SpanMaker {
 public:
  SpanMaker() = default;
  SpanMaker(const SpanMaker&) = delete;
  SpanMaker& operator=(const SpanMaker&) = delete;
  ~SpanMaker();
  // A new reference; throws pyb::error_already_set.
  PyObject* make(const HandOff& h, bool writable);

 private:
  std::unordered_map<const void*, PyObject*> owners_;
};

// The HandOff of a loaded storage (owner: the storage's owner, else the storage itself).
inline HandOff hand_off(const StoragePtr& st) {
  const DLDevice where =
      st->device.is_cuda() ? DLDevice{kDLCUDA, st->device.index} : DLDevice{kDLCPU, 0};
  return HandOff{st->data, static_cast<size_t>(st->info.nbytes),
                 st->owner ? st->owner : std::shared_ptr<const void>(st), where};
}
// Whether Python may take the storage's bytes as its own tensor's: memory this load owns (host
// memory it allocated, a writable mapping, or a device allocation made for it).
inline bool owned(const StoragePtr& st) { return st->writable || !st->on_host(); }

// --- the Python Checkpoint (checkpoint.cc, reaper.cc) ------------------------------------------

// Checkpoints of at least reap_threshold() tensors are destroyed on a thread of their own
// (reaper.cc): freeing a 20,000-tensor checkpoint's tables takes ~3 ms that ckpt.load would
// otherwise spend after its tensors are made. The thread waits until no load runs (LoadScope).
void reap(Checkpoint&& c);
size_t& reap_threshold();
// A load in progress (ckpt.load and friends) for its whole duration: background frees wait.
struct LoadScope {
  LoadScope();
  ~LoadScope();
  LoadScope(const LoadScope&) = delete;
  LoadScope& operator=(const LoadScope&) = delete;
};
void drain_reaped();  // waits (up to 30 s) for background frees (atexit)

// _ckpt.Checkpoint: a Checkpoint, freed in the background when large.
struct PyCheckpoint {
  Checkpoint c;

  explicit PyCheckpoint(Checkpoint ck) : c(std::move(ck)) {}
  PyCheckpoint(PyCheckpoint&& o) noexcept : c(std::move(o.c)) { o.moved = true; }
  PyCheckpoint(const PyCheckpoint&) = default;
  PyCheckpoint& operator=(const PyCheckpoint&) = delete;
  ~PyCheckpoint() {
    if (!moved && reap_threshold() && c.tensors().size() >= reap_threshold()) reap(std::move(c));
  }
  bool moved = false;  // `c` was moved out: nothing to free
};

OpenOptions open_options(bool strict, const std::string& key, const std::string& password);
// `device`: "cpu", "cuda" or "cuda:N" (Device::parse; invalid ones throw ckpt.Error).
LoadOptions load_options(bool verify, int threads, const std::string& device = "cpu");
// For a CUDA device where torch is imported: torch's caching allocator (torch_alloc.cc), one
// allocation per storage; else null (the load's one arena).
std::shared_ptr<DeviceAllocator> torch_device_allocator(const Device& device);
void bind_checkpoint(pyb::module_& m);  // _ckpt.Checkpoint
void bind_load(pyb::module_& m);        // _ckpt.load, _ckpt.load_checkpoint
void bind_save(pyb::module_& m);        // _ckpt.save_torch, save_safetensors, save_tensorizer
void bind_process(pyb::module_& m);     // kept memory, reaping, error exit statuses
void bind_ranks(pyb::module_& m);       // _ckpt.load_ranks, _ckpt.resolve_ranks (ranks.cc)
void bind_load_into(pyb::module_& m);   // _ckpt.load_into (load_into.cc)
// Spans of every storage in `which` (None for the rest), a writable view or owned memory each:
// a read-only view (a sharded set's shards, which the library maps itself) is copied.
pyb::list storage_spans(const Checkpoint& c, const std::vector<size_t>& which,
                        const LoadOptions& lo);
// Spans of the storages of loaded tensors (by storage index, None where no tensor uses one).
pyb::list loaded_spans(const Checkpoint& c, const std::vector<Tensor>& loaded);

// --- progress (progress.cc) ------------------------------------------------------------------

// A Python callable `fn(done, total)` (bytes) behind the library's ProgressFn: called with the
// GIL taken, at most every 100 ms and once more at the end; it runs on whichever thread reports.
// An exception it raises is kept for rethrow(): report() then throws a ckpt::Error (a save
// stops at its next write), fn() swallows it (a load, whose reader threads cannot throw, runs
// to its end without further reports). Lives on the stack of a bound function, across the
// GIL-free operation.
class PyProgress {
 public:
  explicit PyProgress(pyb::object fn);  // None: no progress (fn() is empty)
  ~PyProgress();
  PyProgress(const PyProgress&) = delete;
  PyProgress& operator=(const PyProgress&) = delete;
  bool active() const { return !fn_.is_none(); }
  ProgressFn fn();
  // Calls fn (throttled unless `last`). Called without the GIL. Throws Error after fn raised.
  void report(uint64_t done, uint64_t total, bool last);
  // With the GIL: rethrows the callback's exception, if it raised one. When the output was
  // committed first, the exception says so: ckpt_committed = True and a note naming the file.
  void rethrow();
  // The output `name` is complete and in place (called before the report that follows commit).
  void set_committed(const std::string& name) { committed_ = name; }

 private:
  pyb::object fn_;
  ProgressThrottle pace_;  // when fn is called (its turn serializes the calls)
  std::atomic<bool> raised_{false};
  std::optional<pyb::error_already_set> error_;
  std::string committed_;
};

// --- tensors (tensors.cc) ---------------------------------------------------------------------

// Small Python values made without pybind11's casts (a tuple of ints; a dtype's name, interned).
pyb::tuple int_tuple(const std::vector<int64_t>& v);
pyb::object dtype_str(DType d);
// torch tensors made in C++ for the common case, see tensors.cc. `storages` is a list by
// storage index (a Span, or None); `tensors` a list by tensor index (None: not made yet).
// Returns how many tensors exist afterwards.
size_t plain_tensors(const Checkpoint& c, const pyb::list& storages, const pyb::list& tensors,
                     PyObject* from_dlpack);
// mmap: tensors straight over a writable mapping's views (Checkpoint::view), with no Span;
// returns the storage indices that the tensors it did not make need.
std::vector<size_t> view_tensors(const Checkpoint& c, const pyb::list& storages,
                                 const pyb::list& tensors, PyObject* from_dlpack);

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
  // After convert threw: where the value it failed on is, as Python would index it from the
  // root ("a.b[1]", "['k'][0]" for a non-str key; "" for the root itself).
  std::string path() const;
  // Adds a key segment to the path being unwound (a caller's own container).
  void at(pyb::handle key) { where_.push_back(key_segment(key)); }
  // Runs f (a conversion); an error it throws names path() as its record: a ckpt::Error is
  // rethrown with the record, a Python ckpt.Error (from ckpt._tree) is remade with it.
  template <class F>
  auto located(F&& f) -> decltype(f());

 private:
  std::vector<std::string> where_;  // path segments, innermost first, filled while unwinding
  void convert_items(pyb::handle seq, std::vector<ValuePtr>& out, uint32_t depth);
  void convert_entries(pyb::handle pairs, std::vector<std::pair<ValuePtr, ValuePtr>>& out,
                       uint32_t depth);
  static std::string key_segment(pyb::handle key);
  std::unordered_map<PyObject*, ValuePtr> memo_;
  std::unordered_set<PyObject*> open_;  // being converted: met again, a reference cycle
  std::unordered_map<uintptr_t, StoragePtr> storages_;
  std::unordered_map<PyObject*, size_t> tensor_of_;
  ValuePtr tensor(pyb::handle obj, const pyb::tuple& d);
};

template <class F>
auto PyToValue::located(F&& f) -> decltype(f()) {
  where_.clear();
  try {
    return f();
  } catch (Error& e) {
    if (!where_.empty()) e.with_record(path());
    throw;
  } catch (pyb::error_already_set& e) {
    if (where_.empty()) throw;
    pyb::object errors = pyb::module_::import("ckpt._errors");
    pyb::object again = errors.attr("at_record")(e.value(), path());
    if (again.is_none()) throw;
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(again.ptr())), again.ptr());
    throw pyb::error_already_set();
  }
}

}  // namespace ckpt::py
