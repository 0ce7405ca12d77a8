"""test/precision/ref_dump_util.py: what the NumPy tests that read a reference dump tool (test_fp4_numpy.py with
fp4_ref_dump, test_group_numpy.py with group_ref_dump; the text format is test/support/ref_dump_io.h's) share: finding
the tool, BF16-exact inputs and FP32 bit patterns. Needs numpy and ml_dtypes (the tests check for them first)."""
import os

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32


def find_tool(env, name):
    """The dump tool's path: $env (CTest sets it), else build/test/<name>; None when it is not built."""
    path = os.environ.get(env) or os.path.join(HERE, "..", "..", "build", "test", name)
    return path if os.path.isfile(path) else None


def bf16(values):
    """float32 values exactly representable in bf16 (what the quantisers and producers read)."""
    return np.asarray(values, F32).astype(ml_dtypes.bfloat16).astype(F32)


def bits(v):
    """The FP32 bit patterns of v (uint32)."""
    return np.asarray(v, F32).view(np.uint32)
