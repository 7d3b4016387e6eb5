"""`ckpt show FILE NAME` prints a tensor the way torch prints it (torch 1.13's str(tensor))."""
import pytest
import torch

CASES = {
    "small": lambda: torch.tensor([[-0.3882, 0.2278], [0.4744, 0.01]]),
    "int_valued": lambda: torch.arange(6.0).reshape(2, 3),
    "sci": lambda: torch.tensor([1e-6, 3.0, -2.5]),
    "summarized_2d": lambda: torch.arange(2000.0).reshape(40, 50),
    "summarized_3d": lambda: torch.linspace(-1, 1, 4000).reshape(10, 20, 20),
    "wrapped_row": lambda: torch.linspace(-3, 3, 30),
    "float16": lambda: torch.tensor([0.5, -1.25, 3.0], dtype=torch.float16),
    "bfloat16": lambda: torch.tensor([0.5, -1.25, 3.0], dtype=torch.bfloat16),
    "float64": lambda: torch.tensor([1.5, 2.25], dtype=torch.float64),
    "int64": lambda: torch.arange(5),
    "int32": lambda: torch.tensor([-3, 7, 12], dtype=torch.int32),
    "bool": lambda: torch.tensor([True, False, True]),
    "scalar": lambda: torch.tensor(3.5),
    "nonfinite": lambda: torch.tensor([float("nan"), float("inf"), -1.5]),
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).t(),
}


@pytest.fixture(scope="module")
def show_file(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("show") / "show.pt"
    tensors = {k: f() for k, f in CASES.items()}
    torch.save(tensors, path)
    return path, tensors


@pytest.mark.parametrize("name", sorted(CASES))
def test_show_matches_torch_print(ckpt, show_file, name):
    path, tensors = show_file
    out = ckpt.ok("show", str(path), name).stdout
    assert out.rstrip("\n") == str(tensors[name])
