"""A fleet of OpenAI-compatible servers: requests spread across them, a failed server's requests go to the others.

`Fleet` holds one HTTP client per server (``rollout.base_urls``; ``rollout.base_url`` is a fleet of
one). `Fleet.request` sends a call to the next server in rotation; a transport error, timeout or
retryable status takes that server through a health check (``GET /health`` with the control
timeout) and, if it fails, out of the rotation, and the call is retried on another server with
tenacity's backoff. The stage fails with `coevolve.errors.InfrastructureError` only when the
retries run out or no server is healthy. Sampling seeds travel in each request, so which server
answers does not change a sample (all servers hold the same weights: `agent.weights`).

Control calls (health, model list, weight pushes) go to every healthy server with
``control_timeout_s``, so a hung server cannot stall a stage.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from agent.weights import match_served
from coevolve.errors import InfrastructureError

# Answers worth another try: the server is busy or restarting, or a proxy in front of it failed.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

log = logging.getLogger(__name__)


class ServerFailed(Exception):
    """One attempt at one server failed in a way another attempt may not (transport error, timeout, 5xx)."""

    def __init__(self, message: str, server_down: bool) -> None:
        super().__init__(message)
        self.server_down = server_down


@dataclass
class Server:
    url: str  # the OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    client: Any
    healthy: bool = True
    model: str | None = None  # the name requests ask this server for, once resolved

    @property
    def root(self) -> str:
        """Where vLLM's non-OpenAI endpoints live (/health, /pause, /collective_rpc, /resume)."""
        return self.url.removesuffix("/v1")


def _retry_wait(base: Any):
    """No wait before moving to another server after one was taken out of rotation; backoff otherwise."""

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, ServerFailed) and error.server_down:
            return 0.0
        return base(state)

    return wait


class Fleet:
    """The rollout servers of one engine, with request spreading, health checks and failover."""

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        control_timeout_s: float = 30.0,
        max_retries: int = 3,
        concurrency: int = 32,
    ) -> None:
        if not urls:
            raise ValueError("A fleet needs at least one server URL.")
        self.max_retries = max_retries
        self.control_timeout_s = control_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.servers = [
            Server(
                url=url.rstrip("/"),
                client=httpx.Client(
                    base_url=url.rstrip("/"),
                    headers=headers,
                    timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
                    limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
                ),
            )
            for url in dict.fromkeys(urls)  # the same server twice would only skew the rotation
        ]
        # The model requests name (a checkpoint path or a served name); see model_for.
        self.requested_model: str | None = None
        # Whether a server that failed may rejoin within this engine's life. Off once weights were pushed:
        # a server that restarted meanwhile would serve its start-up weights; the next stage's push brings it back.
        self.readmit = True
        self._rotation = itertools.cycle(range(len(self.servers)))
        self._lock = threading.Lock()

    # --- health -------------------------------------------------------------------------------------
    def is_healthy(self, server: Server) -> bool:
        """``GET /health`` within the control timeout."""
        try:
            response = server.client.get(f"{server.root}/health", timeout=self.control_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def check_health(self) -> list[Server]:
        """Health-check every server; the healthy ones stay in rotation. Fails when none is healthy."""
        for server in self.servers:
            server.healthy = self.is_healthy(server)
            if not server.healthy:
                log.warning("Rollout server %s failed its health check; it is out of rotation.", server.url)
        return self.healthy()

    def healthy(self) -> list[Server]:
        alive = [s for s in self.servers if s.healthy]
        if not alive:
            raise InfrastructureError(
                "No rollout server is healthy: "
                + ", ".join(s.url for s in self.servers)
                + ". Start them (coevolve serve) "
                "or fix rollout.base_urls."
            )
        return alive

    def _next(self) -> Server:
        """The next healthy server in rotation; with none left, a fresh health check of all of them.

        When none answers, the attempt fails as retryable, so tenacity backs off and tries again:
        a server that is restarting gets its chance before the stage fails.
        """
        for _ in range(2):
            with self._lock:
                for _ in range(len(self.servers)):
                    server = self.servers[next(self._rotation)]
                    if server.healthy:
                        return server
            if not self.readmit:
                break
            for server in self.servers:
                server.healthy = self.is_healthy(server)
        raise ServerFailed("no rollout server is healthy: " + ", ".join(s.url for s in self.servers), server_down=False)

    def _failed(self, server: Server, reason: str, transport: bool = False) -> ServerFailed:
        """A failed attempt: the server leaves the rotation if its health check fails too.

        Once weights were pushed (``readmit`` off), a broken connection (``transport``) takes it out even
        when it answers ``/health`` again: a server that restarted meanwhile serves its start-up weights.
        """
        down = not self.is_healthy(server) or (transport and not self.readmit)
        if down and server.healthy:
            server.healthy = False
            log.warning("Rollout server %s is down (%s); its requests go to the other servers.", server.url, reason)
        return ServerFailed(f"{server.url}: {reason}", server_down=down)

    # --- calls --------------------------------------------------------------------------------------
    def send(
        self,
        server: Server,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """One call to one server; a failure worth retrying raises ServerFailed."""
        url = path if path.startswith("http") else f"{server.url}{path}"
        if body is not None and "model" in body and body["model"] is None:
            body = {**body, "model": self.model_for(server)}
        try:
            extra = {} if timeout is None else {"timeout": timeout}
            response = server.client.request(method, url, json=body, **extra)
        except httpx.HTTPError as exc:  # connection refused, reset, timeout
            raise self._failed(server, f"{type(exc).__name__}: {exc}", transport=True) from exc
        if response.status_code in RETRYABLE_STATUS:
            raise self._failed(server, f"HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code in (400, 422):
            raise ValueError(f"{server.url} rejected {method} {path} ({response.status_code}): {response.text[:500]}")
        if response.status_code >= 400:
            raise InfrastructureError(
                f"{method} {url} answered {response.status_code}: {response.text[:300]}. "
                "Check rollout.base_url(s), the served model name and the API key."
            )
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            return {"text": response.text}

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send a call to the next healthy server; retried (tenacity) on another one when it fails."""
        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=_retry_wait(wait_exponential(multiplier=0.5, max=8.0)),
            retry=retry_if_exception_type(ServerFailed),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    server = self._next()
                    return self.send(server, method, path, body)
        except ServerFailed as exc:
            raise InfrastructureError(
                f"{method} {path} failed after {self.max_retries + 1} attempts; last error: {exc}"
            ) from exc
        raise AssertionError("unreachable")

    def control(self, server: Server, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A control call (model list, weight push) to one server, within the control timeout; failures raise."""
        try:
            return self.send(server, method, path, body, timeout=self.control_timeout_s)
        except ServerFailed as exc:
            raise InfrastructureError(f"{method} {path} on {server.url} failed: {exc}") from exc

    def models(self, server: Server) -> list[dict[str, Any]]:
        """The server's ``/models`` entries (vLLM's carry ``max_model_len``, and ``parent`` for adapters)."""
        return list(self.control(server, "GET", "/models").get("data", []))

    def model_for(self, server: Server) -> str:
        """The name to request from ``server``: set by a weight push, else ``requested_model`` as the server lists it.

        A folder is matched by its resolved path, so ``ckpt/round-001`` finds a server started on
        ``/abs/ckpt/round-001`` (and the reverse); a name the server does not list is sent as it is.
        """
        if server.model is None:
            requested = self.requested_model or ""
            try:
                ids = [entry["id"] for entry in self.models(server)]
            except InfrastructureError:
                return requested  # resolved on a later call, once the server answers
            server.model = match_served(requested, ids) or requested
        return server.model

    def close(self) -> None:
        for server in self.servers:
            server.client.close()
