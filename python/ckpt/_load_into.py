"""ckpt.load_into: a checkpoint's tensors copied into the tensors a module (or a state dict)
already has, in place, by one call into the library (no Python copy loop)."""

import collections
import os

from . import _ckpt
from ._errors import InvalidArgumentError, error

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", "missing_keys unexpected_keys")


def _targets(module_or_state_dict):
    import torch
    if isinstance(module_or_state_dict, torch.nn.Module):
        return module_or_state_dict.state_dict(keep_vars=True), type(module_or_state_dict).__name__
    return module_or_state_dict, "state_dict"


def load_into(module_or_state_dict, path, *, strict=True, verify=False, cast=False, threads=0):
    """Copies the tensors of checkpoint ``path`` into the existing tensors of a module (its
    state_dict: parameters and persistent buffers) or of a state dict, in place: every tensor
    keeps its storage (data_ptr), so tied weights stay tied and optimizers keep their references.
    CPU and CUDA tensors alike (a CUDA one is filled through pinned staging; no device memory is
    allocated). Shapes must match; dtypes too unless ``cast`` (then the file's dtype is read into
    a temporary and copied with a cast). ``strict``: like torch's load_state_dict, keys missing
    from the file or unexpected in it raise InvalidArgumentError naming them; otherwise they are
    returned. Returns (missing_keys, unexpected_keys). Everything is checked before any byte is
    read."""
    import torch
    targets, what = _targets(module_or_state_dict)
    from . import Checkpoint
    ck = Checkpoint(path)._ck
    entries = dict(ck.state_dict_entries())
    infos = ck.tensor_infos()
    missing = [k for k in targets if k not in entries]
    unexpected = [k for k in entries if k not in targets]
    if strict and (missing or unexpected):
        raise error(InvalidArgumentError, f"cannot load into {what}: missing keys {missing}, "
                    f"unexpected keys {unexpected}", os.fsdecode(path))
    by_device, after, seen = {}, [], {}
    for name, dst in targets.items():
        if name not in entries:
            continue
        i = entries[name]
        info = infos[i]
        shape = tuple(info[2])
        if tuple(dst.shape) != shape:
            raise error(InvalidArgumentError, f"size mismatch for {name}: the file has {shape}, "
                        f"the destination {tuple(dst.shape)}", os.fsdecode(path), name)
        dtype = getattr(torch, info[1])
        tmp = None
        if dst.dtype != dtype:
            if not cast:
                raise error(InvalidArgumentError, f"dtype mismatch for {name}: the file has "
                            f"{dtype}, the destination {dst.dtype} (pass cast=True)",
                            os.fsdecode(path), name)
            tmp = torch.empty(shape, dtype=dtype, device=dst.device)
        elif not dst.is_contiguous():
            tmp = torch.empty(shape, dtype=dtype, device=dst.device)
        into = dst if tmp is None else tmp
        key = (into.data_ptr(), into.device)
        if into.numel() and key in seen:  # tied: the same memory, loaded once
            continue
        seen[key] = name
        dev = "cpu" if into.device.type == "cpu" else f"cuda:{into.device.index or 0}"
        by_device.setdefault(dev, []).append(
            (i, into.data_ptr(), into.numel() * into.element_size(), str(dtype), dev))
        if tmp is not None:
            after.append((dst, tmp))
    with torch.no_grad():
        for dev, dests in by_device.items():
            _ckpt.load_into(ck, dests, dev, verify, threads)
        for dst, tmp in after:
            dst.copy_(tmp)
    return IncompatibleKeys(missing, unexpected)
