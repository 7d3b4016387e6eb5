"""Loading across ranks: ckpt.load(path, plan=..., group=...) (docs/python.md, "Loading across
ranks"). A plan says how this rank holds each tensor: Shard(dim) (its torch.chunk part along
dim, as DTensor's Shard splits), Replicate() (whole), or an explicit box. The C++ library reads
only this rank's bytes; for Replicate tensors each rank of the group reads 1/n of their bytes
and torch.distributed's all-gather assembles the rest, so the group reads every byte once.
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


def _gatherer(dist, torch, group, world, timeout, failure):
    """fn(mine, all): all-gather of equal byte buffers over the group (NCCL: through the
    device; gloo and others: CPU tensors), waiting at most `timeout` seconds."""
    nccl = dist.get_backend(group) == "nccl"
    import datetime  # here, not at `import ckpt`

    wait = datetime.timedelta(seconds=timeout) if timeout else None

    def gather(mine, all_):
        try:
            src = torch.frombuffer(mine, dtype=torch.uint8) if len(mine) else \
                torch.empty(0, dtype=torch.uint8)
            dst = torch.frombuffer(all_, dtype=torch.uint8)
            if nccl:
                dev = torch.device("cuda", torch.cuda.current_device())
                out = torch.empty(dst.numel(), dtype=torch.uint8, device=dev)
                work = dist.all_gather_into_tensor(out, src.to(dev), group=group, async_op=True)
                work.wait(wait) if wait else work.wait()
                dst.copy_(out.cpu())
            else:
                outs = list(dst.view(world, -1).unbind(0))
                work = dist.all_gather(outs, src, group=group, async_op=True)
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
    failure = []
    gather = _gatherer(dist, torch, group, world, timeout, failure) if world > 1 else None
    try:
        loaded = _ckpt.load_ranks(ck, rules, default, rank, world, gather, int(budget),
                                  bool(verify))
    except IoError as e:
        if not failure:
            raise
        raise RankError(str(e), rank, e.record, e.source) from failure[0]
    out = {}
    for name, dt, shape, span in loaded:
        dtype = getattr(torch, dt)
        flat = torch.frombuffer(span, dtype=torch.uint8) if len(memoryview(span)) else \
            torch.empty(0, dtype=torch.uint8)
        t = flat.view(dtype).reshape(shape)
        out[name] = t if device in (None, "cpu") else t.to(device)
    return out


def bytes_read():
    """Bytes read through every source of this process so far (for tests and benchmarks)."""
    return _ckpt.process_bytes_read()


__all__ = ["Shard", "Replicate", "Box", "RankError", "load", "bytes_read"]
