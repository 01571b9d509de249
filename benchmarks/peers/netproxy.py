"""A loopback TCP proxy: delays each direction and counts the client's round trips.

    python netproxy.py --target 127.0.0.1:6379 --delay 0.010     # prints "port N"

Standard library only (asyncio), so both venvs use it. ``delay`` holds every chunk for
that many seconds in each direction, in order, without limiting bandwidth: a 10 ms delay
emulates a 20 ms round-trip link. Counting: an *exchange* starts when the client sends
after the server has answered (or first), which is one network round trip whether the
protocol is HTTP/1.1 (keep-alive) or RESP (pipelined or not). HTTP request lines and
Redis command names seen in the client's bytes are kept too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import threading
import time
from dataclasses import dataclass, field

HTTP_LINE = re.compile(rb"(?:^|\r\n)(GET|POST|PUT|DELETE|PATCH|HEAD) (\S+) HTTP/1\.[01]\r\n")
RESP_COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")


@dataclass
class Counts:
    exchanges: int = 0
    connections: int = 0
    http_requests: list[str] = field(default_factory=list)
    redis_commands: list[str] = field(default_factory=list)


class Proxy:
    def __init__(self, target_host: str, target_port: int, delay: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self.counts = Counts()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # counting -------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self.counts = Counts()

    def snapshot(self) -> Counts:
        with self._lock:
            c = self.counts
            return Counts(c.exchanges, c.connections, list(c.http_requests), list(c.redis_commands))

    def _note_client(self, data: bytes, fresh: bool) -> None:
        with self._lock:
            if fresh:
                self.counts.exchanges += 1
            for m in HTTP_LINE.finditer(data):
                self.counts.http_requests.append(f"{m.group(1).decode()} {m.group(2).decode()}")
            for m in RESP_COMMAND.finditer(data):
                self.counts.redis_commands.append(m.group(1).decode().upper())

    # proxying -------------------------------------------------------------------
    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: dict[str, bool],
        from_client: bool,
    ) -> None:
        pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await pending.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(65536)
                if from_client and data:
                    self._note_client(data, fresh=state["answered"])
                    state["answered"] = False
                elif data:
                    state["answered"] = True
                pending.put_nowait((time.monotonic() + self.delay, data))
                if not data:
                    break
        except (ConnectionError, OSError):
            pending.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError, OSError):
            await sender

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        with self._lock:
            self.counts.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        state = {"answered": True}
        with contextlib.suppress(asyncio.CancelledError):  # stopping: close quietly
            await asyncio.gather(
                self._pipe(creader, swriter, state, from_client=True),
                self._pipe(sreader, cwriter, state, from_client=False),
                return_exceptions=True,
            )
        for w in (cwriter, swriter):
            with contextlib.suppress(Exception):
                w.close()

    async def serve(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    # in a thread ----------------------------------------------------------------
    def start(self) -> Proxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="netproxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5)
        loop.close()
        self._loop = None

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds, each direction")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    proxy = Proxy(host, int(port), args.delay)

    async def run() -> None:
        await proxy.serve(args.port)
        print(f"port {proxy.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
