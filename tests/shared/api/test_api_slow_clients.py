"""Slow and idle clients are shed (real servers, both engines: the suite's server runs with
--timeout-header 2 --timeout-body 2), and they never stop a normal request."""
from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import httpx

from tests.shared.api.api_helpers import CHAT, HELLO, assert_error

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"


def _connect(server) -> socket.socket:
    url = urlparse(server.base_url)
    sock = socket.create_connection((url.hostname, url.port))
    sock.settimeout(15)
    return sock


def _closed_after(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sends until it closes (headers and body may come in separate reads),
    and the seconds until its first byte or the close."""
    t0 = time.monotonic()
    data = chunk = sock.recv(4096)
    waited = time.monotonic() - t0
    while chunk:
        chunk = sock.recv(4096)
        data += chunk
    return data, waited


def test_trickled_headers_are_cut_off(server) -> None:
    sock = _connect(server)
    sock.sendall(HEAD)                      # and the rest never comes
    data, waited = _closed_after(sock)
    assert data == b"" and 1.5 < waited < 6
    sock.close()


def test_an_idle_connection_is_cut_off_too(server) -> None:
    sock = _connect(server)
    data, waited = _closed_after(sock)
    assert data == b"" and waited < 6
    sock.close()


def test_a_trickled_body_gets_408(server) -> None:
    sock = _connect(server)
    sock.sendall(HEAD + f"Authorization: Bearer {server.api_key}\r\n".encode()
                 + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\":")
    data, waited = _closed_after(sock)
    assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data and waited < 6
    sock.close()


def test_oversized_headers_get_431(client) -> None:
    resp = client.get("/health", headers={"X-Big": "a" * (20 << 10)})
    assert_error(resp, 431)
    assert client.get("/health").status_code == 200


def test_200_stalled_connections_do_not_stop_a_normal_request(server, client) -> None:
    stalled = []
    try:
        for _ in range(200):
            sock = _connect(server)
            sock.sendall(HEAD)
            stalled.append(sock)
        t0 = time.monotonic()
        resp = client.post(CHAT, json={"messages": HELLO, "max_tokens": 1})
        assert resp.status_code == 200 and time.monotonic() - t0 < 1.0
    finally:
        for sock in stalled:
            sock.close()


def test_past_limit_concurrency_new_connections_get_503(edge_server) -> None:
    """The edge server runs with --limit-concurrency 8."""
    idle = [_connect(edge_server) for _ in range(8)]
    try:
        time.sleep(0.2)
        resp = httpx.get(f"{edge_server.base_url}/health", timeout=10)
        assert resp.status_code == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"{edge_server.base_url}/health", timeout=10).status_code == 200


def test_a_kept_alive_connection_that_trickles_its_next_request_is_cut_off(server) -> None:
    sock = _connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    reply = b""
    while not reply.endswith(b'{"status":"ok"}'):
        reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200")
    time.sleep(1.0)
    sock.sendall(b"GET /health HTTP/1.1\r\n")          # the next request, never finished
    data, waited = _closed_after(sock)
    assert data == b"" and 1.5 < waited < 6
    sock.close()
