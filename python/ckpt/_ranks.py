"""Loading across ranks: ckpt.load(path, plan=..., group=...) (docs/python/memory.md,
"Loading across ranks"). A plan says how this rank holds each tensor: Shard(dim) (its
torch.chunk part along dim, as DTensor's Shard splits), Replicate() (whole), or an explicit box. The C++ library reads
only this rank's bytes, into host memory or through pinned staging straight into device memory;
for Replicate tensors each rank of the group reads 1/n of their bytes into place and each part
is broadcast from its rank (torch.distributed) into the others' tensors, so the group reads every
byte once.
"""

from . import _ckpt
from ._errors import IoError, InvalidArgumentError, error


class Shard:
    """This rank's contiguous part along ``dim`` (parts of ceil(size / n), as torch.chunk)."""

    def __init__(self, dim):
        self.dim = int(dim)

    def __repr__(self):
        return f"Shard({self.dim})"

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim


class Replicate:
    """The whole tensor on every rank."""

    def __repr__(self):
        return "Replicate()"

    def __eq__(self, other):
        return isinstance(other, Replicate)


class Box:
    """The same box [begin[d], end[d]) on every rank."""

    def __init__(self, begin, end):
        self.begin, self.end = [int(b) for b in begin], [int(e) for e in end]

    def __repr__(self):
        return f"Box({self.begin}, {self.end})"


class RankError(IoError):
    """A collective of a group load failed (a rank gone, a timeout): ``rank`` is this rank,
    ``tensor`` the first tensor being exchanged; the torch.distributed error is the cause."""

    def __init__(self, text, rank=None, tensor="", source=""):
        IoError.__init__(self, text, "io", source, tensor, None, text)
        self.rank, self.tensor = rank, tensor


def _placement(p, name="<plan>"):
    """(kind, dim, begin, end) for the C++ side, from ckpt's, DTensor's or a string."""
    if isinstance(p, (list, tuple)) and len(p) == 1:
        p = p[0]  # a 1-D mesh's placements
    if isinstance(p, str):
        if p == "replicate":
            return ("replicate", 0, [], [])
        if p.startswith("shard:") and p[6:].lstrip("-").isdigit():
            return ("shard", int(p[6:]), [], [])
    elif isinstance(p, Box):
        return ("box", 0, p.begin, p.end)
    elif isinstance(p, Shard) or (type(p).__name__ in ("Shard", "_StridedShard")
                                  and hasattr(p, "dim")):
        return ("shard", int(p.dim), [], [])
    elif isinstance(p, Replicate) or type(p).__name__ == "Replicate":
        return ("replicate", 0, [], [])
    raise error(InvalidArgumentError, f"{name}: a placement is ckpt.Shard(dim), ckpt.Replicate(), "
                f"ckpt.Box(begin, end), torch.distributed.tensor.Shard/Replicate or "
                f"'shard:DIM' / 'replicate', not {p!r}")


def _rules(ck, plan):
    """(rules, default) for _ckpt.load_ranks: a dict of patterns, a callable, or one placement
    for every tensor. Patterns are globs (fnmatch; '*' matches dots) or 're:REGEX'."""
    if plan is None:
        return [], ("replicate", 0, [], [])
    if callable(plan) and not isinstance(plan, type):
        rules = []
        for name, dt, shape in ck.infos_for_plan():
            p = plan(name, tuple(shape), dt)
            rules.append((name, "exact") + _placement(p, name))
        return rules, None
    if isinstance(plan, dict):
        rules = []
        for pattern, p in plan.items():
            pattern = str(pattern)
            if pattern.startswith("re:"):
                rules.append((pattern[3:], "regex") + _placement(p, pattern))
            else:
                rules.append((pattern, "glob") + _placement(p, pattern))
        return rules, ("replicate", 0, [], [])
    return [], _placement(plan)


class _Infos:
    """What a callable plan is asked about: each tensor's name, dtype and shape."""

    def __init__(self, ck, torch):
        self._ck, self._torch = ck, torch

    def infos_for_plan(self):
        for info in self._ck.tensor_infos():
            dt = info[1]
            if self._torch is not None:
                dt = getattr(self._torch, dt, dt)
            yield info[0], dt, info[2]


def _group_of(group, dist):
    """(process group, rank, world); a DeviceMesh-like (get_group) gives its group."""
    if group is not None and hasattr(group, "get_group") and hasattr(group, "ndim"):
        if group.ndim != 1:
            raise error(InvalidArgumentError, "a DeviceMesh of one dimension is supported")
        group = group.get_group()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise error(InvalidArgumentError, "group= needs torch.distributed initialized")
        return None, 0, 1
    return group, dist.get_rank(group), dist.get_world_size(group)


class _DeviceBytes:
    """`n` bytes of device memory at address `ptr`, as torch.as_tensor takes them (the CUDA array
    interface): a view, no copy."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2}


def _exchange(dist, torch, group, world, device, timeout, failure):
    """fn(round, cuts, ptr): one round of a group load assembled in place. Rank k's part, bytes
    [cuts[k] - cuts[0], cuts[k + 1] - cuts[0]) of the round, is broadcast from rank k into every
    other rank's memory: host memory (`round`, a memoryview) for gloo, device memory at `ptr`
    for a CUDA load (NCCL, or gloo's CUDA support). One broadcast per non-empty part, all started
    before any is waited on (at most `timeout` seconds); no buffer besides the tensors' own."""
    import datetime  # here, not at `import ckpt`

    wait = datetime.timedelta(seconds=timeout) if timeout else None
    glob = getattr(dist, "get_global_rank", None)
    ranks = [glob(group, k) if glob and group is not None else k for k in range(world)]

    def gather(round_, cuts, ptr):
        try:
            n = cuts[-1] - cuts[0]
            buf = (torch.frombuffer(round_, dtype=torch.uint8) if ptr is None else
                   torch.as_tensor(_DeviceBytes(ptr, n), device=device))
            works = []
            for k in range(world):
                a, b = cuts[k] - cuts[0], cuts[k + 1] - cuts[0]
                if b > a:
                    works.append(dist.broadcast(buf[a:b], src=ranks[k], group=group,
                                                async_op=True))
            for work in works:
                work.wait(wait) if wait else work.wait()
        except Exception as e:  # noqa: BLE001 - every failure of the collective is the group's
            failure.append(e)
            raise
    return gather


def load(ck, plan, group, device, verify, timeout, budget):
    """This rank's state dict (name -> tensor, plain tensors) under `plan` over `group`."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        torch = dist = None
    if torch is None:
        raise error(InvalidArgumentError, "plan= / group= need torch")
    group, rank, world = _group_of(group, dist)
    rules, default = _rules(_Infos(ck, torch), plan)
    device = device or "cpu"
    failure = []
    gather = _exchange(dist, torch, group, world, device, timeout, failure) if world > 1 else None
    try:
        loaded = _ckpt.load_ranks(ck, rules, default, rank, world, gather, int(budget),
                                  bool(verify), device)
    except IoError as e:
        if not failure:
            raise
        raise RankError(str(e), rank, e.record, e.source) from failure[0]
    out = {}
    for name, dt, shape, span in loaded:
        dtype = getattr(torch, dt)
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        if not nbytes:
            flat = torch.empty(0, dtype=torch.uint8, device=device)
        elif device == "cpu":
            flat = torch.frombuffer(span, dtype=torch.uint8)
        else:  # device memory the library loaded, handed over through DLPack
            flat = torch.from_dlpack(span)
        out[name] = flat.view(dtype).reshape(shape)
    return out


def bytes_read():
    """Bytes read through every source of this process so far (for tests and benchmarks)."""
    return _ckpt.process_bytes_read()


__all__ = ["Shard", "Replicate", "Box", "RankError", "load", "bytes_read"]
