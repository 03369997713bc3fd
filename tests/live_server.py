"""A live server for tests: uvicorn on 127.0.0.1 on a free port, in a thread, bounded in time, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

START_TIMEOUT_S = 30


@contextlib.contextmanager
def live_server(app):
    """Serve `app` on 127.0.0.1:<free port>; yields the base URL ("http://127.0.0.1:PORT")."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
