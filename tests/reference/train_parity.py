#!/usr/bin/env python3
"""train_parity.py — expected numbers for tests/test_train_parity.c.

A small MLP, Linear(4, 3) -> ReLU -> Linear(3, 2), starts from given weights (the same
integer formula as the C test, rounded to float32) and trains on a fixed batch with the
update rules of torch.optim, written out here in float64 from PyTorch's documentation:

  SGD  (lr, momentum, dampening, weight_decay, nesterov):
       g += wd * p;  buf = g (first step) else momentum * buf + (1 - dampening) * g
       p -= lr * (g + momentum * buf if nesterov else buf)
  Adam (lr, betas, eps, weight_decay as L2):  g += wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
       p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  AdamW: the same with p *= 1 - lr * wd first and no L2 term.

Losses: MSELoss(reduction='mean') and CrossEntropyLoss(reduction='mean'), as in PyTorch.
Run: python3 tests/reference/train_parity.py  (prints the C arrays the test embeds).
No third-party package is needed.
"""
import math
import struct


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def value(k, a, b):  # the C test's init formula: ((k * a) % b) / b - 0.5, as float32
    return f32(((k * a) % b) / b - 0.5)


def init():
    w1 = [[value(i * 4 + j + 1, 7, 11) for j in range(4)] for i in range(3)]
    b1 = [value(i + 1, 5, 13) for i in range(3)]
    w2 = [[value(i * 3 + j + 1, 3, 7) for j in range(3)] for i in range(2)]
    b2 = [value(i + 1, 4, 9) for i in range(2)]
    x = [[value(r * 4 + c + 1, 9, 17) * 2 for c in range(4)] for r in range(5)]
    y = [[value(r * 2 + c + 1, 5, 19) for c in range(2)] for r in range(5)]
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}, x, y


LABELS = [0, 1, 1, 0, 1]


def forward_backward(p, x, y, loss_kind):
    w1, b1, w2, b2 = p["w1"], p["b1"], p["w2"], p["b2"]
    n = len(x)
    h_pre = [[sum(x[r][k] * w1[i][k] for k in range(4)) + b1[i] for i in range(3)] for r in range(n)]
    h = [[max(v, 0.0) for v in row] for row in h_pre]
    out = [[sum(h[r][k] * w2[i][k] for k in range(3)) + b2[i] for i in range(2)] for r in range(n)]
    if loss_kind == "mse":
        loss = sum((out[r][c] - y[r][c]) ** 2 for r in range(n) for c in range(2)) / (2 * n)
        g_out = [[2 * (out[r][c] - y[r][c]) / (2 * n) for c in range(2)] for r in range(n)]
    else:
        loss, g_out = 0.0, []
        for r in range(n):
            m = max(out[r])
            lse = m + math.log(sum(math.exp(v - m) for v in out[r]))
            loss += (lse - out[r][LABELS[r]]) / n
            g_out.append([(math.exp(out[r][c] - lse) - (c == LABELS[r])) / n for c in range(2)])
    g = {"w2": [[sum(g_out[r][i] * h[r][k] for r in range(n)) for k in range(3)] for i in range(2)],
         "b2": [sum(g_out[r][i] for r in range(n)) for i in range(2)]}
    g_h = [[sum(g_out[r][i] * w2[i][k] for i in range(2)) * (h_pre[r][k] > 0) for k in range(3)] for r in range(n)]
    g["w1"] = [[sum(g_h[r][i] * x[r][k] for r in range(n)) for k in range(4)] for i in range(3)]
    g["b1"] = [sum(g_h[r][i] for r in range(n)) for i in range(3)]
    return loss, g


def flat(v):
    return [a for row in v for a in row] if isinstance(v[0], list) else list(v)


def unflat(shape_like, vals):
    if isinstance(shape_like[0], list):
        cols = len(shape_like[0])
        return [vals[i * cols:(i + 1) * cols] for i in range(len(shape_like))]
    return vals


NAMES = ["w1", "b1", "w2", "b2"]


def train(kind, steps, loss_kind, **o):
    p, x, y = init()
    state = {k: None for k in NAMES}
    losses = []
    for t in range(1, steps + 1):
        loss, g = forward_backward(p, x, y, loss_kind)
        losses.append(loss)
        for k in NAMES:
            pv, gv = flat(p[k]), flat(g[k])
            if kind == "sgd":
                gv = [gi + o["wd"] * pi for gi, pi in zip(gv, pv)]
                if state[k] is None:
                    state[k] = gv[:]
                else:
                    state[k] = [o["momentum"] * b + (1 - o["dampening"]) * gi for b, gi in zip(state[k], gv)]
                if o.get("nesterov"):
                    step = [gi + o["momentum"] * b for gi, b in zip(gv, state[k])]
                else:
                    step = state[k]
                pv = [pi - o["lr"] * d for pi, d in zip(pv, step)]
            else:
                if state[k] is None:
                    state[k] = ([0.0] * len(pv), [0.0] * len(pv))
                m, v = state[k]
                if kind == "adamw":
                    pv = [pi * (1 - o["lr"] * o["wd"]) for pi in pv]
                else:
                    gv = [gi + o["wd"] * pi for gi, pi in zip(gv, pv)]
                b1, b2 = o["betas"]
                m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, gv)]
                v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, gv)]
                state[k] = (m, v)
                bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
                pv = [pi - o["lr"] / bc1 * mi / (math.sqrt(vi) / math.sqrt(bc2) + o["eps"])
                      for pi, mi, vi in zip(pv, m, v)]
            p[k] = unflat(p[k], pv)
    return losses, [a for k in NAMES for a in flat(p[k])]


def emit(name, vals):
    body = ", ".join("%.9g" % v for v in vals)
    print("static const double %s[%d] = {%s};" % (name, len(vals), body))


if __name__ == "__main__":
    runs = {
        "sgd": train("sgd", 4, "mse", lr=0.1, momentum=0.9, dampening=0.0, wd=0.01),
        "sgd_nesterov": train("sgd", 4, "mse", lr=0.05, momentum=0.8, dampening=0.0, wd=0.0, nesterov=True),
        "sgd_dampening": train("sgd", 4, "ce", lr=0.1, momentum=0.9, dampening=0.5, wd=0.0),
        "adam": train("adam", 4, "ce", lr=0.01, betas=(0.9, 0.999), eps=1e-8, wd=0.0),
        "adamw": train("adamw", 3, "mse", lr=0.01, betas=(0.9, 0.999), eps=1e-8, wd=0.1),
    }
    for name, (losses, params) in runs.items():
        emit("%s_losses" % name, losses)
        emit("%s_params" % name, params)
