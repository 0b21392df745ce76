#!/usr/bin/env python3
"""make_adam_l2_ref.py — PyTorch's side of tests/test_adam_l2.c: an MLP trained with Adam and
L2 weight decay (torch.optim.Adam, weight_decay as L2, not AdamW), in float64 and in float32.

  /usr/bin/python3 tests/reference/make_adam_l2_ref.py > tests/reference/adam_l2_ref.h

Needs python3-torch 1.13 (Debian 12); the header is committed, so the C test does not.

Linear(8, 16) -> ReLU -> Linear(16, 4), MSELoss(reduction='mean') on one fixed batch of 16
rows, 20 steps of Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
foreach=False: _single_tensor_adam). The initial parameters (torch.manual_seed(0), nn.Linear's
own init), the batch (numpy, seed 1) and targets are float32 values written out exactly; the
same run is made in float64 (the reference) and in float32 (how far PyTorch's own float32
lands from it). Parameters are listed flat in state_dict order: 0.weight, 0.bias, 2.weight,
2.bias.

The second part drives the optimizer alone: GRAD_N parameters with given gradients (the same
float32 values for every run, so only the update rule differs), STEPS steps, in float64 and in
float32. The gradients span magnitudes from 1e-6 to 1, so that weight decay's share of g and
Adam's division by sqrt(v) both matter.
"""
import numpy as np
import torch

import os

STEPS, LR, WD = 20, 1e-3, 0.01
IN, HIDDEN, OUT, BATCH = (int(v) for v in os.environ.get("ADAM_L2_DIMS", "8,16,4,16").split(","))
SEED = int(os.environ.get("ADAM_L2_SEED", "0"))


def make():
    torch.manual_seed(SEED)
    net = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, OUT))
    rng = np.random.default_rng(SEED + 1)
    x = torch.from_numpy(rng.standard_normal((BATCH, IN)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((BATCH, OUT)).astype(np.float32))
    return net, x, y


def train(net, x, y, dtype):
    net = net.to(dtype)
    x, y = x.to(dtype), y.to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WD, foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return flat.double().numpy(), losses


GRAD_N = 128


def grads():
    rng = np.random.default_rng(2)
    p0 = rng.uniform(-1, 1, GRAD_N).astype(np.float32)
    scale = 10.0 ** rng.uniform(-6, 0, GRAD_N)
    g = (rng.standard_normal((STEPS, GRAD_N)) * scale).astype(np.float32)
    return p0, g


def optimize(p0, g, dtype):
    p = torch.nn.Parameter(torch.tensor(p0, dtype=dtype))  # a copy: p0 stays as it is
    opt = torch.optim.Adam([p], lr=LR, weight_decay=WD, foreach=False)
    for k in range(STEPS):
        p.grad = torch.from_numpy(g[k]).to(dtype)
        opt.step()
    return p.detach().double().numpy()


def c_array(name, values, ctype="double"):
    digits = 9 if ctype == "float" else 17  # enough to read each value back exactly
    per_line = 6 if ctype == "float" else 4
    body = ",\n".join("    " + ", ".join(f"{float(v):.{digits}g}" + ("f" if ctype == "float" else "")
                                         for v in values[i:i + per_line])
                      for i in range(0, len(values), per_line))
    return f"static const {ctype} {name}[{len(values)}] = {{\n{body}}};\n"


def main():
    net, x, y = make()
    init = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    ref, _ = train(make()[0], x, y, torch.float64)
    f32, _ = train(make()[0], x, y, torch.float32)
    print("/* adam_l2_ref.h — written by make_adam_l2_ref.py (PyTorch "
          f"{torch.__version__.split('a')[0]}); do not edit. */")
    print(f"enum {{ ADAM_L2_STEPS = {STEPS}, ADAM_L2_PARAMS = {len(init)}, ADAM_L2_IN = {IN}, "
          f"ADAM_L2_HIDDEN = {HIDDEN}, ADAM_L2_OUT = {OUT}, ADAM_L2_BATCH = {BATCH} }};")
    print(f"static const float adam_l2_lr = {LR}f, adam_l2_weight_decay = {WD}f;")
    print(c_array("adam_l2_x", x.numpy().reshape(-1), "float"), end="")
    print(c_array("adam_l2_y", y.numpy().reshape(-1), "float"), end="")
    print(c_array("adam_l2_init", init, "float"), end="")
    print("/* after the steps, in float64 */")
    print(c_array("adam_l2_f64", ref), end="")
    print("/* after the steps, in PyTorch's float32 */")
    print(c_array("adam_l2_torch_f32", f32), end="")
    p0, g = grads()
    print(f"enum {{ ADAM_L2_GRAD_N = {GRAD_N} }};")
    print(c_array("adam_l2_grad_init", p0, "float"), end="")
    print("/* the gradient of each step, one after the other */")
    print(c_array("adam_l2_grads", g.reshape(-1), "float"), end="")
    print("/* after the steps, in float64 */")
    print(c_array("adam_l2_grad_f64", optimize(p0, g, torch.float64)), end="")
    print("/* after the steps, in PyTorch's float32 */")
    print(c_array("adam_l2_grad_torch_f32", optimize(p0, g, torch.float32)), end="")


if __name__ == "__main__":
    main()
