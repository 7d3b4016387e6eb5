"""Writes TorchScript archives with per-channel quantized tensors into argv[1] (run as a child
process by test_real_quant.py: scripting in the pytest process would rename classes that other
tests compare). Prints a JSON line {file: [state_dict names]} as torch.jit.load sees them."""

import json
import sys

import torch

out = sys.argv[1]
torch.manual_seed(7)


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        w = torch.randn(4, 3)
        self.register_buffer("qw", torch.quantize_per_channel(
            w, torch.rand(4, dtype=torch.float64) + 0.1, torch.randint(-3, 3, (4,)), 0, torch.qint8))
        self.register_buffer("qw1", torch.quantize_per_channel(
            w, torch.rand(3, dtype=torch.float64) + 0.1, torch.randint(0, 9, (3,)), 1, torch.quint8))
        self.register_buffer("qt", torch.quantize_per_tensor(w, 0.1, 3, torch.quint8))
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x) + self.qw.dequantize().sum() + self.qw1.dequantize().sum()


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.ao.nn.quantized.Conv2d(3, 4, 3)
        self.conv.set_weight_bias(torch.quantize_per_channel(
            torch.randn(4, 3, 3, 3), torch.rand(4, dtype=torch.float64) + 0.1,
            torch.zeros(4, dtype=torch.long), 0, torch.qint8), torch.randn(4))

    def forward(self, x):
        return self.conv(x)


names = {}
for name, module in (("holder", Holder()), ("conv", Conv())):
    path = f"{out}/{name}.pt"
    torch.jit.save(torch.jit.script(module), path)
    loaded = torch.jit.load(path)
    names[name] = [k for k, v in loaded.state_dict().items() if isinstance(v, torch.Tensor)]
    traced_path = f"{out}/{name}_frozen.pt"
    torch.jit.save(torch.jit.freeze(torch.jit.script(module).eval()), traced_path)
print(json.dumps(names))
