"""Fixtures of the model tests (test_zoo.py, test_training.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _float32_convolutions_in_float32():
    """cuDNN's float32 convolutions default to TF32 (torch.backends.cudnn.allow_tf32): two runs
    whose inputs differ only in strides can pick different algorithms and then differ by about
    1e-3, over the float32 tolerance. The model tests compare in full float32 (no effect on the
    CPU)."""
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous
