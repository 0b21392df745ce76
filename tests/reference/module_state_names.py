#!/usr/bin/python3
"""The PyTorch twin of tests/test_buffers.c's hand-built module tree: prints the names of
state_dict(), named_buffers() and named_parameters() in PyTorch's order, which the test's
want_state, want_buffers and want_params repeat. Run with Debian's torch (1.13):

    /usr/bin/python3 tests/reference/module_state_names.py
"""
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b0", torch.zeros(2))
        self.fc = nn.Linear(3, 2)
        self.bn1 = nn.BatchNorm1d(2)
        self.w = nn.Parameter(torch.zeros(1))
        self.register_buffer("b1", torch.zeros(1))
        self.seq = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 4))


m = M()
print("torch", torch.__version__)
print("state_dict:", list(m.state_dict()))
print("named_buffers:", [n for n, _ in m.named_buffers()])
print("named_parameters:", [n for n, _ in m.named_parameters()])
print("DataParallel state_dict:", list(nn.DataParallel(m).state_dict())[:3], "...")
