"""Running the app on uvicorn with a draining shutdown (DESIGN §10: SIGTERM drains).

On SIGTERM or Ctrl+C, uvicorn closes the listening socket, asks every open connection
to close after its current response, and waits (up to ``timeout_graceful_shutdown``)
for running responses, streams included, to finish. On top of that, the app is told to
answer 503 from then on, and a drained shutdown exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown, plus an ``on_drain`` callback and no re-raised signal.

    uvicorn re-raises a caught SIGTERM once it has shut down, which would kill the
    process with -15 after a clean drain; here the signal is handled, not re-raised.
    A second Ctrl+C still forces the exit (uvicorn's ``handle_exit``).
    """

    def __init__(self, config: uvicorn.Config, *, on_drain) -> None:
        super().__init__(config)
        self._on_drain = on_drain

    def handle_exit(self, sig, frame) -> None:
        self._on_drain()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: FastAPI, sock: socket.socket, *, drain_timeout: float, verbose: bool = False) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGTERM/SIGINT, then drain."""
    config = uvicorn.Config(
        app,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=drain_timeout,
        lifespan="off",
    )
    server = DrainingServer(config, on_drain=lambda: setattr(app.state.server, "draining", True))
    server.run(sockets=[sock])


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free port of ``host`` from a daemon thread; yields the base URL."""
    sock = socket.socket()
    sock.bind((host, 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
