"""Tests that need a CUDA device (``scripts/gpu-check.sh`` runs them on a GPU machine; they skip, with the
reason, elsewhere)."""
