#!/usr/bin/env python3
"""torch_step.py — PyTorch's side of bench/train_step.c: the same training step on the CPU (or
on --device), timed the same way, printed as one JSON object on stdout.

  mlp:   MLP 784-1024-1024-10, batch 256, cross-entropy, Adam (lr 1e-3)
  small: "Optional: Data Parallelism"'s Linear(5, 2) at batch 30, MSE, SGD (lr 0.01)
  resnet50: torchvision's resnet50() (1000 classes) at batch 16 of 3x64x64, MSE against
            one-hot labels, SGD (lr 0.001), as PyTorch's model-parallel tutorial trains it;
            also prints images per second
  gpt: nanoGPT's CPU shakespeare_char GPT (tests/reference/gpt_model.py: 4 layers, 4 heads,
       128 wide, block 64, batch 12, vocabulary 65, dropout 0), cross-entropy, gradients
       clipped to a global norm of 1, AdamW in nanoGPT's decay groups (lr 1e-3, beta2 0.99,
       weight decay 0.1), as nanoGPT's train.py steps

Each round times `steps` back-to-back steps (zero_grad, forward, loss, backward, step; the GPT
as nanoGPT's train.py: forward, loss, backward, clip, step, zero_grad(set_to_none=True)) after
warm-up; the best round counts, as in the C bench. PyTorch's own default thread count is kept
(what a user gets) and reported. --threads N holds N for every pool this PyTorch computes on:
Debian's links the pthread build of OpenBLAS, whose threads torch.set_num_threads does not
size (it starts one per core, or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS read at load), so N is
also put in those variables before torch is imported. The JSON gives the threads found
("threads": intra-op, "openblas_threads") and the process's CPU seconds per wall second over
the timed rounds ("cpu_per_wall": about 1 when one core was busy).

  python3 bench/torch_step.py --model mlp --steps 10 --rounds 3
  python3 bench/torch_step.py --model resnet50 --device cuda   # the same step on a GPU
"""
import argparse
import ctypes
import json
import os
import sys
import time

torch = None  # imported by pin_threads, after the thread variables are set

RESNET_BATCH, RESNET_SIZE, RESNET_CLASSES = 16, 64, 1000
GPT_BATCH, GPT_BLOCK, GPT_VOCAB = 12, 64, 65


def pin_threads(n):
    """Imports torch with n threads in every pool it computes on (n <= 0: its defaults)."""
    global torch
    if n > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)
    import torch as imported
    torch = imported
    if n > 0:
        torch.set_num_threads(n)
        torch.set_num_interop_threads(n)


def openblas_threads():
    """The thread count of the OpenBLAS torch loaded, or None when it is not OpenBLAS."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD)
        return int(lib.openblas_get_num_threads())
    except (OSError, AttributeError):
        return None


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
    elif model == "gpt":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests", "reference"))
        from gpt_model import GPT, GPTConfig
        net = GPT(GPTConfig(block_size=GPT_BLOCK, vocab_size=GPT_VOCAB))
        i = torch.arange(GPT_BATCH * GPT_BLOCK)  # the ids of bench/train_step.c
        x = ((i * 37) % GPT_VOCAB).reshape(GPT_BATCH, GPT_BLOCK)
        y = (((i + 1) * 37) % GPT_VOCAB).reshape(GPT_BATCH, GPT_BLOCK)
        opt = net.configure_optimizers(0.1, 1e-3, (0.9, 0.99))

        def loss_fn(out, y):
            return torch.nn.functional.cross_entropy(out[0].view(-1, GPT_VOCAB), y.view(-1))
    elif model == "resnet50":
        import torchvision
        net = torchvision.models.resnet50(num_classes=RESNET_CLASSES)
        n = RESNET_BATCH * 3 * RESNET_SIZE * RESNET_SIZE
        i = torch.arange(n)
        x = ((i * 37) % 101).float().reshape(RESNET_BATCH, 3, RESNET_SIZE, RESNET_SIZE) / 101.0 - 0.5
        labels = torch.arange(RESNET_BATCH) % RESNET_CLASSES
        y = torch.zeros(RESNET_BATCH, RESNET_CLASSES).scatter_(1, labels.view(-1, 1), 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.001)
        loss_fn = torch.nn.functional.mse_loss
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
    ap.add_argument("--model", choices=["mlp", "small", "resnet50", "gpt"], default="mlp")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--device", default="cpu", help="where the step runs: cpu, cuda, cuda:1, ...")
    args = ap.parse_args()
    pin_threads(args.threads)
    net, x, y, opt, loss_fn = make(args.model)
    if args.device != "cpu":  # module.to moves the parameters in place: opt keeps them
        net.to(args.device)
        x, y = x.to(args.device), y.to(args.device)

    def step():
        if args.model == "gpt":  # nanoGPT's train.py
            loss = loss_fn(net(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(max(2, args.steps // 10)):
        step()
    best = None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.item()  # the step's work is done (waits for the GPU's queue too)
        t = (time.perf_counter() - t0) / args.steps
        best = t if best is None else min(best, t)
    cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    out = {"bench": "torch_step", "model": args.model, "device": args.device,
           "torch": torch.__version__,
           "threads": torch.get_num_threads(), "openblas_threads": openblas_threads(),
           "cpu_per_wall": round(cpu_per_wall, 3), "steps": args.steps,
           "rounds": args.rounds, "ms_per_step": round(best * 1e3, 4)}
    if args.model == "resnet50":
        out.update({"batch": RESNET_BATCH, "image_size": RESNET_SIZE,
                    "images_per_s": round(RESNET_BATCH / best, 2)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
