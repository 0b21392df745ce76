#!/usr/bin/env python3
"""make_npy.py — writes the .npy fixtures tests/test_data.c reads, with numpy's own np.save
(so that the reader is checked against files numpy made, not only against the test's reading
of the spec). Run from this directory: python3 make_npy.py (numpy 1.24 made the committed files)."""
import numpy as np

np.save("npy_f32_3x4.npy", (np.arange(12, dtype=np.float32) * 0.5 - 2.0).reshape(3, 4))
np.save("npy_i64_3.npy", np.array([3, -1, 9], dtype=np.int64))
