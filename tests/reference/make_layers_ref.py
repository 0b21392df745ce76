#!/usr/bin/python3
"""make_layers_ref.py — PyTorch's values for tests/test_layers.c: F.layer_norm over the last
dimension (with and without bias), nanoGPT's CausalSelfAttention and Block (dropout 0), each
with the loss sum(y * R) for a fixed R and the gradients of the input and every parameter
(in state_dict order). Writes layers_ref.h, a C header of arrays (CI needs no PyTorch).
Run with Debian's torch: /usr/bin/python3 make_layers_ref.py."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(24)
out = []


def emit(name, t, ctype="float", fmt="%.9g"):
    t = t.detach().contiguous().reshape(-1)
    vals = ", ".join(fmt % v for v in t.tolist())
    out.append("static const %s %s[%d] = {%s};" % (ctype, name, t.numel(), vals))


# ---- LayerNorm over [3, 4, 8] ----
x = torch.randn(3, 4, 8, requires_grad=True)
w = (1 + 0.5 * torch.randn(8)).requires_grad_()
b = (0.5 * torch.randn(8)).requires_grad_()
r = torch.randn(3, 4, 8)
emit("ln_x", x)
emit("ln_w", w)
emit("ln_b", b)
emit("ln_r", r)
for tag, bias in (("bias", b), ("nobias", None)):
    y = F.layer_norm(x, (8,), w, bias, 1e-5)
    grads = torch.autograd.grad((y * r).sum(), [x, w] + ([b] if bias is not None else []))
    emit("ln_%s_y" % tag, y)
    emit("ln_%s_dx" % tag, grads[0])
    emit("ln_%s_dw" % tag, grads[1])
    if bias is not None:
        emit("ln_%s_db" % tag, grads[2])


# ---- nanoGPT's modules (model.py), dropout 0, bias True ----
class CausalSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.n_head, self.n_embd = H, C

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


B, T, C, H = 2, 5, 8, 2
for tag, mod in (("attn", CausalSelfAttention(C, H)), ("block", Block(C, H))):
    with torch.no_grad():  # LayerNorm's affine away from 1 and 0, so its gradients matter
        for name, p in mod.named_parameters():
            if name.startswith("ln_"):
                p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(B, T, C, requires_grad=True)
    r = torch.randn(B, T, C)
    y = mod(x)
    params = list(mod.state_dict(keep_vars=True).values())
    grads = torch.autograd.grad((y * r).sum(), [x] + params)
    emit("%s_x" % tag, x)
    emit("%s_r" % tag, r)
    emit("%s_y" % tag, y)
    emit("%s_dx" % tag, grads[0])
    emit("%s_params" % tag, torch.cat([p.reshape(-1) for p in params]))
    emit("%s_dparams" % tag, torch.cat([g.reshape(-1) for g in grads[1:]]))
    out.append("/* %s: %s */" % (tag, ", ".join(
        "%s %s" % (n, list(p.shape)) for n, p in mod.state_dict().items())))



# ---- a tiny GPT (nanoGPT's GPT, tied head), its weights from a formula the test repeats:
# parameter j (state_dict order, the tied lm_head left out), element i:
# 0.1 sin(0.37 i + 1.3 j), plus 1 for LayerNorm weights ----
class GPT(nn.Module):
    def __init__(self, V, Tmax, L, C, H):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(Tmax, C),
            h=nn.ModuleList([Block(C, H) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


V, TMAX, L, C, H, B, T = 11, 8, 2, 8, 2, 2, 6
gpt = GPT(V, TMAX, L, C, H)
names = [n for n in gpt.state_dict() if n != "lm_head.weight"]
params = dict(gpt.named_parameters())
with torch.no_grad():
    for j, n in enumerate(names):
        p = params[n]
        vals = [0.1 * math.sin(0.37 * i + 1.3 * j) for i in range(p.numel())]
        p.copy_(torch.tensor(vals, dtype=torch.float64).float().reshape(p.shape))
        if ".ln_" in n and n.endswith(".weight"):
            p.add_(1.0)
idx = torch.tensor([[(b * 7 + t * 3) % V for t in range(T)] for b in range(B)])
targets = (idx + 1) % V
logits = gpt(idx)
loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
grads = torch.autograd.grad(loss, [params[n] for n in names])
emit("gpt_logits", logits)
emit("gpt_loss", loss.reshape(1))
emit("gpt_dparams", torch.cat([g.reshape(-1) for g in grads]))
out.append("/* gpt: %s */" % ", ".join(names))

with open("layers_ref.h", "w") as f:
    f.write("/* layers_ref.h — generated by make_layers_ref.py with torch %s; do not "
            "edit. */\n/* clang-format off */\n#include <stdint.h>\n\n" % torch.__version__)
    f.write("\n".join(out) + "\n")
