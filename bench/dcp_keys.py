#!/usr/bin/env python3
"""A state of PARAMS parameters and Adam's state for each (step, exp_avg, exp_avg_sq): 4 x PARAMS
keys, saved with torch.save to OUT, for `ckpt convert OUT DIR --to dcp` and timing `ckpt ls DIR`
(docs/benchmarks/dcp.md, "Opening a DCP folder of many keys"). The tensors are tiny: the subject is
the metadata.

    $VPY bench/dcp_keys.py 20000 build/p20k.pt
"""
import sys

import torch


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    model = {f"layers.{i}.weight": torch.full((4,), float(i)) for i in range(n)}
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(4),
                 "exp_avg_sq": torch.zeros(4)} for i in range(n)}
    torch.save({"model": model, "optim": {"state": state, "param_groups": [
        {"lr": 0.1, "params": list(range(n))}]}}, out)


if __name__ == "__main__":
    main()
