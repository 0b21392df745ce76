#!/usr/bin/env python3
"""torch_step.py — PyTorch's side of bench/train_step.c: the same training step on the CPU,
timed the same way, printed as one JSON object on stdout.

  mlp:   MLP 784-1024-1024-10, batch 256, cross-entropy, Adam (lr 1e-3)
  small: the seeds' Linear(5, 2) at batch 30, MSE, SGD (lr 0.01)

Each round times `steps` back-to-back steps (zero_grad, forward, loss, backward, step) after
warm-up; the best round counts, as in the C bench. PyTorch's own default thread count is kept
(what a user gets) and reported.

  python3 bench/torch_step.py --model mlp --steps 10 --rounds 3
"""
import argparse
import json
import time

import torch


def make(model):
    torch.manual_seed(3)
    if model == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                  torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                  torch.nn.Linear(1024, 10))
        i = torch.arange(256 * 784)
        x = ((i * 37) % 101).float().reshape(256, 784) / 101.0 - 0.5
        y = torch.arange(256) % 10
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        loss_fn = torch.nn.functional.cross_entropy
    else:
        net = torch.nn.Linear(5, 2)
        i = torch.arange(30 * 5)
        x = ((i * 37) % 101).float().reshape(30, 5) / 101.0 - 0.5
        y = (((torch.arange(30 * 2) * 11) % 7).float() / 7.0).reshape(30, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        loss_fn = torch.nn.functional.mse_loss
    return net, x, y, opt, loss_fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "small"], default="mlp")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    net, x, y, opt, loss_fn = make(args.model)

    def step():
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(max(2, args.steps // 10)):
        step()
    best = None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.item()  # the step's work is done (CPU tensors compute eagerly)
        t = (time.perf_counter() - t0) / args.steps
        best = t if best is None else min(best, t)
    print(json.dumps({"bench": "torch_step", "model": args.model, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "steps": args.steps,
                      "rounds": args.rounds, "ms_per_step": round(best * 1e3, 4)}))


if __name__ == "__main__":
    main()
