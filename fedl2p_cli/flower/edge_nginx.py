"""The public edge as an nginx configuration, written from the same Fleet allowlist the gateway serves.

nginx brings what a small Python server cannot: TLS in C with session reuse, worker processes, and decades of
hardening against floods. What it cannot know is which connection the SuperLink has accepted a call on, so its limits
are per prefix for everyone, a site included (a stranger behind a site's NAT shares the site's limits); every limit
answers 503, which flwr retries.

The rules are the gateway's, expressed in nginx's terms:
- the raw request target (`$request_uri`, the bytes the client sent) must be one allowlisted path exactly, else 404;
  the method POST (405), the body `application/protobuf` (415) with a Content-Length and no Transfer-Encoding (400 /
  411); and what is proxied is the allowlist's constant path, never the client's string;
- only the headers a SuperNode sends are passed on (`proxy_pass_request_headers off`, then each by name);
- per prefix (IPv4 /24 and IPv6 /64 by default, from a `map` on the address's text, written back as its numeric
  value): at most `max_per_peer` requests in progress (`limit_conn`) and `new_per_second` requests per second with a
  burst of twice that (`limit_req`); all prefixes together, at most 8 x `max_connections` requests in progress (a
  `limit_conn` zone keyed on a constant), well below `worker_connections`;
- header, body and send timeouts short enough to cut a trickle, a head of at most 1 + 16 KB, `client_max_body_size`,
  a timed-out client reset, and an access log line per request.

What nginx 1.22 cannot bound as the gateway does: a whole body's time (`client_body_timeout` is the gap between two
reads, so a body trickled a byte per gap lasts up to `max_body` gaps) and a minimum body rate; connections that hold
no request (`limit_conn` counts requests in progress: idle and handshaking connections are bounded only by
`worker_connections`, beyond which nginx closes its idle ones first, a site's too); and sites apart from strangers
(the global cap counts a site's requests with everyone's). docs/deployment.md states the consequences.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import FedL2PError
from . import fleet_routes as fr
from .config import NginxEdgeConfig
from .gateway import address, is_loopback

WORKER_CONNECTIONS = 4096  # per worker: requests in progress (at most `all_requests`) plus silent and idle connections
ALL_REQUESTS_PER_CONNECTION = 8  # requests in progress at once, all prefixes together: 8 x --max-connections


def all_requests(max_connections: int) -> int:
    """Requests in progress at once, all prefixes together (a `limit_conn` zone keyed on a constant): however many
    prefixes a flood comes from, what it holds in nginx is bounded, well below `WORKER_CONNECTIONS`."""
    return min(ALL_REQUESTS_PER_CONNECTION * max_connections, WORKER_CONNECTIONS // 2)


def timeouts(cfg: NginxEdgeConfig) -> dict[str, float]:
    """nginx's timeouts are gaps between two reads (or writes), not a whole body's time: a gap as short as a healthy
    client never leaves (half the header timeout for a body, the header timeout for an answer) cuts a trickle that
    sends less than a byte per gap."""
    return {"client_header_timeout": cfg.header_timeout,
            "client_body_timeout": min(cfg.idle_timeout, max(1.0, cfg.header_timeout / 2)),
            "send_timeout": min(cfg.idle_timeout, cfg.header_timeout),
            "keepalive_timeout": cfg.idle_timeout}


LOG_FORMAT = ("'$time_iso8601 $remote_addr:$remote_port $request_method $request_uri $status "
              "in=$request_length out=$bytes_sent upstream_ms=$upstream_response_time'")


def prefix_map(v4: int, v6: int) -> str:
    """A `map` from the client's address to its prefix: whole octets of IPv4, 64 or 128 bits of IPv6. nginx has no
    arithmetic on addresses, so the prefix is cut from the address's text, written back as its numeric value would
    be: the /64's four groups with the zeros a "::" stands for spelled out (`2001:db8:1::1` and `2001:db8:1:0:1::`
    are both `2001:db8:1:0`), and an IPv4-mapped address as its IPv4 prefix."""
    if v4 % 8:
        raise FedL2PError(f"--prefix-v4 {v4}: the nginx edge counts whole octets (8, 16, 24 or 32)")
    if v6 not in (64, 128):
        raise FedL2PError(f"--prefix-v6 {v6}: the nginx edge counts a /64 or a whole address (128)")
    v4_re = r"\.".join([r"\d+"] * (v4 // 8))
    lines = [f'    "~^(::ffff:)?(?<p>{v4_re})(\\.|$)" $p;']
    if v6 == 64:
        lines += [f"    {row}" for row in v6_rows()]
    body = "\n".join(lines)
    return f"map $remote_addr $fleet_prefix {{\n    default $binary_remote_addr;\n{body}\n}}\n"


def v6_rows() -> list[str]:
    """The map's rows for an IPv6 /64: its first four groups, with the zeros a "::" stands for written out. Four groups
    before any "::" are the key as written. With k < 4 groups before the "::" and m after it, the "::" stands for
    8 - k - m zeros: when that reaches past the fourth group the key is the k groups and zeros (one row per k, after the
    exact ones); else the key ends with the first groups after the "::" (one anchored row per k and m)."""
    g = "[0-9a-f]+"
    rows = [f'"~^(?<p>{":".join([g] * 4)}):" $p;']
    for k in range(4):
        for m in range(1, 8 - k):
            zeros, head = 8 - k - m, [f"(?<a>{':'.join([g] * k)})"] if k else []
            if zeros >= 4 - k:
                continue
            need = 4 - k - zeros  # groups after the "::" that are within the /64
            after = [f"(?<b{i}>{g})" for i in range(need)] + [g] * (m - need)
            key = (["$a"] if k else []) + ["0"] * zeros + [f"$b{i}" for i in range(need)]
            rows.append(f'"~^{"".join(head)}::{":".join(after)}$" {":".join(key)};')
    rows += [f'"~^(?<p>{":".join([g] * k)})::" $p{":0" * (4 - k)};' for k in (3, 2, 1)]
    return rows + ['"~^::" 0:0:0:0;']


def routes_map(routes: dict[bytes, str]) -> str:
    """`$fleet_path`: the allowlist's constant for a raw target that is exactly one of its paths, else empty (an
    anchored, case-sensitive regex: a map's plain strings match regardless of case)."""
    rows = "".join(f'    "~^{raw.decode("ascii")}$" "{path}";\n' for raw, path in sorted(routes.items()))
    return f'map $request_uri $fleet_path {{\n    default "";\n{rows}}}\n'


def render(cfg: NginxEdgeConfig, routes: dict[bytes, str], state: Path) -> str:
    """The whole nginx.conf (a main configuration: nginx -c FILE)."""
    (host, port), (up_host, up_port) = address(cfg.listen, "--listen"), address(cfg.superlink, "--superlink")
    if not is_loopback(up_host):
        raise FedL2PError(f"--superlink {cfg.superlink} is not a loopback address: start the SuperLink on 127.0.0.1 "
                          "and point the edge there")
    tls = [cfg.certfile, cfg.keyfile, cfg.ca]
    if any(tls) and not all(tls):
        raise FedL2PError("--certfile, --keyfile and --ca go together (TLS), or none of them (an insecure trial)")
    for p, option in zip(tls, ("--certfile", "--keyfile", "--ca")):
        if p is not None and not Path(p).is_file():
            raise FedL2PError(f"{option} {p} does not exist")
    certfile, keyfile, ca = (Path(p).resolve() if p else None for p in tls)
    secure = certfile is not None and keyfile is not None and ca is not None
    scheme = "https" if secure else "http"
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    access = cfg.access_log or str(state / "access.log")
    rate, burst = cfg.new_per_second, max(1, int(2 * cfg.new_per_second))
    rate_text = f"{rate:g}r/s" if rate >= 1 else f"{max(1, round(rate * 60))}r/m"
    server_tls = (f"""
        ssl_certificate {_q(certfile)};
        ssl_certificate_key {_q(keyfile)};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:fleet_tls:10m;   # a reconnecting site resumes: no new key exchange
        ssl_session_timeout 1h;""" if secure else "")
    upstream_tls = (f"""
            proxy_ssl_trusted_certificate {_q(ca)};
            proxy_ssl_verify on;
            proxy_ssl_name {tls_name(up_host)};   # a name the SuperLink's certificate holds
            proxy_ssl_session_reuse on;""" if secure else "")
    host_check = (f"""
        if ($host != "{cfg.host_name.lower()}") {{ return 400; }}""" if cfg.host_name else "")
    times = "\n".join(f"        {k} {_s(v)};" for k, v in timeouts(cfg).items())
    passed = "".join(f"\n            proxy_set_header {h.decode()} $http_{h.decode().replace('-', '_')};"
                     for h in sorted(fr.PASSED))
    return f"""# The public edge of a fedl2p Flower deployment: written by `fedl2p flower edge --nginx` from the Fleet
# allowlist of flwr {fr.check_flwr()} ({len(routes)} routes); regenerate it rather than edit it.
worker_processes auto;
worker_rlimit_nofile {2 * WORKER_CONNECTIONS + 64};   # a client connection and its upstream one: two descriptors
pid {_q(state / "nginx.pid")};
error_log {_q(state / "error.log")} warn;
events {{
    worker_connections {WORKER_CONNECTIONS};   # past this nginx closes idle kept-alive connections, a site's too
}}
http {{
    access_log off;
    server_tokens off;
    client_body_temp_path {_q(state / "body")};
    proxy_temp_path {_q(state / "proxy")};
    fastcgi_temp_path {_q(state / "fastcgi")};
    uwsgi_temp_path {_q(state / "uwsgi")};
    scgi_temp_path {_q(state / "scgi")};
    log_format fleet {LOG_FORMAT};

{_indent(prefix_map(cfg.prefix_v4, cfg.prefix_v6))}
{_indent(routes_map(routes))}
    upstream fleet_superlink {{
        server {up_host}:{up_port};
        keepalive 32;   # connections to the SuperLink reused: no new TLS handshake per call
    }}

    map $remote_addr $fleet_all {{ default all; }}   # one key for every client: the global cap below
    limit_conn_zone $fleet_all zone=fleet_all:1m;
    limit_conn_zone $fleet_prefix zone=fleet_conn:10m;
    limit_req_zone $fleet_prefix zone=fleet_req:10m rate={rate_text};
    limit_conn_status 503;
    limit_req_status 503;
    limit_conn_log_level warn;
    limit_req_log_level warn;

    server {{
        listen {listen}{" ssl" if secure else ""} backlog=1024;{server_tls}
        access_log {_q(access)} fleet;
{times}
        client_max_body_size {cfg.max_body}m;
        client_body_buffer_size 64k;
        client_header_buffer_size 1k;
        large_client_header_buffers 1 16k;   # a head of at most 1 + 16 KB (the gateway's bound: 16 KB), else 400
        reset_timedout_connection on;        # a timed-out client is reset: its buffers are freed at once
        lingering_time {_s(cfg.header_timeout)};   # the unread body of a refused call is discarded this long at most
        limit_conn fleet_conn {cfg.max_per_peer};
        limit_conn fleet_all {all_requests(cfg.max_connections)};   # all prefixes together (sites too: see the guide)
        limit_req zone=fleet_req burst={burst} nodelay;
        error_page 503 @busy;{host_check}

        location / {{
            if ($fleet_path = "") {{ return 404; }}
            if ($request_method != POST) {{ return 405; }}
            if ($http_transfer_encoding) {{ return 400; }}
            if ($content_type != "{fr.MEDIA_TYPE.decode()}") {{ return 415; }}
            if ($http_content_length = "") {{ return 411; }}
            proxy_pass {scheme}://fleet_superlink$fleet_path;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass_request_headers off;
            proxy_set_header Host $proxy_host;
            proxy_set_header Content-Length $content_length;{passed}
            proxy_connect_timeout 10s;
            proxy_send_timeout {_s(cfg.body_timeout)};
            proxy_read_timeout 600s;
            proxy_intercept_errors off;{upstream_tls}
        }}
        location @busy {{
            add_header Retry-After 1 always;
            return 503;
        }}
    }}
}}
"""


def tls_name(host: str) -> str:
    """The name nginx checks the SuperLink's certificate for: nginx 1.22 matches DNS names only (not an IP address in
    the certificate), so a loopback address is checked as `localhost`, which `fedl2p flower credentials` puts in the
    certificate by default."""
    return "localhost" if is_loopback(host) else host


def _s(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _q(path: Path | str | None) -> str:
    text = str(path)
    if any(c in text for c in '";{}\n\\') or not text:
        raise FedL2PError(f"{text!r}: a path nginx can read needs no quote, brace, semicolon or backslash")
    return f'"{text}"'


def _indent(text: str) -> str:
    return "".join(f"    {ln}\n" if ln else "\n" for ln in text.splitlines())


def write(cfg: NginxEdgeConfig) -> Path:
    """Write the configuration (and make the state folder); the path written."""
    out, state = Path(cfg.nginx or ""), Path(cfg.state or "").resolve()
    text = render(cfg, fr.allowlist(cfg.allow_self_registration), state)
    for sub in ("", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
