"""Failover of the rollout fleet, against two small HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.fleet import Fleet


class _Handler(BaseHTTPRequestHandler):
    """``GET /health`` answers 200; a POST answers the server's name, except that the server's first POST
    drops the connection unanswered when ``cut_first`` is set (a restart that cut the request in flight)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server = self.server
        if server.cut_first:  # type: ignore[attr-defined]
            server.cut_first = False  # type: ignore[attr-defined]
            self.close_connection = True
            self.connection.shutdown(2)
            return
        body = json.dumps({"who": server.name}).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def two_servers() -> Iterator[list[ThreadingHTTPServer]]:
    servers = []
    for name, cut in (("a", True), ("b", False)):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.name, server.cut_first = name, cut  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_server_whose_connection_broke_after_a_weight_push_stays_out_though_healthy(two_servers) -> None:
    fleet = Fleet([f"http://127.0.0.1:{s.server_address[1]}/v1" for s in two_servers], max_retries=2, timeout_s=10)
    fleet.readmit = False  # weights were pushed: a restarted server would serve its start-up weights
    answers = [fleet.request("POST", "/completions", {"prompt": "x"})["who"] for _ in range(4)]
    assert answers == ["b"] * 4
    assert [s.healthy for s in fleet.servers] == [False, True]
    fleet.close()


def test_before_a_weight_push_a_healthy_server_stays_in_rotation_after_a_broken_connection(two_servers) -> None:
    fleet = Fleet([f"http://127.0.0.1:{s.server_address[1]}/v1" for s in two_servers], max_retries=2, timeout_s=10)
    answers = [fleet.request("POST", "/completions", {"prompt": "x"})["who"] for _ in range(4)]
    assert "a" in answers and fleet.servers[0].healthy
    fleet.close()
