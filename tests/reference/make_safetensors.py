#!/usr/bin/env python3
"""make_safetensors.py — the PyTorch side of clpar's safetensors interoperability test.

  make_safetensors.py write DIR   writes DIR/seq_torch.safetensors (a state_dict of
                                  Sequential(Linear(3, 4), ReLU(), Linear(4, 2))) and
                                  DIR/seq_torch_dp.safetensors (the same model wrapped in
                                  nn.DataParallel: names "module.0.weight", ...)
  make_safetensors.py check FILE  loads FILE (written by clpar) with safetensors.torch.load_file
                                  into the same model with load_state_dict(strict=True) and
                                  checks every value

Every weight is set explicitly by value(j, k) (tensor j of the state_dict, flat index k), a
formula that tests/test_checkpoint.c repeats, so nothing depends on a seed. The values are
multiples of 1/8 and exact in float32. Needs python3-torch (Debian 12) and `pip install
safetensors`; the files it wrote are committed, so the C tests need neither.
"""
import sys

import torch
from safetensors.torch import load_file, save_file

NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def value(j, k):
    return ((k * 7 + j * 3) % 11 - 5) / 8.0


def model():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        sd = m.state_dict()
        for j, name in enumerate(NAMES):
            t = sd[name]
            flat = torch.tensor([value(j, k) for k in range(t.numel())], dtype=torch.float32)
            t.copy_(flat.reshape(t.shape))
    return m


def write(out_dir):
    m = model()
    save_file(m.state_dict(), f"{out_dir}/seq_torch.safetensors", metadata={"format": "pt"})
    dp = torch.nn.DataParallel(m)
    assert list(dp.state_dict())[0] == "module.0.weight"
    save_file(dp.state_dict(), f"{out_dir}/seq_torch_dp.safetensors", metadata={"format": "pt"})


def check(path):
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    m.load_state_dict(load_file(path), strict=True)
    want = model().state_dict()
    for name, t in m.state_dict().items():
        assert torch.equal(t, want[name]), name
    x = torch.tensor([[1.0, -2.0, 0.5]])
    print(f"{path}: loaded with load_state_dict(strict=True); every value matches; "
          f"forward([1, -2, 0.5]) = {m(x).tolist()}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        sys.exit(__doc__)
