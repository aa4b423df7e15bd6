"""The attack list the gateway is tested against (tests/test_gateway.py) and measured with (bench/gateway.py).

Each entry is one raw HTTP/1.1 request as an attacker on the network would send it (no client-side normalisation:
the bytes go to the socket as written), with the statuses the gateway may answer. None of them may reach the
SuperLink. The first group is what was found bypassing the prefix check; the second, variants from public
path-normalisation advisories against reverse proxies (Tomcat's `..;/`, IIS/Symfony's `X-Original-URL`, double
encoding, overlong UTF-8, backslashes, smuggling through conflicting lengths)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

CONTROL = ("register-node", "unregister-node", "list-nodes", "list-runs", "stop-run", "start-run", "stream-logs")
BODY = b"\x08\x01"  # a tiny protobuf-looking body


def request(target: bytes, method: bytes = b"POST", headers: dict[bytes, bytes] | None = None,
            body: bytes = BODY, host: bytes = b"gateway.test") -> bytes:
    h = {b"host": host, b"content-type": b"application/protobuf", b"content-length": str(len(body)).encode()}
    h.update(headers or {})
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in h.items() if v is not None)
    return method + b" " + target + b" HTTP/1.1\r\n" + lines + b"\r\n" + body


class StandIn(BaseHTTPRequestHandler):
    """The handler of a stand-in SuperLink (the tests' and benches' upstreams): a one-byte protobuf answer, no log."""

    def answer(h, status: int) -> None:
        h.send_response(status)
        h.send_header("content-type", "application/protobuf")
        h.send_header("content-length", "1")
        h.end_headers()
        h.wfile.write(b"\x00")

    def log_message(h, *args) -> None:
        pass


def traversal() -> list[tuple[str, bytes]]:
    """The reported bypasses: dot segments in every spelling, into each Control API call the report names."""
    out = []
    for call in CONTROL:
        c = call.encode()
        out += [(f"../control/{call}", b"/v1/fleet/../control/" + c),
                (f"%2e%2e/control/{call}", b"/v1/fleet/%2e%2e/control/" + c),
                (f"%2E%2E/control/{call}", b"/v1/fleet/%2E%2E/control/" + c),
                (f"..%2f control/{call}", b"/v1/fleet/..%2fcontrol/" + c),
                (f".%2e/control/{call}", b"/v1/fleet/.%2e/control/" + c),
                (f"fleet%2f..%2f control/{call}", b"/v1/fleet%2f..%2fcontrol/" + c),
                (f"absolute-form ../control/{call}", b"http://x/v1/fleet/../control/" + c)]
    return out


REPORTED = [(f"traversal {name}", request(t), {400, 404}) for name, t in traversal()] + [
    ("ServerAppIo pull-task-input", request(b"/v1/fleet/../runtime/pull-task-input"), {404}),
    ("ServerAppIo direct", request(b"/v1/runtime/acquire-task"), {404}),
    ("Control API direct", request(b"/v1/control/list-runs"), {404}),
    ("health endpoint", request(b"/health", b"GET", body=b""), {404}),
    ("NUL after ..", request(b"/v1/fleet/..%00"), {404}),
    ("register-node (site keys are the operator's)", request(b"/v1/fleet/register-node"), {404}),
    ("unregister-node", request(b"/v1/fleet/unregister-node"), {404}),
]

ADVISORIES = [
    ("Tomcat ..;/", request(b"/v1/fleet/..;/control/register-node"), {404}),
    ("path parameter ;", request(b"/v1/fleet/get-run;.pb"), {404}),
    ("double encoding %252e", request(b"/v1/fleet/%252e%252e/control/list-runs"), {404}),
    ("overlong UTF-8 dot", request(b"/v1/fleet/%c0%ae%c0%ae/control/list-runs"), {404}),
    ("backslash traversal", request(b"/v1/fleet/..\\control\\list-runs"), {400, 404}),
    ("double slash", request(b"/v1/fleet//get-run"), {404}),
    ("dot segment ./", request(b"/v1/fleet/./get-run"), {404}),
    ("trailing slash", request(b"/v1/fleet/get-run/"), {404}),
    ("upper case", request(b"/V1/FLEET/GET-RUN"), {404}),
    ("encoded letter", request(b"/v1/fleet/%67et-run"), {404}),
    ("query string", request(b"/v1/fleet/get-run?x=../../control/list-runs"), {404}),
    ("fragment", request(b"/v1/fleet/get-run#x"), {404}),
    ("raw NUL byte", request(b"/v1/fleet/get-run\x00/../../control/list-runs"), {400}),
    ("tab in target", request(b"/v1/fleet/get-run\t/../control/list-runs"), {400}),
    ("asterisk-form", request(b"*", b"OPTIONS", body=b""), {400}),
    ("authority-form CONNECT", request(b"127.0.0.1:9093", b"CONNECT", body=b""), {400}),
    ("GET on a Fleet path", request(b"/v1/fleet/get-run", b"GET", body=b""), {405}),
    ("method override header", request(b"/v1/fleet/../control/stop-run",
                                       headers={b"x-http-method-override": b"POST"}), {400, 404}),
    ("not protobuf", request(b"/v1/fleet/get-run", headers={b"content-type": b"application/json"}), {415}),
    ("smuggling: CL and TE", request(b"/v1/fleet/get-run", headers={b"transfer-encoding": b"chunked"}), {400}),
    ("smuggling: two lengths", request(b"/v1/fleet/get-run", headers={b"content-length": b"2, 40"}), {400}),
    ("obfuscated TE", request(b"/v1/fleet/get-run", headers={b"transfer-encoding": b"xchunked"}), {400, 501}),
]

ATTACKS = REPORTED + ADVISORIES
