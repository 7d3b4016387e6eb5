// _ckpt.save_torch / save_safetensors / save_tensorizer / save_dcp: Python objects -> the object
// tree (tree.cc, PyToValue) -> the library's writers, the bytes written with the GIL released.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "binding.h"

namespace ckpt::py {
namespace {

// items: [(name, tensor)], each tensor described by ckpt._tree.describe_tensor.
std::vector<Tensor> named_tensors(PyToValue& conv, const pyb::list& items) {
  std::vector<Tensor> out;
  for (auto it : items) {
    auto pair = it.cast<pyb::tuple>();
    ValuePtr v = conv.located([&] {
      try {
        return conv.convert(pair[1]);
      } catch (...) {
        conv.at(pair[0]);  // the tensor's name
        throw;
      }
    });
    if (v->kind() != Value::Kind::kTensor)
      throw Error(ErrorCode::kInvalidArgument, "not a tensor: " + pair[0].cast<std::string>());
    Tensor t = conv.tensors[v->tensor_index()];
    t.info().name = pair[0].cast<std::string>();
    out.push_back(std::move(t));
  }
  return out;
}

// Bytes of the distinct storages: what a writer is about to put in the file, about.
uint64_t storage_bytes(const std::vector<Tensor>& tensors) {
  std::unordered_set<const Storage*> seen;
  uint64_t n = 0;
  for (const Tensor& t : tensors)
    if (t.storage() && seen.insert(t.storage().get()).second) n += t.storage()->info.nbytes;
  return n;
}

// Writes to `path` with `write(path)`, or, with a progress callback, through a file sink that
// reports the bytes written (atomic as the path overloads are; fsync as asked).
template <class ToPath, class ToSink>
void write_file(const std::string& path, bool fsync, PyProgress& progress, uint64_t total,
                ToPath&& to_path, ToSink&& to_sink) {
  try {
    pyb::gil_scoped_release nogil;
    if (!progress.active()) {
      to_path();
    } else {
      FileSinkOptions so;
      so.fsync = fsync;
      std::unique_ptr<ByteSink> file = create_file_sink(path, so);
      // PyProgress throttles (and takes the GIL): every write is offered to it. Until the
      // commit, done stays below total (a header can carry the count past the tensor bytes):
      // only the call after the commit has done == total.
      ProgressSink sink(
          *file, total,
          [&progress](uint64_t done, uint64_t all) {
            progress.report(done, std::max(all, done + 1), false);
          },
          std::chrono::steady_clock::duration::zero());
      to_sink(sink);  // commits
      progress.set_committed(path);
      progress.report(sink.position(), sink.position(), true);
    }
  } catch (const Error&) {
    progress.rethrow();
    throw;
  }
}

void save_torch_py(const std::string& path, pyb::handle obj, const pyb::module_& helpers,
                   uint32_t alignment, const std::string& archive_name, bool fsync,
                   const pyb::object& progress_fn) {
  PyToValue conv(helpers, false);
  ValuePtr root = conv.located([&] { return conv.convert(obj); });
  SaveOptions o;
  if (alignment) o.alignment = alignment;
  o.archive_name = archive_name;
  o.fsync = fsync;
  PyProgress progress(progress_fn);
  write_file(
      path, fsync, progress, storage_bytes(conv.tensors),
      [&] { save_torch(path, root, conv.tensors, o); },
      [&](ByteSink& sink) {
        save_torch(sink, root, conv.tensors, o);
        sink.commit();
      });
}

// A DCP folder (save_dcp): written whole, then one progress call at the end.
void save_dcp_py(const std::string& path, pyb::handle obj, const pyb::module_& helpers,
                 uint32_t files, bool fsync, const pyb::object& progress_fn) {
  PyToValue conv(helpers, false);
  ValuePtr root = conv.located([&] { return conv.convert(obj); });
  DcpSaveOptions o;
  o.files = files;
  o.fsync = fsync;
  PyProgress progress(progress_fn);
  const uint64_t total = storage_bytes(conv.tensors);
  try {
    pyb::gil_scoped_release nogil;
    save_dcp(path, root, conv.tensors, o);
    progress.set_committed(path);
    if (progress.active()) progress.report(total, total, true);
  } catch (const Error&) {
    progress.rethrow();
    throw;
  }
}

void save_safetensors_py(const std::string& path, const pyb::list& items,
                         std::map<std::string, std::string> metadata, const pyb::module_& helpers,
                         uint64_t alignment, bool fsync, const pyb::object& progress_fn,
                         bool copy_shared, bool store_digests) {
  PyToValue conv(helpers, true);
  std::vector<Tensor> tensors = named_tensors(conv, items);
  SafetensorsSaveOptions o;
  if (alignment) o.alignment = alignment;
  o.fsync = fsync;
  o.copy_shared = copy_shared;
  if (store_digests) {
    // Each tensor's SHA-256 under kSafetensorsDigestKey, as `ckpt convert --digests` stores them
    // (`ckpt verify` and Checkpoint.digest() check them).
    pyb::gil_scoped_release nogil;
    std::vector<TensorDigest> digests;
    for (const Tensor& t : tensors) {
      TensorDigest d;
      d.name = t.info().name;
      d.dtype = t.dtype();
      d.shape = t.info().shape;
      d.sha256 = tensor_sha256(t);
      digests.push_back(std::move(d));
    }
    metadata[kSafetensorsDigestKey] = safetensors_digest_metadata(digests);
  }
  PyProgress progress(progress_fn);
  write_file(
      path, fsync, progress, storage_bytes(tensors),
      [&] { save_safetensors(path, tensors, metadata, o); },
      [&](ByteSink& sink) {
        save_safetensors(sink, tensors, metadata, o);
        sink.commit();
      });
}

pyb::bytes save_tensorizer_py(const std::string& path, const pyb::list& items,
                              const pyb::module_& helpers, const std::string& key,
                              const std::string& password, bool fsync,
                              const pyb::object& progress_fn) {
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
  o.fsync = fsync;
  std::string raw_key;
  PyProgress progress(progress_fn);
  write_file(
      path, fsync, progress, storage_bytes(tensors),
      [&] { raw_key = save_tensorizer(path, tensors, o); },
      [&](ByteSink& sink) {
        std::vector<TensorizerEntry> entries(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) entries[i].tensor = tensors[i];
        raw_key = save_tensorizer(sink, entries, o);
        sink.commit();
      });
  return pyb::bytes(raw_key);
}

}  // namespace

void bind_save(pyb::module_& m) {
  m.def("save_torch", &save_torch_py);
  m.def("save_safetensors", &save_safetensors_py);
  m.def("save_tensorizer", &save_tensorizer_py);
  m.def("save_dcp", &save_dcp_py);
}

}  // namespace ckpt::py
