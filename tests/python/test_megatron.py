"""ckpt.load(DIR) of Megatron-core `torch_dist` folders written by megatron-core in this session
(tests/interop/megatron_make.py): every global tensor equals megatron's load_plain_tensors,
`common` its load_common_state_dict, and each ShardedObject's unique key the list it stored."""

import os

import pytest
import torch

import megatron_make  # tests/interop: the folders and the comparison

import ckpt

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="megatron-core runs on torch 2.x")


@pytest.fixture(scope="session")
def megatron(tmp_path_factory):
    python, why = megatron_make.venv_python()
    if not python:
        pytest.skip(f"megatron-core cannot be installed here: {why}")
    return megatron_make.make(str(tmp_path_factory.mktemp("megatron")), python)


@pytest.mark.parametrize("name", ["hand", "gpt"])
def test_load_of_the_folder_equals_megatrons_load(megatron, name):
    folders, errors = megatron
    if errors.get(name):
        if name == "hand":
            pytest.fail(errors[name])
        pytest.skip(f"megatron-core could not make {name}: {errors[name].strip().splitlines()[-1]}")
    ref = torch.load(folders[name] + ".ref.pt", weights_only=True)
    got = ckpt.load(folders[name])
    want = {**ref["tensors"], "common": ref["common"],
            **{k: [v] for k, v in ref["objects"].items()}}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert megatron_make.same(v, got[k]), k
    assert os.path.isfile(os.path.join(folders[name], "common.pt"))
