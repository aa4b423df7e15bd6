"""A Flower federation on 127.0.0.1 for the tests: a SuperLink (optionally with TLS and SuperNode authentication, a
database, and the Fleet gateway in front), SuperNodes, `flwr` commands, and the clean-up that leaves no process.

Every process starts in its own process group (a SuperLink or SuperNode spawns a `flower-superexec` child that
outlives a plain kill of its parent), on free loopback ports, with a temporary FLWR_HOME."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def alive(pids: list[int]) -> list[int]:
    """Those of pids (and their process groups) still running, zombies excluded."""
    out = subprocess.run(["ps", "-eo", "pid,pgid,stat"], capture_output=True, text=True).stdout.split("\n")[1:]
    rows = [ln.split() for ln in out if ln.strip()]
    return [int(p) for p, g, st in rows if (int(p) in pids or int(g) in pids) and not st.startswith("Z")]


def wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


class Loopback:
    """`secure`: TLS everywhere and only registered SuperNodes (keys from `fedl2p flower credentials`' helper).
    `gateway`: the SuperLink's one port stays on loopback-only duty and the sites reach it through `fedl2p flower
    gateway` on its own port (the documented setup), or through nginx from `fedl2p flower edge` (`gateway="nginx"`).
    `database`: the SuperLink's state file."""

    def __init__(self, tmp: Path, secure: bool, gateway: bool | str = False, database: Path | None = None,
                 sites: int = 3):
        self.tmp, self.secure, self.gateway, self.database = tmp, secure, gateway, database
        self.bin = Path(sys.executable).parent
        self.link, self.fleet = free_ports(2)
        self.site_port = self.fleet if gateway else self.link  # the address the sites are given
        self.home = tmp / "flwr_home"
        self.home.mkdir()
        self.certs = tmp / "certs"
        if secure:
            from fedl2p_cli.flower import certs as flower_certs
            flower_certs.make(self.certs, sites, ["127.0.0.1", "localhost"])
        self.env = dict(os.environ, FLWR_HOME=str(self.home), PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        self.procs: dict[str, subprocess.Popen] = {}
        self.all: list[subprocess.Popen] = []
        self.profile("loopback", self.link)
        self.profile("sites-address", self.site_port)

    def profile(self, name: str, port: int) -> None:
        """A SuperLink connection in FLWR_HOME/config.toml (the first one written is the default)."""
        path = self.home / "config.toml"
        text = path.read_text() if path.exists() else f'[superlink]\ndefault = "{name}"\n'
        trust = f'root-certificates = "{self.certs / "ca.crt"}"\n' if self.secure else "insecure = true\n"
        path.write_text(text + f'\n[superlink.{name}]\naddress = "127.0.0.1:{port}"\n{trust}')

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.log(name), "a") as log:  # the child keeps its own copy of the descriptor
            exe = args[0] if args[0].startswith("/") else str(self.bin / args[0])
            p = subprocess.Popen([exe, *args[1:]], env=self.env, stdout=log, stderr=log,
                                 start_new_session=True)
        self.procs[name] = p
        self.all.append(p)
        return p

    def tls(self) -> list[str]:
        c = self.certs
        return (["--ssl-ca-certfile", str(c / "ca.crt"), "--ssl-certfile", str(c / "server.pem"), "--ssl-keyfile",
                 str(c / "server.key"), "--enable-supernode-auth"] if self.secure else ["--insecure"])

    def start_link(self) -> None:
        db = str(self.database) if self.database else ":flwr-in-memory:"
        self.start("superlink", ["flower-superlink", *self.tls(), "--host", "127.0.0.1", "--port", str(self.link),
                                 "--database", db, "--disable-runtime-dependency-installation"])
        wait_for_port(self.link)
        if self.gateway and "gateway" not in self.procs:
            c = self.certs
            tls = (["--certfile", str(c / "server.pem"), "--keyfile", str(c / "server.key"), "--ca", str(c / "ca.crt")]
                   if self.secure else [])
            if self.gateway == "nginx":
                self.start_nginx(tls)
            else:
                self.start("gateway", ["fedl2p", "flower", "gateway", "--listen", f"127.0.0.1:{self.fleet}",
                                       "--superlink", f"127.0.0.1:{self.link}", *tls])
            wait_for_port(self.fleet)

    def start_nginx(self, tls: list[str]) -> None:
        """nginx in the foreground from `fedl2p flower edge --nginx`, its access log as the gateway's log."""
        import shutil
        conf, state = self.tmp / "nginx.conf", self.tmp / "nginx-state"
        made = subprocess.run([str(self.bin / "fedl2p"), "flower", "edge", "--nginx", str(conf), "--state", str(state),
                               "--listen", f"127.0.0.1:{self.fleet}", "--superlink", f"127.0.0.1:{self.link}", *tls,
                               "--access-log", str(self.log("gateway"))], env=self.env, capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        user = "daemon off; user root root;" if os.geteuid() == 0 else "daemon off;"
        self.start("gateway", [shutil.which("nginx") or "/usr/sbin/nginx", "-e", str(state / "stderr.log"), "-c",
                               str(conf), "-g", user])

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "flwr"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def register(self, i: int, via: str = "loopback") -> subprocess.CompletedProcess:
        return self.flwr("supernode", "register", str(self.certs / f"site{i}.pub"), via)

    def start_node(self, i: int, site_dir: Path, name: str, extra: str = "", key: int | None = None,
                   retries: int | None = None) -> subprocess.Popen:
        """SuperNode `i` (its key: site<key or i>.key) holding `site_dir`, named `name` in the server's logs."""
        auth = (["--root-certificates", str(self.certs / "ca.crt")]
                + (["--auth-supernode-private-key", str(self.certs / f"site{key or i}.key")] if key != 0 else [])
                if self.secure else ["--insecure"])
        return self.start(f"node{i}", ["flower-supernode", *auth, "--superlink", f"127.0.0.1:{self.site_port}",
                                       "--port", str(free_ports(1)[0]),
                                       *(["--max-retries", str(retries)] if retries is not None else []),
                                       "--node-config", f"site-dir='{site_dir}' site-name='{name}'{extra}"])

    def start_one_site(self, work: Path) -> subprocess.Popen:
        """The SuperLink (and its edge), then SuperNode 1 registered and started, holding work/site."""
        self.start_link()
        assert self.register(1).returncode == 0
        (work / "site").mkdir()
        return self.start_node(1, work / "site", "hospital-a")

    def kill(self, name: str) -> None:
        """kill -9 a process and its whole group (a crash)."""
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def serverapps(self) -> list[int]:
        """The ServerApp processes of this federation's SuperLink (each in its own session: found by command line)."""
        out = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit():
                    a = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
                    if any("flwr-serverapp" in x for x in a) and any(f"127.0.0.1:{self.link}" in x for x in a):
                        out.append(int(p.name))
            except OSError:  # a process that ended while we looked
                pass
        return out

    def close(self) -> None:
        """End every process started (SIGTERM to each group, then SIGKILL), and check that none is left."""
        for p in self.all:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.all:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for pid in self.serverapps():
            os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 20
        while alive([p.pid for p in self.all]) and time.time() < deadline:
            time.sleep(0.5)
        for pid in alive([p.pid for p in self.all]):
            os.kill(pid, signal.SIGKILL)
        assert not alive([p.pid for p in self.all])
