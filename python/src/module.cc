// ckpt._ckpt: the C++ half of the Python module. It opens checkpoints, moves bytes with the GIL
// released, hands them over through DLPack (handoff.cc), makes the common tensors and the object
// tree in C++ (tensors.cc, load.cc, tree.cc); python/ckpt/ makes the rest. Errors become
// ckpt.Error subclasses.

#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <utility>

#include "binding.h"

namespace ckpt::py {
namespace {

// Library messages name the library's options; a Python caller sets keywords.
std::string python_words(std::string s) {
  static const std::pair<const char*, const char*> kKeywords[] = {
      {"SafetensorsSaveOptions::copy_shared", "copy_shared=True"},
      {"TargetSettings::alignment", "alignment="},
      {"TargetSettings::copy_shared", "copy_shared="},
      {"TargetSettings::meta", "meta="},
      {"TargetSettings::store_digests", "store_digests="},
      {"TargetSettings::encryption", "key= / key_file= / password="},
      {"TargetSettings::dcp_files", "dcp_files="},
      {"ConvertOptions::max_shard_size", "max_shard_size="},
      {"SafetensorsSaveOptions::meta = MetaTensors::kZeros", "meta='zeros'"},
      {"MetaTensors::kSkip", "meta='skip'"},
      {"OpenOptions::decrypt_key", "key="},
      {"OpenOptions::decrypt_password", "password="},
  };
  for (const auto& [option, keyword] : kKeywords)
    for (size_t at; (at = s.find(option)) != std::string::npos;)
      s.replace(at, std::strlen(option), keyword);
  return s;
}

void raise_error(const Error& e) {
  try {
    pyb::module_ errors = pyb::module_::import("ckpt._errors");
    pyb::object cls =
        errors.attr("class_for")(error_code_name(e.code()), text(python_words(e.message())));
    pyb::object offset = e.offset() ? pyb::object(pyb::int_(*e.offset())) : pyb::none();
    pyb::object exc = cls(text(python_words(e.what())), error_code_name(e.code()), text(e.source()),
                          text(e.record()), offset, text(python_words(e.message())));
    PyErr_SetObject(cls.ptr(), exc.ptr());
  } catch (pyb::error_already_set& err) {
    err.restore();
  }
}

}  // namespace

void bind_process(pyb::module_& m) {
  m.def(
      "set_reap_threshold", [](size_t n) { reap_threshold() = n; },
      "Checkpoints of at least n tensors are freed on a thread of their own (0: never).");
  m.def("drain_reaped", &drain_reaped,
        "Waits (up to 30 s) until checkpoints freed on background threads are gone (atexit).");
  m.def(
      "set_kept_memory_limit", [](uint64_t b) { set_kept_memory_limit(b); }, pyb::arg("max_bytes"));
  m.def("kept_memory_limit", [] { return kept_memory_limit(); });
  m.def("release_kept_memory", [] {
    pyb::gil_scoped_release nogil;
    return release_kept_memory();
  });
  m.def("kept_memory", [] { return kept_memory(); });
  m.def("error_exit_status", [](const std::string& name) {
    for (int c = 0; c <= static_cast<int>(ErrorCode::kAuth); ++c)
      if (name == error_code_name(static_cast<ErrorCode>(c)))
        return exit_status(static_cast<ErrorCode>(c));
    return 1;
  });
}

}  // namespace ckpt::py

PYBIND11_MODULE(_ckpt, m) {
  using namespace ckpt::py;
  m.doc() = "C++ core of the ckpt module (use the `ckpt` package, not this).";
  // Local: called for exceptions of this module's functions only, never for another pybind11
  // module's (torch's, say: the library's classes are hidden, their typeinfo is this module's).
  pyb::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ckpt::Error& e) {
      raise_error(e);
    }
  });
  add_span_type(m);
  bind_checkpoint(m);
  bind_load(m);
  bind_save(m);
  bind_process(m);
  bind_ranks(m);
  bind_load_into(m);
}
