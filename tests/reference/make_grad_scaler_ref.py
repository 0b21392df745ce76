#!/usr/bin/env python3
"""make_grad_scaler_ref.py — PyTorch's side of tests/test_amp.c: the scale and growth tracker of
torch.cuda.amp.GradScaler after each update() of a sequence of steps with and without inf/NaN
gradients, and its state_dict() at the end.

  /usr/bin/python3 tests/reference/make_grad_scaler_ref.py > tests/reference/grad_scaler_ref.h

Needs python3-torch 1.13 (Debian 12); the header is committed, so the C test does not.

GradScaler's own Python code runs (update(), state_dict(), its float32 scale and int32 tracker
tensors); what needs CUDA is replaced on the CPU: the per-optimizer found_inf record that
unscale_() would leave is set directly (1.0 for a step with an inf/NaN gradient), and
torch._amp_update_scale_, which has only a CUDA kernel in 1.13, is amp_update_scale below, a
line-by-line transcription of amp_update_scale_cuda_kernel (aten/src/ATen/native/cuda/
AmpKernels.cu): the products are float * double rounded to float, and a growth that would
overflow float to inf is not applied (the tracker still resets).
"""
import math

import numpy as np
import torch
import torch.cuda.amp.grad_scaler as gs


def amp_update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, interval):
    if found_inf.item():
        scale.fill_(float(np.float32(scale.item() * backoff_factor)))
        tracker.fill_(0)
    else:
        successful = tracker.item() + 1
        if successful == interval:
            with np.errstate(over="ignore"):  # CUDA's cast to float gives inf silently
                new_scale = float(np.float32(scale.item() * growth_factor))
            if math.isfinite(new_scale):
                scale.fill_(new_scale)
            tracker.fill_(0)
        else:
            tracker.fill_(successful)
    return scale


torch._amp_update_scale_ = amp_update_scale
gs.amp_definitely_not_available = lambda: False

# name, GradScaler arguments, steps (1: that step's gradients hold an inf or a NaN)
CASES = [
    ("defaults", dict(), [0, 0, 1, 0, 1, 1, 0, 0]),
    ("interval3", dict(growth_interval=3),
     [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
    ("odd_factors", dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3,
                         growth_interval=2), [0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0]),
    ("overflow", dict(init_scale=2.0**126, growth_interval=1), [0, 0, 0, 1, 0, 0]),
]


def run(kwargs, steps):
    scaler = gs.GradScaler(**kwargs)
    scaler._lazy_init_scale_growth_tracker("cpu")
    scales, trackers = [], []
    for flag in steps:
        state = scaler._per_optimizer_states[0]
        state["found_inf_per_device"] = {"cpu": torch.full((1,), float(flag))}
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
    return scaler, scales, trackers


def c_float(v):
    r = repr(float(np.float32(v)))
    return (r if ("e" in r or "." in r or "inf" in r) else r + ".0") + "f"


def main():
    print("/* grad_scaler_ref.h — written by make_grad_scaler_ref.py (PyTorch %s); do not edit. */"
          % torch.__version__.split("a")[0])
    print("typedef struct {\n  const char *name;\n  double init_scale, growth_factor, "
          "backoff_factor;\n  int growth_interval, n;\n  int found[32];\n  float scale[32];\n"
          "  int tracker[32];\n  /* state_dict() at the end */\n  float sd_scale;\n"
          "  double sd_growth_factor, sd_backoff_factor;\n  int sd_growth_interval, "
          "sd_growth_tracker;\n} grad_scaler_case;")
    print("static const grad_scaler_case grad_scaler_cases[] = {")
    for name, kwargs, steps in CASES:
        scaler, scales, trackers = run(kwargs, steps)
        sd = scaler.state_dict()
        assert sorted(sd) == sorted(["scale", "growth_factor", "backoff_factor",
                                     "growth_interval", "_growth_tracker"])
        print("    {\"%s\", %r, %r, %r, %d, %d," % (name, float(kwargs.get("init_scale", 2.0**16)), scaler.get_growth_factor(),
              scaler.get_backoff_factor(), scaler.get_growth_interval(), len(steps)))
        print("     {%s}," % ", ".join(str(f) for f in steps))
        print("     {%s}," % ", ".join(c_float(s) for s in scales))
        print("     {%s}," % ", ".join(str(t) for t in trackers))
        print("     %s, %r, %r, %d, %d}," % (c_float(sd["scale"]), sd["growth_factor"],
              sd["backoff_factor"], sd["growth_interval"], sd["_growth_tracker"]))
    print("};")
    print("enum { GRAD_SCALER_CASES = %d };" % len(CASES))


if __name__ == "__main__":
    main()
