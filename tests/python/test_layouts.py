"""ckpt.load(DIR) of the training layouts torch writes (tests/interop/layouts_make.py, made by
torchrun in this session): each equals the full tensors torch had."""

import os

import pytest
import torch

import ckpt

pytest.importorskip("transformers")
pytest.importorskip("torch.distributed.checkpoint")


@pytest.fixture(scope="session")
def layouts(tmp_path_factory):
    import layouts_make

    return layouts_make.make_layouts(str(tmp_path_factory.mktemp("layouts")))


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], tree


@pytest.mark.parametrize("name", ["st", "ranklocal", "hf_dist", "hf_cons/sharded", "verl"])
def test_load_of_the_folder_equals_the_full_tensors(layouts, name):
    root = os.path.dirname(layouts["st"])
    ref = torch.load(os.path.join(root, name.split("/")[0] + ".ref.pt"), weights_only=True)
    got = {k: v for k, v in _flat(ckpt.load(os.path.join(root, name)))
           if isinstance(v, torch.Tensor)}
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
