#!/usr/bin/env python3
"""make_resnet_ref.py — PyTorch's side of tests/test_resnet.c: torchvision's ResNet module
trees and reference values for one Bottleneck block and a ResNet-18.

  /usr/bin/python3 tests/reference/make_resnet_ref.py [OUT_DIR]   (default: this directory)

Writes (needs python3-torch 1.13 and python3-torchvision 0.14, Debian 12; the files are
committed, so the C tests need neither):

  resnet50_state_dict.txt, resnet18_state_dict.txt
      one line per state_dict entry of torchvision.models.resnet50() / resnet18(), in
      state_dict order: "name dtype [d0, d1, ...]" (a 0-d tensor is "[]")
  resnet_bottleneck_*.npy
      Bottleneck(16, 8, stride 2, downsample conv1x1 + BN) in training mode on an input
      [2, 16, 8, 8]: the output, the gradient of sum(output * grad_out) with respect to the
      input and to some parameters, and running statistics after the forward
  resnet18_*.npy
      resnet18(num_classes=10) at [4, 3, 40, 40]: eval-mode logits first (running statistics
      as set below), then a training-mode forward + cross-entropy (labels 3, 7, 1, 5) +
      backward:
      logits, loss, gradients of conv1.weight, layer4.1.bn2.weight, fc.weight, fc.bias, and
      bn1's running statistics after the forward

Every state_dict entry is set by value(j, k, name, shape) (j: index of the entry in the
state_dict, k: flat index in it), which tests/test_resnet.c repeats in double precision, so
nothing depends on a seed. The references are computed in float64 and stored as float32, so
that a float32 implementation is compared with the exact values, not with PyTorch's own
float32 rounding. Inputs come from numpy's generator with a fixed seed and are stored; an
input that brings a ReLU's input or a max-pool's top two values within 1e-5 of a tie is drawn
again (float32 could decide such a tie the other way: a first ResNet-18 input had a ReLU input
of 3e-6, and clpar's gradient of that channel's bias differed from float64's by 4x).

The ResNet-18 runs at batch 4 of 40x40, not batch 2 of 32x32: at 32x32 layer4 works on 1x1
maps, so each of its BatchNorms normalizes 2 values (batch 2), whose output is +-1 whatever
the input; the gradient reaching the earlier layers is then a tiny remainder, ill-conditioned
(PyTorch's own float32 gradient of conv1.weight was 1e-3 off its float64 one relative to the
largest element). Batch 2 at 48x48 (8 values per channel in layer4) still left PyTorch's
float32 6e-5 off; batch 4 at 40x40 (16 values) leaves it 8e-6 off.
"""
import copy
import math
import os
import sys

import numpy as np
import torch
import torchvision
from torchvision.models.resnet import Bottleneck

P, A, B, C = 10007, 7919, 104729, 12345


def value(j, k, name, shape):
    """Entry j of a state_dict (name, shape), at flat indices k (an int64 array), in float64."""
    h = (k * A + j * B + C) % P
    base = (h - 5003.0) / 5003.0  # in [-1, 1]
    if name.endswith("num_batches_tracked"):
        return np.zeros_like(k, dtype=np.float64)
    if len(shape) >= 2:  # conv / linear weight: variance 2 / fan_in, as Kaiming's
        fan_in = int(np.prod(shape[1:]))
        return base * math.sqrt(6.0 / fan_in)
    if name.endswith("running_var"):
        return 1.0 + h / (2.0 * P)
    if name.endswith(".weight"):  # BatchNorm weight
        return 1.0 + base / 10.0
    return base / 10.0  # biases, running_mean


def set_weights(model):
    with torch.no_grad():
        for j, (name, t) in enumerate(model.state_dict().items()):
            k = np.arange(t.numel(), dtype=np.int64)
            v = value(j, k, name, tuple(t.shape)).reshape(tuple(t.shape))
            t.copy_(torch.from_numpy(v).to(t.dtype))


def dtype_name(t):
    return {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64"}[t.dtype]


def write_state_list(model, path):
    with open(path, "w") as f:
        for name, t in model.state_dict().items():
            shape = ", ".join(str(d) for d in t.shape)
            f.write(f"{name} {dtype_name(t)} [{shape}]\n")


MARGIN = 1e-5


def margin(model, x):
    """The smallest distance, in a training-mode forward of model on x, of a ReLU's input from 0
    and of a max-pool window's largest value from its second largest: below about 1e-5 a
    float32 forward may take the other side (another ReLU mask, another argmax), and the
    gradient then differs by a whole term, not by rounding."""
    found = [float("inf")]

    def relu_hook(mod, inp):
        found[0] = min(found[0], float(inp[0].detach().abs().min()))

    def pool_hook(mod, inp):
        a = inp[0].detach()
        n, c, h, w = a.shape
        cols = torch.nn.functional.unfold(a.reshape(n * c, 1, h, w), mod.kernel_size,
                                          padding=mod.padding, stride=mod.stride)
        cols = torch.where(cols == 0, torch.full_like(cols, -1e30), cols)  # padding: never the max
        top = cols.topk(2, dim=1).values
        pos = top[:, 0] > 0  # windows of zeros (ReLU's) pass no gradient anyway
        if pos.any():
            found[0] = min(found[0], float((top[:, 0] - top[:, 1])[pos].min()))

    hooks = [m.register_forward_pre_hook(relu_hook) for m in model.modules()
             if isinstance(m, torch.nn.ReLU)]
    hooks += [m.register_forward_pre_hook(pool_hook) for m in model.modules()
              if isinstance(m, torch.nn.MaxPool2d)]
    state = copy.deepcopy(model.state_dict())
    model.train()
    with torch.no_grad():
        model(x)
    model.load_state_dict(state)  # the running statistics as they were
    for h in hooks:
        h.remove()
    return found[0]


def well_conditioned_input(model, shape, rng):
    """Inputs from rng until one keeps every ReLU input and max-pool choice MARGIN away from a
    tie (see margin); returns it as float32."""
    for _ in range(100):
        x32 = rng.standard_normal(shape).astype(np.float32)
        got = margin(model, torch.from_numpy(x32).double())
        if got >= MARGIN:
            return x32
    raise SystemExit("no well-conditioned input in 100 draws")


def save(out, name, t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    np.save(os.path.join(out, name + ".npy"), a.astype(np.float32))


def bottleneck(out, rng):
    inplanes, planes, stride = 16, 8, 2
    down = torch.nn.Sequential(
        torch.nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
        torch.nn.BatchNorm2d(planes * 4))
    blk = Bottleneck(inplanes, planes, stride=stride, downsample=down)
    set_weights(blk)
    blk = blk.double().train()
    x32 = well_conditioned_input(blk, (2, inplanes, 8, 8), rng)
    g32 = rng.standard_normal((2, planes * 4, 4, 4)).astype(np.float32)
    x = torch.from_numpy(x32).double().requires_grad_(True)
    y = blk(x)
    (y * torch.from_numpy(g32).double()).sum().backward()
    save(out, "resnet_bottleneck_input", x32)
    save(out, "resnet_bottleneck_grad_out", g32)
    save(out, "resnet_bottleneck_output", y)
    save(out, "resnet_bottleneck_input_grad", x.grad)
    sd = dict(blk.named_parameters())
    for name in ["conv1.weight", "conv2.weight", "bn2.weight", "bn3.bias",
                 "downsample.0.weight", "downsample.1.weight"]:
        save(out, "resnet_bottleneck_grad_" + name.replace(".", "_"), sd[name].grad)
    buf = dict(blk.named_buffers())
    for name in ["bn1.running_mean", "bn1.running_var", "downsample.1.running_mean",
                 "downsample.1.running_var"]:
        save(out, "resnet_bottleneck_" + name.replace(".", "_"), buf[name])
    print("bottleneck: output", tuple(y.shape), "max |y|", float(y.abs().max()),
          "max |dx|", float(x.grad.abs().max()))


def resnet18(out, rng):
    m = torchvision.models.resnet18(num_classes=10)
    set_weights(m)
    m = m.double()
    x32 = well_conditioned_input(m, (4, 3, 40, 40), rng)
    x = torch.from_numpy(x32).double()
    save(out, "resnet18_input", x32)
    m.eval()
    with torch.no_grad():
        le = m(x)
    save(out, "resnet18_logits_eval", le)
    m.train()
    labels = torch.tensor([3, 7, 1, 5])
    logits = m(x)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    save(out, "resnet18_logits", logits)
    save(out, "resnet18_loss", loss.reshape(1))
    p = dict(m.named_parameters())
    for name in ["conv1.weight", "layer4.1.bn2.weight", "fc.weight", "fc.bias"]:
        save(out, "resnet18_grad_" + name.replace(".", "_"), p[name].grad)
    b = dict(m.named_buffers())
    save(out, "resnet18_bn1_running_mean", b["bn1.running_mean"])
    save(out, "resnet18_bn1_running_var", b["bn1.running_var"])
    print("resnet18: eval logits", le.numpy().round(4).tolist())
    print("resnet18: train logits", logits.detach().numpy().round(4).tolist(),
          "loss", float(loss))
    # How far PyTorch's own float32 is from these float64 references (for the C tolerances).
    m32 = torchvision.models.resnet18(num_classes=10)
    set_weights(m32)
    m32.train()
    l32 = torch.nn.functional.cross_entropy(m32(torch.from_numpy(x32)), labels)
    l32.backward()
    for name in ["conv1.weight", "fc.weight"]:
        ref = p[name].grad.float()
        got = dict(m32.named_parameters())[name].grad
        err = float(((got - ref).abs() / (ref.abs() + ref.abs().max())).max())
        print(f"resnet18: torch float32 {name}.grad vs float64: max |err| / (|ref| + max|ref|)"
              f" {err:.2e}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(0)
    write_state_list(torchvision.models.resnet50(), os.path.join(out, "resnet50_state_dict.txt"))
    write_state_list(torchvision.models.resnet18(), os.path.join(out, "resnet18_state_dict.txt"))
    rng = np.random.default_rng(10)
    bottleneck(out, rng)
    resnet18(out, rng)


if __name__ == "__main__":
    main()
