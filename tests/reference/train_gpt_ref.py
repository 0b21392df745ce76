#!/usr/bin/python3
"""train_gpt_ref.py — PyTorch's run of samples/train_gpt's configuration, for comparing curves
and wall time: nanoGPT's shakespeare_char on a CPU (gpt_model.py: 4 layers, 4 heads, 128 wide,
block 64, batch 12, dropout 0; AdamW lr 1e-3, beta2 0.99, weight decay 0.1 on the 2-D weights,
100 iterations of warm-up then cosine decay to 1e-4 at --iters, gradients clipped to 1) on
data/shakespeare.txt.gz with train_gpt's vocabulary (the sorted distinct bytes) and split
(the first 90% for training). Batches are random windows (torch.randint, seeded: nanoGPT's
get_batch); the validation loss is the mean over --eval-batches batches, the same ones at
every evaluation (as train_gpt's). Prints "iter N val loss X" every --eval-interval
iterations and at the end, and the wall time of the training loop (evaluations included), of
its evaluations, and the process's CPU seconds over it. --threads N holds PyTorch to N
threads in every pool it computes on: Debian's torch links the pthread build of OpenBLAS,
whose thread count torch.set_num_threads does not set (one per core unless OPENBLAS_NUM_THREADS
or OMP_NUM_THREADS says otherwise when it loads), so N goes into those variables before torch
is imported.

  /usr/bin/python3 tests/reference/train_gpt_ref.py --iters 2000 --eval-batches 200
"""
import argparse
import ctypes
import gzip
import os
import time


def pin_threads(n):
    """Imports torch with n threads in every pool it computes on (n <= 0: its defaults)."""
    if n > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)
    import torch
    if n > 0:
        torch.set_num_threads(n)
        torch.set_num_interop_threads(n)
    return torch


def openblas_threads():
    """The thread count of the OpenBLAS torch loaded, or None when it is not OpenBLAS."""
    try:
        return int(ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD).openblas_get_num_threads())
    except (OSError, AttributeError):
        return None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "data", "shakespeare.txt.gz"))
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--log-interval", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    args = ap.parse_args()
    torch = pin_threads(args.threads)
    from gpt_model import GPT, GPTConfig, get_lr
    with open(args.data, "rb") as f:
        raw = f.read()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    vocab = sorted(set(data))
    table = torch.zeros(256, dtype=torch.long)
    table[torch.tensor(vocab)] = torch.arange(len(vocab))
    tokens = table[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    split = int(len(tokens) * 0.9)
    train, val = tokens[:split], tokens[split:]
    block, batch = 64, 12

    def get_batch(part, gen):
        ix = torch.randint(len(part) - block, (batch,), generator=gen)
        x = torch.stack([part[i:i + block] for i in ix])
        y = torch.stack([part[i + 1:i + 1 + block] for i in ix])
        return x, y

    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(block_size=block, vocab_size=len(vocab)))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    train_gen = torch.Generator().manual_seed(args.seed)
    val_batches = []
    val_gen = torch.Generator().manual_seed(args.seed + 1)
    for _ in range(args.eval_batches):
        val_batches.append(get_batch(val, val_gen))

    eval_s = [0.0]

    @torch.no_grad()
    def evaluate():
        t = time.perf_counter()
        model.eval()
        loss = sum(model(x, y)[1].item() for x, y in val_batches) / len(val_batches)
        model.train()
        eval_s[0] += time.perf_counter() - t
        return loss

    print("%d characters, vocabulary %d; torch %s, %d threads, OpenBLAS %s threads" % (
        len(tokens), len(vocab), torch.__version__, torch.get_num_threads(), openblas_threads()),
        flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for it in range(args.iters):
        for g in opt.param_groups:
            g["lr"] = get_lr(it, 1e-3, 100, args.iters, 1e-4)
        x, y = get_batch(train, train_gen)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = it + 1
        if done % args.log_interval == 0 or done == args.iters:
            print("iter %d train loss %.4f (%.1f s)" % (done, loss.item(), time.perf_counter() - t0),
                  flush=True)
        if done % args.eval_interval == 0 or done == args.iters:
            print("iter %d val loss %.9g" % (done, evaluate()), flush=True)
    wall = time.perf_counter() - t0
    print("wall %.1f s for %d iterations (evaluations %.1f s), CPU %.1f s" % (
        wall, args.iters, eval_s[0], time.process_time() - cpu0), flush=True)


if __name__ == "__main__":
    main()
