"""CUDA tests run on a real GPU only; on a machine without one every test here is skipped with
that reason. They never run against synthetic data."""

from __future__ import annotations

import pytest
import torch

# is_available() asks the driver for a device count; it does not create a context.
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cuda/" in str(item.fspath):
            item.add_marker(requires_cuda)
            item.add_marker(pytest.mark.cuda)
