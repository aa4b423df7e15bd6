"""The deployment commands' options, declared once (`fedl2p flower gateway`, `edge`, `credentials`, `keygen`,
`run`): the command line, its --help and the CLI reference are generated from these fields (cli/generate.py), and
the values are validated with them; `GatewayConfig.limits()` is what the gateway enforces."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import AT_LEAST_1, NON_NEGATIVE, between, opt

MiB = 1 << 20
AT_LEAST_A_TENTH = between(0.1)


@dataclass(kw_only=True)
class EdgeConfig:
    """What both public edges take: `fedl2p flower gateway` serves with it, `fedl2p flower edge` writes nginx's
    configuration from it."""
    listen: str = opt("0.0.0.0:9092", "HOST:PORT the sites' SuperNodes connect to (the only port to open in the "
                                      "server's firewall).")
    superlink: str = opt("127.0.0.1:9093", "HOST:PORT of the SuperLink, on loopback.")
    certfile: str | None = opt(None, "The SuperLink's TLS certificate (server.pem).", path=True)
    keyfile: str | None = opt(None, "Its private key (server.key).", path=True)
    ca: str | None = opt(None, "The CA certificate that signed it (ca.crt); none of the three: an insecure loopback "
                               "trial.", path=True)
    max_body: int = opt(4, "Largest request body in MiB, refused (413) before it is read.", AT_LEAST_1)
    header_timeout: float = opt(10.0, "Seconds a connection may take to send a request's head (and its TLS "
                                      "handshake).", AT_LEAST_A_TENTH)
    idle_timeout: float = opt(60.0, "Seconds an idle connection, or a body with no new byte, is kept.", AT_LEAST_A_TENTH)
    body_timeout: float = opt(60.0, "Seconds a whole request body may take to arrive.", AT_LEAST_A_TENTH)
    max_connections: int = opt(128, "Connections served at once (when full, the gateway closes a stranger's for a "
                                    "newcomer; nginx: sets worker_connections).", AT_LEAST_1)
    max_per_peer: int = opt(16, "Connections one prefix (see --prefix-v4) may hold (the gateway counts only those "
                                "without an accepted call); then 503.", AT_LEAST_1)
    new_per_second: float = opt(20.0, "New connections (the gateway; nginx: requests) per prefix and second; more are "
                                      "refused (503, or a reset on TLS).", AT_LEAST_A_TENTH)
    prefix_v4: int = opt(24, "Prefix length an IPv4 address is counted in for the per-prefix limits.", between(8, 32))
    prefix_v6: int = opt(64, "Prefix length an IPv6 address is counted in.", between(16, 128))
    host_name: str | None = opt(None, "Serve only requests whose Host header names this host (the name the sites "
                                      "connect to); others get 400.")
    allow_self_registration: bool = opt(False, "Also forward register-node/unregister-node: only for an insecure "
                                               "trial, where SuperNodes have no registered key.", flag=True)
    access_log: str | None = opt(None, "Append the access log (a line per request) to this file (default: the "
                                       "gateway's standard output; nginx's STATE/access.log).", path=True)


@dataclass(kw_only=True)
class GatewayConfig(EdgeConfig):
    body_budget: int = opt(64, "MiB of request bodies held at once, all connections together.", AT_LEAST_1)
    unauth_per_minute: int = opt(30, "Answers of 400 or more per prefix and minute to connections without an accepted "
                                     "call; then 503 with Retry-After. A site's connection is never limited.",
                                 AT_LEAST_1)
    min_body_rate: int = opt(16, "KiB/s a request body must average after its first 2 s.", AT_LEAST_1)

    def limits(self):  # -> gateway.Limits (imported here: the gateway needs httpx and h11, this module does not)
        from .gateway import Limits
        return Limits(max_body=self.max_body * MiB, header_timeout=self.header_timeout, idle_timeout=self.idle_timeout,
                      max_connections=self.max_connections, max_per_peer=self.max_per_peer,
                      unauth_per_minute=self.unauth_per_minute, body_timeout=self.body_timeout,
                      body_budget=self.body_budget * MiB, new_per_second=self.new_per_second,
                      min_body_rate=self.min_body_rate * 1024, prefix_v4=self.prefix_v4, prefix_v6=self.prefix_v6)


@dataclass(kw_only=True)
class NginxEdgeConfig(EdgeConfig):
    nginx: str | None = opt(None, "Write the nginx configuration to this file.", path=True, required=True)
    state: str | None = opt(None, "Folder nginx keeps its pid file, error log and buffered bodies in.", path=True,
                            required=True)


@dataclass(kw_only=True)
class ExportSiteConfig:
    client: int | None = opt(None, "Client id in the partition.", NON_NEGATIVE, required=True)
    out: str | None = opt(None, "The site's folder (its SuperNode starts with --node-config \"site-dir='OUT'\").",
                          path=True, required=True)


@dataclass(kw_only=True)
class CredentialsConfig:
    out: str | None = opt(None, "Folder for ca.crt, server.pem, server.key and site<i>.key / site<i>.pub.", path=True,
                          required=True)
    sites: int = opt(1, "SuperNodes to make authentication key pairs for.", AT_LEAST_1, required=True)
    host: str = opt("127.0.0.1,localhost", "Comma-separated names and addresses the SuperLink's certificate is valid "
                                           "for (what SuperNodes and flwr connect to).")


@dataclass(kw_only=True)
class KeygenConfig:
    out: str | None = opt(None, "Folder for NAME.key (private: stays at the site) and NAME.pub.", path=True,
                          required=True)
    name: str = opt("site", "The files' name (e.g. the site's name).")


@dataclass(kw_only=True)
class FlowerRunConfig:
    connection: str | None = opt(None, "The SuperLink connection in $FLWR_HOME/config.toml (default: its default one).")
    app: str | None = opt(None, "The Flower app folder (default: the one installed with fedl2p).", path=True)
