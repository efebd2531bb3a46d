"""A proxy that holds every request for a while: a local object store as far away as a real one.

A local S3 API (moto's server on 127.0.0.1) answers in well under a millisecond; object storage
over a network takes tens of milliseconds to the first byte, and how many requests a reader keeps
in flight matters only then. :class:`LatencyProxy` sits between the readers and the server and
holds what clients send for ``seconds`` before passing it on: a round trip per request, not a
measurement of any real service. arrayfeed's tests of reading from S3 and its benchmarks
(``bench_remote.py``, ``bench_autotune.py``) put it in front of moto.

Used as a context manager, it runs in a thread of its own (an asyncio loop) until the block ends::

    with LatencyProxy("http://127.0.0.1:5000", 0.02) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        ...

``asyncio.run(LatencyProxy(target, seconds, port).serve())`` runs it in a process of its own
instead (a benchmark keeps it off the cores of the process it measures).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from types import TracebackType

__all__ = ["LatencyProxy"]

_METHODS = {b"GET", b"HEAD", b"PUT", b"POST", b"DELETE", b"OPTIONS", b"PATCH"}


class LatencyProxy:
    """Forwards ``127.0.0.1:port`` (0: a free port) to the server at ``target``
    (``http://127.0.0.1:PORT``), holding each piece clients send for ``seconds``."""

    def __init__(self, target: str, seconds: float, port: int = 0) -> None:
        self.target_port = int(target.rsplit(":", 1)[1])
        self.seconds = seconds
        self.port = port
        #: Pieces held so far (one per request, for requests that fit one read).
        self.held = 0
        #: Requests seen so far by HTTP method (``GET``, ``HEAD``...): pieces that begin with one
        #: (a request without a body, or its headers, is one piece).
        self.requests: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # of connections open
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, listening: Callable[[], None] | None = None) -> None:
        """Serve until closed; ``listening()`` is called once the port is open."""
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        if listening is not None:
            listening()
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve_forever()
        server.close()
        # Connections clients keep open end with the proxy: their sockets are closed, and each
        # connection's task ends as its reads do (not cancelled: asyncio reports a cancelled
        # connection task as an error).
        for writer in list(self._writers):
            writer.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=5)

    def __enter__(self) -> LatencyProxy:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(self.serve(ready.set),),
            name="arrayfeed-latency-proxy",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._loop is not None and self._thread is not None and self._server is not None
        self._loop.call_soon_threadsafe(self._server.close)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers.add(server_w)
        await asyncio.gather(
            self._pipe(client_r, server_w, self.seconds, requests=True),
            self._pipe(server_r, client_w, 0.0),
            return_exceptions=True,  # each pipe closes what it writes to
        )

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        delay: float,
        requests: bool = False,
    ) -> None:
        try:
            while data := await reader.read(1 << 20):
                if requests:  # (client to server)
                    method = data[:8].split(b" ", 1)[0]
                    if method in _METHODS:
                        self.requests[method.decode()] += 1
                if delay:
                    self.held += 1
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
