"""The minimum torch version, checked from the installed package's metadata without importing torch.

torch is deliberately not a dependency in ``pyproject.toml``: pip would replace a user's CUDA build
of torch with PyPI's. So the minimum is stated here (and in the README's quick start) and checked where
memexporter first needs torch: ``start()``, ``track()`` and the ``demo``/``run`` commands.
``import memexporter``, ``memexporter rules`` and ``memexporter dashboards`` need no torch at all.

Why 2.8: the per-module activation count pushes its saved-tensor hooks around the one they shadow,
read with ``torch._C._autograd._top_saved_tensors_default_hooks`` (``tracking/saved.py``), which
torch 2.8 added (it is not in 2.7.1's libtorch_python.so): memexporter's tracking does not import on
an older torch. The module hooks' ``always_call=True`` and the global optimizer step hook are 2.1 APIs.
``scripts/test.sh`` runs the tests on this release (``scripts/torch_versions.py``), beside 2.11 and the
newest; until 2026-11 the minimum said 2.1, which no test ran.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from importlib import metadata

MIN_TORCH = (2, 8)
_INSTALL = (
    "install a newer torch the way you installed this one (a CUDA build: "
    "https://pytorch.org/get-started/locally/; CPU only: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu)"
)


def installed_version() -> str | None:
    """The installed torch's version string, or None when torch is not installed.

    Read from the package metadata, which names the release as its wheel was published:
    ``"2.13.0+cpu"`` from PyTorch's CPU index, but ``"2.11.0"`` from PyPI's CUDA wheel, whose
    ``torch.__version__`` says ``"2.11.0+cu130"`` (PyPI takes no local version tags). Either is
    enough for the minimum's check; only a torch without metadata (a source tree on PYTHONPATH) is
    imported to ask it, and callers are about to import torch anyway."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        if importlib.util.find_spec("torch") is None:
            return None
    return str(importlib.import_module("torch").__version__)


def parse(version: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; ``"2.6.0a0+ecf3bae"`` (NGC builds) -> ``(2, 6)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"memexporter: cannot read the torch version {version!r}")
    return int(match.group(1)), int(match.group(2))


def require_torch(version: str | None = None) -> str:
    """Return the installed torch version; raise ImportError saying what to do when torch is missing
    or older than ``MIN_TORCH``. ``version`` overrides the lookup (tests)."""
    found = installed_version() if version is None else version
    minimum = ".".join(map(str, MIN_TORCH))
    if found is None:
        raise ImportError(f"memexporter needs torch>={minimum}, and torch is not installed: {_INSTALL}")
    if parse(found) < MIN_TORCH:
        raise ImportError(f"memexporter needs torch>={minimum}, found torch {found}: {_INSTALL}")
    return found
