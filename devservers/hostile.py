"""A hostile HTTP server, shared by the answer-bounds tests (``tests/providers/test_answer_bounds.py``) and their
benchmark (``bench/hostile_answers.py``): every request, on any path, is answered as ``mode`` says, the way issue 41
found servers can answer (an endless body, a trickle, a gzip bomb, a content coding not asked for, a reset in the
middle of the answer), or with an empty ``200 {}``. Every answer closes its connection.

Nothing here imports pytest or the runner.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib

__all__ = ["MODES", "HostileServer", "gzip_of_zeros"]

MIB = 1 << 20
#: the head every answer starts with
HEAD = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n"
MODES = ("empty", "endless", "trickle", "bomb", "brotli", "reset")


def gzip_of_zeros(size: int) -> bytes:
    """``size`` bytes of zeros (whole MiB), gzipped: about a thousandth of that."""
    pack = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    block = bytes(MIB)
    return b"".join(pack.compress(block) for _ in range(size // MIB)) + pack.flush()


class HostileServer:
    """Answers every request as :attr:`mode` says (one of :data:`MODES`) and counts them. ``bomb``: what the gzip
    bomb inflates to; ``chunk``: each chunk of the endless body; ``trickle``: the trickled answer's bytes, one every
    ``gap`` seconds."""

    def __init__(self, *, bomb: int = 64 * MIB, chunk: int = 1 << 16, trickle: int = 1000, gap: float = 0.05) -> None:
        self.mode = "endless"
        self.requests = 0
        self.bomb = gzip_of_zeros(bomb)
        self.chunk = b"%x\r\n%s\r\n" % (chunk, b"a" * chunk)
        self.trickled = b'{"choices": []}'.ljust(trickle)
        self.gap = gap
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listen on 127.0.0.1 (a free port); the root URL."""
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            self.requests += 1
            await getattr(self, f"_{self.mode}")(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _empty(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Length: 2\r\n\r\n{}")
        await writer.drain()

    async def _endless(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n7\r\n{\"x\":\"a\r\n")
        while True:  # until the client goes
            writer.write(self.chunk)
            await writer.drain()

    async def _trickle(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Length: %d\r\n\r\n" % len(self.trickled))
        for at in range(len(self.trickled)):
            writer.write(self.trickled[at:at + 1])
            await writer.drain()
            await asyncio.sleep(self.gap)

    async def _bomb(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(self.bomb) + self.bomb)
        await writer.drain()

    async def _brotli(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Encoding: br\r\nContent-Length: 4\r\n\r\nabcd")
        await writer.drain()

    async def _reset(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Length: 1000\r\n\r\n{\"ch")
        await writer.drain()
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN
