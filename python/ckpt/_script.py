"""The state dict ckpt.load returns for a TorchScript archive (torch.jit.save).

The library lists the parameters and buffers of every module path (Checkpoint.
state_dict_entries). Quantized Linear modules (torch.ao.nn.quantized Linear, static or
dynamic) keep their weights elsewhere: in a `LinearPackedParams` submodule whose
`_packed_params` attribute is a `torch.classes.quantized.LinearPackedParamsBase` object,
pickled as that object's state, the tuple (weight, bias). torch.jit.load(...).state_dict()
lists none of it (the scripted module has no parameters or buffers); the module that was
scripted, `quantize_dynamic(model).state_dict()`, has, per quantized Linear at path Q:

    Q.scale                    0-d float32 tensor of the module's `scale` attribute
    Q.zero_point               0-d int64 tensor of its `zero_point` attribute
    Q._packed_params.dtype     the packed weight's dtype (torch.qint8; torch.float16 for fp16)
    Q._packed_params._packed_params   (weight, bias)

in that order, after Q's own parameters and buffers and before its submodules' entries, with
the layouts' versions in `_metadata` (Q: its `version` attribute, else 3; Q._packed_params:
3), which load_state_dict needs. ckpt.load returns those entries too, read from the pickled
state as data (nothing of the file runs, no torch op unpacks anything), so
`quantize_dynamic(model).load_state_dict(ckpt.load("scripted.pt"))` works. Only with torch
(the entries are torch objects). Parameters come detached, as state_dict() gives them.
"""

import collections

# c10::ScalarType codes a LinearPackedParams module stores as its `dtype` attribute.
_SCALAR_TYPES = {5: "float16", 6: "float32", 12: "qint8", 13: "quint8"}
_MAX_VISITS = 1 << 20


def state_dict(ck, tensors, tree, use_torch):
    """OrderedDict name -> value for TorchScript checkpoint `ck` whose tensors are `tensors`;
    `tree()` gives its object tree (called only when some tensor is not in the library's
    state dict: packed parameters are such tensors)."""
    entries = ck.state_dict_entries()
    # As Module.state_dict() gives them: parameters detached (requires_grad=False, the same
    # storage), one tensor per name.
    sd = collections.OrderedDict((n, _detached(tensors[i])) for n, i in entries)
    if not use_torch or len({i for _, i in entries}) >= len(tensors):
        return sd
    import torch
    tokens = _walk(tree(), torch)
    groups = [t for t in tokens if t[0] == "x"]
    if not groups:
        return sd
    # Each group goes before the first library entry the walk reached after it (the library
    # walks the same attributes in the same order), else at the end.
    pos = {n: k for k, (n, _) in enumerate(entries)}
    before = collections.defaultdict(list)
    at = len(entries)
    for tok in reversed(tokens):
        if tok[0] == "t":
            at = pos.get(tok[1], at)
        else:
            before[at][:0] = tok[1]
    out = collections.OrderedDict()
    # load_state_dict reads these layouts only with their version numbers (a module without
    # one is taken for the oldest layout, weight and bias of its own).
    out._metadata = collections.OrderedDict(m for t in groups for m in t[2])
    for k, (n, i) in enumerate(entries):
        for name, value in before.get(k, ()):
            out[name] = value
        out[n] = sd[n]
    for name, value in before.get(len(entries), ()):
        out[name] = value
    return out


def _detached(t):
    return t.detach() if getattr(t, "requires_grad", False) else t


def _module(o):
    """The attribute dict of a scripted module object (an Opaque __torch__ class), or None."""
    from ._tree import Opaque
    if isinstance(o, Opaque) and o.module.startswith("__torch__.") and isinstance(o.state, dict):
        return o.state
    return None


def _packed(o, torch):
    """(dtype, (weight, bias)) of a LinearPackedParams module's attributes, or None."""
    from ._tree import Opaque
    st = _module(o)
    if st is None or o.name != "LinearPackedParams":
        return None
    base, code = st.get("_packed_params"), st.get("dtype")
    if not (isinstance(base, Opaque) and base.name == "LinearPackedParamsBase" and
            base.module.startswith("__torch__.torch.classes.") and isinstance(code, int) and
            not isinstance(code, bool)):
        return None
    wb = base.state
    if not (isinstance(wb, tuple) and len(wb) == 2 and isinstance(wb[0], torch.Tensor) and
            (wb[1] is None or isinstance(wb[1], torch.Tensor))):
        return None
    name = _SCALAR_TYPES.get(code)
    dtype = getattr(torch, name) if name else code
    return dtype, wb


def _walk(root, torch):
    """Tokens in the library's walk order (module attributes in their pickled order, depth
    first): ("t", name) for a tensor attribute of a module, ("x", [(name, value)...]) for the
    entries a quantized Linear adds where its _packed_params attribute is."""
    tokens = []
    if _module(root) is None:
        return tokens
    stack = [("", root, iter(root.state.items()))]
    on_path = {id(root)}
    visits = 0
    while stack:
        prefix, obj, it = stack[-1]
        item = next(it, None)
        if item is None:
            stack.pop()
            on_path.discard(id(obj))
            continue
        k, v = item
        if not isinstance(k, str):
            continue
        name = prefix + k
        if isinstance(v, torch.Tensor):
            tokens.append(("t", name))
            continue
        st = _module(v)
        if st is None or id(v) in on_path:
            continue
        packed = _packed(v, torch) if k == "_packed_params" else None
        if packed is not None:
            group = []
            scale, zp = obj.state.get("scale"), obj.state.get("zero_point")
            if isinstance(scale, float) and isinstance(zp, int) and not isinstance(zp, bool):
                group += [(prefix + "scale", torch.tensor(scale)),
                          (prefix + "zero_point", torch.tensor(zp))]
            group += [(name + ".dtype", packed[0]), (name + "._packed_params", packed[1])]
            # Versions of these layouts: LinearPackedParams 3 (dtype and the (weight, bias)
            # tuple); the quantized Linear 3 (scale, zero_point and a LinearPackedParams
            # submodule), or the version a dynamic one keeps as an attribute (4: reduce_range).
            version = obj.state.get("version")
            if not isinstance(version, int) or isinstance(version, bool):
                version = 3
            meta = [(prefix[:-1], {"version": version}), (name, {"version": 3})]
            tokens.append(("x", group, meta))
            continue
        visits += 1
        if visits > _MAX_VISITS:
            break  # a pathological DAG of shared modules: what was found so far
        on_path.add(id(v))
        stack.append((name + ".", v, iter(st.items())))
    return tokens
