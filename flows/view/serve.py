"""Serve the view with uvicorn on 127.0.0.1 until Ctrl-C (or SIGTERM)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import uvicorn

from coevolve.errors import PipelineError
from flows.view.app import create_app

# Loopback only: the view shows model output and task text to whoever can reach it.
HOST = "127.0.0.1"


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: a free port); a port in use is one line naming the fix."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        raise PipelineError(f"cannot listen on {HOST}:{port} ({exc.strerror}); choose another with --port") from None
    sock.listen(64)
    return sock


def serve(root: str | Path, port: int, storage_options: dict[str, Any] | None = None) -> int:
    """Serve the view of the warehouse at ``root`` on 127.0.0.1:``port``; prints its URL, returns 0 when stopped."""
    app = create_app(root, storage_options)
    sock = bind(port)
    url = f"http://{HOST}:{sock.getsockname()[1]}/"
    print(f"coevolve view of {root} at {url} (read-only; Ctrl-C stops it)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
