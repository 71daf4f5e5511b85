"""The server's settings as a user gets them wrong: addresses, TLS files, a taken port, DNS that
never answers, URLs to open, and the WSGI environ that extra routes (the /debug endpoints) see."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import memexporter
from memexporter.serving import server
from tests.support.snapshots import rendering
from tests.support.tls import self_signed
from tests.support.web import get_text

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("no_exporter")


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback (::1)")


# --- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr", ["999.1.1.1", "not an address", "127.0.0.1 ", " 0.0.0.0", "[::1]", "trainer-0.cluster.local", "192.0.2.1"]
)
@pytest.mark.parametrize("strict", [False, True])
def test_a_bad_addr_is_a_value_error_naming_it(addr: str, strict: bool) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this host.
    with pytest.raises(ValueError, match=r"addr") as info:
        memexporter.start(port=0, addr=addr, strict=strict)
    assert repr(addr) in str(info.value)
    assert memexporter.exporter.running() is None


def test_a_bad_addr_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_ADDR", "10.0.0.300")
    with pytest.raises(ValueError, match=r"MEMEXPORTER_ADDR .*'10\.0\.0\.300'"):
        memexporter.start(port=0)


def test_localhost_is_the_one_name_taken() -> None:
    exp = memexporter.start(port=0, addr="localhost")
    assert exp.url == f"http://127.0.0.1:{exp.port}/metrics"
    with urllib.request.urlopen(exp.url, timeout=10) as r:
        assert r.status == 200


# --- TLS files ---------------------------------------------------------------------------------


def _tls_case(kind: str, folder: Path) -> tuple[Path, Path, str]:
    """``(certfile, keyfile, the setting the error must name)`` for one kind of bad TLS input."""
    cert, key = self_signed(folder, "good")
    if kind == "garbage certificate":
        bad = folder / "garbage.pem"
        bad.write_text("this is not a certificate\n")
        return bad, key, "certfile"
    if kind == "key as certificate":
        return key, key, "certfile"
    if kind == "mismatched key":
        _, other = self_signed(folder, "other")
        return cert, other, "keyfile"
    if kind == "garbage key":
        bad = folder / "garbage.key"
        bad.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
        return cert, bad, "keyfile"
    if kind == "encrypted key":  # OpenSSL would ask for the passphrase on the terminal
        enc_cert, enc_key = self_signed(folder, "enc", passphrase="secret")
        return enc_cert, enc_key, "keyfile"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["garbage certificate", "key as certificate", "mismatched key", "garbage key", "encrypted key"]
)
@pytest.mark.parametrize("strict", [False, True])
def test_bad_tls_files_are_a_value_error_naming_the_setting(
    kind: str, strict: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certfile, keyfile, setting = _tls_case(kind, tmp_path)
    with caplog.at_level(logging.ERROR, logger="memexporter"), pytest.raises(ValueError) as info:
        memexporter.start(port=0, addr="127.0.0.1", certfile=str(certfile), keyfile=str(keyfile), strict=strict)
    message = str(info.value)
    assert setting in message and repr(str(certfile if setting == "certfile" else keyfile)) in message, message
    assert "port" not in caplog.text, "a bad TLS file is not a port problem"
    assert memexporter.exporter.running() is None


def test_tls_url_is_https_and_opens(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    assert exp.url == f"https://127.0.0.1:{exp.port}/metrics"
    ctx = ssl.create_default_context(cafile=str(cert))
    with urllib.request.urlopen(exp.url, timeout=10, context=ctx) as r:
        assert r.status == 200


# --- URLs and the peer address -----------------------------------------------------------------


@needs_ipv6
def test_ipv6_url_has_brackets_and_opens() -> None:
    exp = memexporter.start(port=0, addr="::1")
    assert exp.url == f"http://[::1]:{exp.port}/metrics"
    with urllib.request.urlopen(exp.url, timeout=10) as r:
        assert r.status == 200


@pytest.mark.parametrize(
    ("addr", "tls", "expected"),
    [
        ("0.0.0.0", False, "http://localhost:9400/metrics"),
        ("::", False, "http://localhost:9400/metrics"),
        ("10.1.2.3", True, "https://10.1.2.3:9400/metrics"),
        ("fe80::1%eth0", False, "http://[fe80::1%25eth0]:9400/metrics"),  # RFC 6874 zone
        ("2001:db8::7", True, "https://[2001:db8::7]:9400/metrics"),
    ],
)
def test_url_forms(addr: str, tls: bool, expected: str) -> None:
    assert server.url(addr, 9400, tls) == expected


def _peer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ["REMOTE_ADDR"].encode()]


@pytest.mark.parametrize(
    ("bind", "connect"),
    [
        ("127.0.0.1", "127.0.0.1"),
        pytest.param("::1", "::1", marks=needs_ipv6),
        pytest.param("::", "127.0.0.1", marks=needs_ipv6),  # a dual-stack socket sees ::ffff:127.0.0.1
    ],
)
def test_routes_see_the_peer_address_as_remote_addr(bind: str, connect: str) -> None:
    srv = server.serve(rendering(CollectorRegistry()), 0, bind, routes={"/debug/peer": server.Route(_peer, "peer")})
    try:
        host = f"[{connect}]" if ":" in connect else connect
        assert get_text(f"http://{host}:{srv.port}/debug/peer") == connect
    finally:
        srv.stop()


def test_a_failing_route_answers_500_and_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    def boom(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        raise RuntimeError("a bug in an extra route")

    srv = server.serve(
        rendering(CollectorRegistry()), 0, "127.0.0.1", routes={"/debug/boom": server.Route(boom, "boom")}
    )
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/debug/boom", timeout=10)
        assert info.value.code == 500
    finally:
        srv.stop()
    assert capfd.readouterr().err == ""


# --- the port, and what the log says (a taken port: test_exporter_lifecycle.py) -----------------


def test_privileged_port_log_names_the_permission_not_dcgm() -> None:
    # As an unprivileged user (a new user namespace maps us to nobody; root could bind port 80).
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to run as an unprivileged user")
    code = (
        "import logging, memexporter; logging.basicConfig(); "
        "e = memexporter.start(port=80, addr='127.0.0.1'); print(e.port)"
    )
    out = subprocess.run(
        ["unshare", "--user", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"cannot make a user namespace here: {out.stderr.strip()}")
    assert out.stdout.strip() == "None", out.stderr
    assert "no permission to bind port 80" in out.stderr and "dcgm" not in out.stderr, out.stderr


# --- DNS -----------------------------------------------------------------------------------------


def test_start_makes_no_name_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # A resolver that never answers (here: a stub that records the call and sleeps, as a silent
    # DNS server makes getaddrinfo wait). The stdlib's server_bind calls socket.getfqdn().
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def silent(name: str) -> Callable[..., Any]:
        def lookup(*args: Any, **kwargs: Any) -> Any:
            lookups.append(f"{name}{args[:1]}")
            time.sleep(3)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

        return lookup

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        flags = kwargs.get("flags", args[4] if len(args) > 4 else 0)
        if host is None or flags & socket.AI_NUMERICHOST:
            return real_getaddrinfo(host, *args, **kwargs)
        return silent("getaddrinfo")(host)

    for name in ("getfqdn", "gethostbyaddr", "gethostbyname", "gethostbyname_ex"):
        monkeypatch.setattr(socket, name, silent(name))
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    t0 = time.monotonic()
    exp = memexporter.start(port=0, addr="0.0.0.0")
    elapsed = time.monotonic() - t0
    assert lookups == [], f"start() looked names up: {lookups}"
    assert elapsed < 2.0 and exp.port is not None


def _netns_usable() -> str | None:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--map-root-user", "true"], capture_output=True, check=False
    )
    return None if probe.returncode == 0 else f"cannot make a network namespace here: {probe.stderr.decode().strip()}"


@pytest.mark.skipif((why := _netns_usable()) is not None, reason=str(why))
def test_start_does_not_wait_on_a_silent_dns_server(tmp_path: Path) -> None:
    # A network namespace whose resolver (127.0.0.1:53) receives queries and never answers, and
    # a host name that is in no hosts file: the stdlib's getfqdn() waits for it (11 s before).
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:3 attempts:1\n")
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / "job.py").write_text(
        textwrap.dedent("""
        import socket, sys, time
        dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns.bind(("127.0.0.1", 53))  # takes queries, answers none
        import torch  # a training job has it imported already; start() must not wait on anything else
        import memexporter
        memexporter.start  # the API's modules (imported on first use): their import is not a DNS wait
        t0 = time.monotonic()
        e = memexporter.start(port=0)
        print(f"{time.monotonic() - t0:.3f} {e.port}", flush=True)
        t0 = time.monotonic()
        try:
            socket.gethostbyaddr(socket.gethostname())
        except OSError:
            pass
        print(f"{time.monotonic() - t0:.3f}", flush=True)  # the resolver really is silent
    """)
    )
    script = (
        f"ip link set lo up && hostname memexporter-no-such-host && "
        f"mount --bind {tmp_path / 'resolv.conf'} /etc/resolv.conf && mount --bind {tmp_path / 'hosts'} /etc/hosts && "
        f"exec {sys.executable} {tmp_path / 'job.py'}"
    )
    out = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--map-root-user", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    start_line, lookup_line = out.stdout.split("\n")[:2]
    start_s, port = start_line.split()
    assert int(port) > 0
    assert float(lookup_line) >= 2.5, f"the namespace's resolver answered in {lookup_line} s: not a silent DNS"
    assert float(start_s) < 1.5, f"start() took {start_s} s with a silent DNS server"
