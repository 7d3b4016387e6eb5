// _ckpt.load_into: one call that copies a checkpoint's tensors into memory Python owns (the
// data_ptr of existing torch tensors), through ckpt::load_into (include/ckpt/load_into.h).

#include "ckpt/load_into.h"

#include <map>

#include "binding.h"

namespace ckpt::py {

void bind_load_into(pyb::module_& m) {
  // dests: [(tensor index, address, bytes, dtype name, device)], every device the same as
  // `device` ("cpu", "cuda:N"). Raises like ckpt::load_into, before any read for a bad entry.
  m.def(
      "load_into",
      [](const PyCheckpoint& p, const pyb::list& dests, const std::string& device, bool verify,
         int threads) {
        const auto& infos = p.c.tensors();
        std::map<std::string, Destination> into;
        for (const pyb::handle item : dests) {
          auto t = item.cast<pyb::tuple>();
          const auto index = t[0].cast<size_t>();
          if (index >= infos.size())
            throw Error(ErrorCode::kInvalidArgument,
                        "load_into: no tensor " + std::to_string(index));
          const auto dtype = dtype_from_name(t[3].cast<std::string>());
          if (!dtype)
            throw Error(ErrorCode::kInvalidArgument,
                        "load_into: unknown dtype " + t[3].cast<std::string>(), {},
                        infos[index].name);
          Destination d;
          d.data = reinterpret_cast<void*>(t[1].cast<uintptr_t>());
          d.bytes = t[2].cast<uint64_t>();
          d.dtype = *dtype;
          d.device = Device::parse(t[4].cast<std::string>());
          into[infos[index].name] = d;
        }
        LoadOptions o;
        o.device = Device::parse(device);
        o.verify = verify;
        o.threads = threads;
        pyb::gil_scoped_release nogil;
        load_into(p.c, into, o);
      },
      pyb::arg("checkpoint"), pyb::arg("dests"), pyb::arg("device"), pyb::arg("verify") = false,
      pyb::arg("threads") = 0);
}

}  // namespace ckpt::py
