"""The connection side of ``verispec serve``: the listening socket, bound before the models load, and
uvicorn's HTTP/1.1 protocol with the deadlines uvicorn lacks.

uvicorn closes a connection idle between requests (``timeout_keep_alive``) and bounds the size of a
request's head (``h11_max_incomplete_event_size``), but it waits for ever for a head or a body that arrives
a byte at a time, and for a client that stops reading what it is sent. :class:`DeadlineProtocol` adds:

- a **head deadline**: a request's line and headers must be complete within ``header_timeout`` seconds of
  the connection opening, or of the first byte of a later request on a kept-alive connection;
- a **body deadline**: the whole body within ``body_timeout`` (+ :data:`BACKSTOP_S`) seconds of the head.
  The app answers a body that is late itself (408, ``verispec.serve.app``); this one closes connections
  whose body no endpoint reads (a ``GET`` with a body, the rest of a body after a 413) and any the app has
  not answered;
- a **send deadline**: a client that reads nothing of its response for ``body_timeout`` seconds while the
  send buffer is full is cut off (its request is then cancelled like any disconnected client's);
- at shutdown, a request whose body has not all arrived is answered 503 and closed at once (it would
  otherwise hold the graceful shutdown until its body deadline).

A connection whose head or body is late gets a 408 with OpenAI's error body, if nothing was answered on it
yet, and is closed. :func:`bind` resolves and binds ``--host``/``--port`` with one-line errors
(``ValueError``) instead of uvicorn's log line and exit status 3.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Bytes a request's line and headers may take (h11's own default; larger heads get a 431).
MAX_HEAD = 16 * 1024
#: Seconds the connection's body deadline waits beyond the app's, so that the app's 408 goes first.
BACKSTOP_S = 2.0
#: Seconds a closed connection may take to flush its last bytes before it is dropped.
LINGER_S = 1.0


def _error_bytes(status: int, reason: str, message: str, code: str, kind: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with head, body and send deadlines (module docstring)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, header_timeout: float = 10.0,
                 body_timeout: float = 60.0) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_timeout, self.body_timeout = header_timeout, body_timeout
        self._timing: str | None = None          # "head", "body" or None: what the armed deadline waits for
        self._deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None

    # -- the deadlines ----------------------------------------------------------------------------------

    def _arm(self, what: str | None) -> None:
        if what == self._timing:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._timing = what
        if what is not None:
            seconds = self.header_timeout if what == "head" else self.body_timeout + BACKSTOP_S
            self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _track(self) -> None:
        """Arm the deadline the connection's state asks for: the head while a request's head is awaited
        with bytes of it received (or none yet on a new connection), the body while it is being sent."""
        if self.transport is None or self.transport.is_closing():
            self._arm(None)
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # a new connection waits for its first head; a kept-alive one is idle (uvicorn's keep-alive
            # timeout) until a byte of the next head arrives
            self._arm("head" if self.cycle is None or self.conn.trailing_data[0] else None)
        elif state is h11.SEND_BODY:
            self._arm("body")
        else:
            self._arm(None)

    def _expired(self, what: str) -> None:
        self._deadline, self._timing = None, None
        if self.transport is None or self.transport.is_closing():
            return
        answered = self.cycle is not None and self.cycle.response_started
        if not answered:
            seconds = self.header_timeout if what == "head" else self.body_timeout
            part = "headers" if what == "head" else "body"
            self.transport.write(_error_bytes(408, "Request Timeout", f"the request's {part} did not arrive within "
                                              f"{seconds:g} s: send the whole request at once", "request_timeout"))
        self._close()

    def _close(self) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True       # the app's sends are dropped, its receive() says disconnect
            self.cycle.message_event.set()
        self.transport.close()
        self.loop.call_later(LINGER_S, self.transport.abort)     # a peer that reads nothing cannot hold it

    # -- uvicorn's protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server is stopping (uvicorn calls this on every connection): a request whose body has not all
        arrived is not in flight yet; it is answered 503 and closed at once instead of holding the shutdown
        until its body deadline. The rest is uvicorn's: idle connections close, answers in flight finish."""
        if self.cycle is not None and not self.cycle.response_started and self.conn.their_state is h11.SEND_BODY:
            self._arm(None)
            self.transport.write(_error_bytes(503, "Service Unavailable", "the server is shutting down: retry on "
                                              "another instance", "unavailable", "server_error"))
            self._close()
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        """A head h11 cannot parse: OpenAI's error body instead of uvicorn's plain text (431 for a head
        over :data:`MAX_HEAD` bytes)."""
        self._arm(None)
        if self.cycle is not None and self.cycle.response_started:      # mid-response: nothing more can be said
            self._close()
            return
        if len(self.conn.trailing_data[0]) > MAX_HEAD:
            data = _error_bytes(431, "Request Header Fields Too Large", f"the request's line and headers exceed "
                                f"{MAX_HEAD} bytes", "request_too_large")
        else:
            data = _error_bytes(400, "Bad Request", "the request is not valid HTTP/1.1 (its request line or headers "
                                "are malformed)", "invalid_request")
        self.transport.write(data)
        self._close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self.body_timeout, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_stalled(self) -> None:
        self._send_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.flow.resume_writing()               # wakes the app's pending send, which then sees the disconnect
        self.transport.abort()


def protocol_factory(header_timeout: float, body_timeout: float):
    """What ``uvicorn.Config(http=...)`` takes: builds a :class:`DeadlineProtocol` per connection."""
    def make(config: Any, server_state: Any, app_state: dict[str, Any],
             _loop: asyncio.AbstractEventLoop | None = None) -> DeadlineProtocol:
        return DeadlineProtocol(config, server_state, app_state, _loop, header_timeout=header_timeout,
                                body_timeout=body_timeout)
    return make


# -- the listening socket -------------------------------------------------------------------------------

def _every_interface(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening: uvicorn listens once the models are loaded, so
    no client waits in the backlog meanwhile). ``ValueError`` (one line, naming the flag and what to do) for
    an empty or unresolvable host, an address not of this machine, a port in use or out of range, a port
    that needs privileges."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be an integer in [0, 65535] (0: any free port), got {port!r}")
    if not host.strip():
        raise ValueError("--host is empty: give an address to listen on (127.0.0.1: this machine only; 0.0.0.0: "
                         "every interface)")
    looks_numeric = host.count(".") == 3 and host.replace(".", "").isdigit()
    try:
        if looks_numeric:           # 999.1.1.1 is no address; a resolver would look it up as a name
            ipaddress.IPv4Address(host)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, socket.gaierror, UnicodeError) as exc:
        why = "not an IPv4 address" if looks_numeric else getattr(exc, "strerror", None) or str(exc)
        raise ValueError(f"--host {host!r} is not an address this machine can listen on ({why}): give an IP "
                         "address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
    family, kind, proto, _, address = min(infos, key=lambda info: info[0] != socket.AF_INET)   # IPv4 first
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(f"{where} is already in use (another server listens there): stop it, or give another "
                             "--port (0: any free port)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"--host {host} is not an address of this machine: give 127.0.0.1 (this machine only), "
                             "0.0.0.0 (every interface) or one of its interfaces' addresses") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ValueError(f"listening on port {port} needs privileges this process lacks: give a --port of 1024 "
                             "or more") from None
        raise ValueError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def every_interface(sock: socket.socket) -> bool:
    """Whether the socket listens on every interface (0.0.0.0 or ::): reachable from other machines."""
    return _every_interface(sock.getsockname()[0])
