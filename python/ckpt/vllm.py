"""vLLM's load format "ckpt": ``LLM(model=DIR, load_format="ckpt")`` reads the weights through ckpt.

    import ckpt.vllm                      # registers "ckpt" (also done by the installed wheel's
    from vllm import LLM                  # vllm.general_plugins entry point, in every process)
    llm = LLM(model="path/to/model", load_format="ckpt")

The model folder (what ``save_pretrained`` writes: ``model.safetensors``, its index and shards,
or ``pytorch_model.bin``) is opened as one checkpoint (``ckpt.safe_open``: mapped, tensors are
zero-copy views where the bytes are stored raw), and its tensors go, under their file names,
through the model's own ``load_weights``: vLLM's name mapping, the stacking of q/k/v and
gate/up into one parameter, tied embeddings and tensor-parallel slicing all apply as for
vLLM's own loaders. Each parameter's ``weight_loader`` narrows the view to this rank's part
and copies it (casting to the model's dtype), so only the pages of that part are read.

Nothing here imports vllm until :func:`register` runs (``import ckpt`` never does);
:func:`weights` needs torch only.
"""

import importlib.util
import os
import time

LOAD_FORMAT = "ckpt"
_registered = None


def weights(path, dtype=None):
    """Yields (name, tensor) for every tensor of checkpoint ``path`` (a model folder, a file, a
    shard index, a URL), in the file's order. The tensors are views of the mapped file: copy
    what you keep. ``dtype``: floating-point tensors of another dtype are cast to it (a copy)."""
    from . import safe_open
    with safe_open(path, framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            yield name, t


def model_folder(model_config):
    """The local folder vLLM's ``model_config.model`` names; a hub name that is not a local
    folder is refused (this load format reads local folders only)."""
    path = os.fspath(model_config.model)
    if not os.path.isdir(path):
        raise ValueError(f"load_format={LOAD_FORMAT!r} reads a local model folder; "
                         f"{path!r} is not one (download it first, e.g. with "
                         f"`huggingface-cli download`)")
    return path


def _missing(model, loaded):
    """Parameters of ``model`` that ``loaded`` (what model.load_weights returned) lacks."""
    return sorted({name for name, _ in model.named_parameters()} - set(loaded))


def _loader_class():
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    logger = init_logger("vllm.ckpt")  # under "vllm": vLLM's handlers print it

    class CkptModelLoader(BaseModelLoader):
        """Reads a local model folder through ckpt into ``model.load_weights``."""

        def download_model(self, model_config):
            model_folder(model_config)

        def load_weights(self, model, model_config):
            path = model_folder(model_config)
            start = time.perf_counter()
            loaded = model.load_weights(weights(path))
            logger.info("ckpt: loading weights from %s took %.2f seconds", path,
                        time.perf_counter() - start)
            # As vLLM's own loaders: an unquantized model must get every parameter.
            if loaded is not None and model_config.quantization is None:
                missing = _missing(model, loaded)
                if missing:
                    raise ValueError(f"{path}: no tensor in the checkpoint for the model's "
                                     f"parameters {missing}")

    CkptModelLoader.__module__ = __name__
    return CkptModelLoader


def register():
    """Registers the "ckpt" load format with vLLM (idempotent) and returns the loader class.
    The ``vllm.general_plugins`` entry point of the ckpt-io wheel calls it in every vLLM
    process; ``import ckpt.vllm`` calls it when vllm is installed."""
    global _registered
    if _registered is None:
        from vllm.model_executor.model_loader import register_model_loader
        _registered = register_model_loader(LOAD_FORMAT)(_loader_class())
    return _registered


if importlib.util.find_spec("vllm") is not None:
    register()
