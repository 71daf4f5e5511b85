"""Throwaway TLS material made with the openssl command: a self-signed certificate and its key."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(
    folder: Path, name: str = "server", cn: str = "127.0.0.1", passphrase: str | None = None
) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` in ``folder``, valid for a day; the key encrypted with ``passphrase``
    when one is given. Skips the test (naming the command) when openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = folder / f"{name}.cert.pem", folder / f"{name}.key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            f"/CN={cn}",
            "-addext",
            f"subjectAltName=IP:{cn}",
        ],
        check=True,
        capture_output=True,
    )
    if passphrase is not None:
        plain, key = key, folder / f"{name}.encrypted.key.pem"
        subprocess.run(
            ["openssl", "pkey", "-in", str(plain), "-aes256", "-passout", f"pass:{passphrase}", "-out", str(key)],
            check=True,
            capture_output=True,
        )
    return cert, key
