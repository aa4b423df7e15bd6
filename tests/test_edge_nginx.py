"""The nginx edge (`fedl2p flower edge --nginx`): the configuration is the Fleet allowlist, and a real nginx started
from it refuses the gateway's attack list before the SuperLink, passes a site's calls to the allowlist's constants
with only a SuperNode's headers, and answers its per-prefix limits with 503 and Retry-After. Loopback only; the
tests that start nginx skip when it is not installed (.ci/run installs it)."""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fedl2p_cli.flower import fleet_routes as fr
from fedl2p_cli.flower.config import NginxEdgeConfig
from tests.flower_loopback import free_ports, wait_for_port
from tests.gateway_attacks import ATTACKS, request
from tests.test_gateway import read_all, status

pytest.importorskip("flwr")

from fedl2p_cli.flower import edge_nginx  # noqa: E402 - reads flwr's routes

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


class Nginx:
    """nginx in the foreground from a generated configuration, in front of `upstream_port`."""

    def __init__(self, tmp: Path, upstream_port: int, **kw):
        self.port = free_ports(1)[0]
        self.cfg = NginxEdgeConfig(nginx=str(tmp / "nginx.conf"), state=str(tmp / "nginx-state"),
                                   listen=f"127.0.0.1:{self.port}", superlink=f"127.0.0.1:{upstream_port}", **kw)
        self.conf = edge_nginx.write(self.cfg)
        self.access = Path(self.cfg.state or "") / "access.log"
        user = ["-g", "daemon off; user root root;"] if os.geteuid() == 0 else ["-g", "daemon off;"]
        self.proc = subprocess.Popen([NGINX or "nginx", "-e", str(Path(self.cfg.state or "") / "stderr.log"), "-c",
                                      str(self.conf), *user], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_for_port(self.port, timeout=10)

    def stop(self) -> None:
        with_pg = getattr(os, "killpg", None)
        if with_pg is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def send(self, raw: bytes, source: str = "127.0.0.1", timeout: float = 5) -> bytes:
        """nginx keeps a connection open after most answers: read until the answer has come and 0.2 s pass quiet."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout, source_address=(source, 0)) as s:
            s.sendall(raw)
            try:
                first = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                return b""
            s.settimeout(0.2)
            return first + read_all(s)


needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)")


@pytest.fixture(scope="module")
def nginx(upstream, tmp_path_factory):
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    n = Nginx(tmp_path_factory.mktemp("nginx"), upstream.server_address[1], new_per_second=1000, max_per_peer=1000)
    yield n
    n.stop()


upstream = __import__("tests.test_gateway", fromlist=["upstream"]).upstream


def test_the_configuration_is_the_allowlist(tmp_path):
    cfg = NginxEdgeConfig(nginx=str(tmp_path / "n.conf"), state=str(tmp_path / "s"))
    text = edge_nginx.render(cfg, fr.allowlist(False), tmp_path / "s")
    for r in fr.SITE_ROUTES:
        assert text.count(f'"~^/v1/fleet/{r}$" "/v1/fleet/{r}";') == 1
    assert "register-node" not in text.replace("unregister", "")  # not forwarded without self-registration
    assert text.count("/v1/") == 2 * len(fr.SITE_ROUTES)
    for directive in ("limit_req_status 503;", "limit_conn_status 503;", "client_max_body_size 4m;",
                      "limit_conn fleet_conn 16;", "limit_req zone=fleet_req burst=40 nodelay;",
                      "proxy_pass_request_headers off;", "client_header_timeout 10000ms;", "Retry-After 1"):
        assert directive in text, directive
    for h in fr.PASSED:
        assert f"proxy_set_header {h.decode()} " in text
    assert '"flwr-public-key' not in text and "ssl_certificate" not in text


def test_bad_options_are_one_line(tmp_path, capsys):
    from fedl2p_cli.cli.main import run_cli
    base = ["flower", "edge", "--nginx", str(tmp_path / "n.conf"), "--state", str(tmp_path / "s")]
    for extra, words in ((["--prefix-v4", "20"], "--prefix-v4 20"), (["--prefix-v6", "48"], "--prefix-v6 48"),
                         (["--superlink", "10.0.0.1:9093"], "not a loopback"),
                         (["--certfile", str(tmp_path / "x.pem")], "go together")):
        assert run_cli(base + extra) != 0
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@needs_nginx
def test_nginx_accepts_the_configuration_with_and_without_tls(tmp_path):
    pytest.importorskip("cryptography")
    from fedl2p_cli.flower import certs as flower_certs
    flower_certs.make(tmp_path, 1, ["127.0.0.1", "localhost"])
    for tls in ({}, {"certfile": str(tmp_path / "server.pem"), "keyfile": str(tmp_path / "server.key"),
                     "ca": str(tmp_path / "ca.crt")}):
        cfg = NginxEdgeConfig(nginx=str(tmp_path / "n.conf"), state=str(tmp_path / "s"), host_name="fl.example.org",
                              **tls)
        conf = edge_nginx.write(cfg)
        r = subprocess.run([NGINX or "nginx", "-t", "-c", str(conf)], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr


@needs_nginx
@pytest.mark.parametrize("name,raw,allowed", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_answered_by_nginx_and_never_reaches_the_superlink(nginx, upstream, name, raw, allowed):
    before = len(upstream.seen)
    got = status(nginx.send(raw))
    assert 400 <= got <= 501, f"{name}: {got}"  # nginx's own choice among 400, 404, 405, 411, 415, 501
    assert len(upstream.seen) == before, f"{name} reached the SuperLink: {upstream.seen[-1][:2]}"


@needs_nginx
def test_a_site_call_reaches_the_constant_with_only_a_supernodes_headers(nginx, upstream):
    raw = request(b"/v1/fleet/pull-messages", headers={
        b"flwr-public-key": b"cGs=", b"flwr-signature": b"c2ln", b"flwr-timestamp": b"2026-11-25T00:00:00",
        b"x-original-url": b"/v1/control/list-runs", b"x-forwarded-for": b"10.0.0.1", b"cookie": b"a=b",
        b"connection": b"close"})
    reply = nginx.send(raw)
    assert status(reply) == 200 and reply.endswith(b"\x10\x02\x18")
    method, path, headers, body = upstream.seen[-1]
    assert (method, path, body) == ("POST", "/v1/fleet/pull-messages", b"\x08\x01")
    low = {k.lower(): v for k, v in headers.items()}
    assert low["flwr-public-key"] == "cGs=" and low["flwr-signature"] == "c2ln" and "flwr-timestamp" in low
    assert not {"x-original-url", "x-forwarded-for", "cookie"} & set(low)
    for r in fr.SITE_ROUTES:
        assert status(nginx.send(request(f"/v1/fleet/{r}".encode(), headers={b"connection": b"close"}))) == 200
        assert upstream.seen[-1][1] == f"/v1/fleet/{r}"
    time.sleep(0.2)
    assert "POST /v1/fleet/pull-messages 200 in=" in nginx.access.read_text()


@needs_nginx
def test_per_prefix_limits_answer_503_with_retry_after_and_spare_other_prefixes(upstream, tmp_path):
    n = Nginx(tmp_path, upstream.server_address[1], new_per_second=2, max_per_peer=2, header_timeout=3)
    try:
        held = [socket.create_connection(("127.0.0.1", n.port), timeout=5, source_address=("127.0.9.1", 0))
                for _ in range(2)]
        for s in held:  # two connections with a whole head and a body begun (what nginx's limit_conn counts)
            s.sendall(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
        time.sleep(0.3)
        reply = n.send(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}), "127.0.9.2")
        assert status(reply) == 503 and b"retry-after: 1" in reply.lower()  # the /24's third connection
        got = [status(n.send(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}), "127.0.10.1"))
               for _ in range(10)]
        assert got.count(200) >= 4 and got.count(503) >= 3, got  # 2/s with a burst of 4
        assert status(n.send(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}), "127.0.11.1")) == 200
        for s in held:
            s.close()
    finally:
        n.stop()


@needs_nginx
def test_a_head_over_the_gateways_bound_is_refused_and_one_within_it_passes(nginx, upstream):
    """nginx bounds a request head to 1 + 16 KB (one large header buffer), as the gateway bounds it to 16 KB."""
    def head_of(n: int, size: int) -> bytes:
        pad = {f"x-pad-{i}".encode(): b"a" * size for i in range(n)}
        return request(b"/v1/fleet/get-run", headers=pad | {b"connection": b"close"})
    before = len(upstream.seen)
    assert status(nginx.send(head_of(8, 5000))) == 400  # 40 KB of headers, each under 16 KB
    assert len(upstream.seen) == before
    assert status(nginx.send(head_of(3, 4000))) == 200  # 12 KB


def map_key(text: str, addr: str) -> str:
    """What `map $remote_addr $fleet_prefix` in `text` gives `addr`: its regexes in order, as nginx tries them (PCRE's
    `(?<p>` is Python's `(?P<p>`), else the default (the whole address)."""
    for pattern, value in re.findall(r'"~(\S+)" (\S+);', text):
        m = re.search(pattern.replace("(?<", "(?P<"), addr)
        if m:
            return re.sub(r"\$(\w+)", lambda v, m=m: m.group(v.group(1)), value)
    return f"whole {addr}"


def test_the_64_key_is_the_addresses_numeric_value_not_its_text():
    """nginx writes an address in RFC 5952 text (zeros compressed, as Python's ipaddress does): every address of a /64
    gets that /64's key, however its zeros were compressed, and addresses of two /64s never share one."""
    text = edge_nginx.prefix_map(24, 64)
    assert map_key(text, "2001:db8:1::1") == map_key(text, "2001:db8:1:0:1::") == "2001:db8:1:0"
    assert map_key(text, "10.1.2.3") == map_key(text, "::ffff:10.1.2.7") == "10.1.2"
    rng = random.Random(0)
    for _ in range(2000):
        groups = [rng.choice([0, 0, 0, 1, rng.randrange(1 << 16)]) for _ in range(8)]
        addr = ipaddress.IPv6Address(b"".join(g.to_bytes(2, "big") for g in groups))
        want = ":".join(f"{g:x}" for g in groups[:4])
        assert map_key(text, str(addr)) == want, (str(addr), want)
    whole = edge_nginx.prefix_map(32, 128)
    assert map_key(whole, "2001:db8:1::1") == "whole 2001:db8:1::1" and map_key(whole, "::ffff:10.1.2.7") == "10.1.2.7"


def test_the_configuration_bounds_every_prefix_together():
    cfg = NginxEdgeConfig(nginx="n.conf", state="s")
    text = edge_nginx.render(cfg, fr.allowlist(False), Path("/tmp/s"))
    assert f"worker_connections {edge_nginx.WORKER_CONNECTIONS};" in text
    assert "limit_conn_zone $fleet_all zone=fleet_all" in text and "limit_conn fleet_all 1024;" in text
    assert "client_body_timeout 5000ms;" in text and "send_timeout 10000ms;" in text


@needs_nginx
def test_requests_from_many_prefixes_are_capped_together(upstream, tmp_path):
    """Each prefix stays under --max-per-peer, yet every request in progress counts against one cap for all of them
    (8 x --max-connections): the next prefix's is answered 503 with Retry-After, whatever the number of prefixes."""
    n = Nginx(tmp_path, upstream.server_address[1], max_connections=1, max_per_peer=4, header_timeout=10)
    held = []
    try:
        for i in range(8):  # 8 prefixes, each one body begun and never finished (what limit_conn counts)
            s = socket.create_connection(("127.0.0.1", n.port), timeout=5, source_address=(f"127.0.{60 + i}.1", 0))
            s.sendall(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
            held.append(s)
        time.sleep(0.3)
        reply = n.send(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}), "127.0.70.1")
        assert status(reply) == 503 and b"retry-after: 1" in reply.lower()
        for s in held:
            s.close()
        time.sleep(0.3)
        assert status(n.send(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}), "127.0.70.1")) == 200
    finally:
        n.stop()


@needs_nginx
def test_a_body_trickled_slower_than_a_byte_per_gap_is_cut(upstream, tmp_path):
    """nginx's body timeout is the gap between two reads: at half the header timeout, a trickle of a byte every 1.5 s
    (header timeout 2 s) is cut within two gaps, instead of holding its connection for --idle-timeout per byte."""
    n = Nginx(tmp_path, upstream.server_address[1], header_timeout=2, new_per_second=1000, max_per_peer=1000)
    try:
        with socket.create_connection(("127.0.0.1", n.port), timeout=5) as s:
            s.sendall(request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": b"100"}))
            t0, cut = time.monotonic(), False
            while time.monotonic() - t0 < 8 and not cut:
                time.sleep(1.5)
                try:
                    s.sendall(b"x")
                    s.settimeout(0.01)
                    cut = s.recv(65536) == b""
                except TimeoutError:
                    pass
                except OSError:
                    cut = True
            assert cut and time.monotonic() - t0 < 5, time.monotonic() - t0
    finally:
        n.stop()
