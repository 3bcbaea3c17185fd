"""Request bodies are capped (HAMi's 1 MiB, ``--max-body-bytes``): a larger one gets HTTP 413 unread.

Spoken over a raw socket, so the test controls exactly what is sent and when: the answer to a
2 MiB ``Content-Length`` comes before any of the body is sent (nothing is buffered), and a chunked
body is cut off at the limit. The connection is closed after a 413, so the rest is never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from tests.builders import make_node
from tests.eventually import time_scale

from .kit import Extender, StartExtender

MIB = 1024 * 1024
#: bound on waiting for one answer; each answer is expected at once
ANSWER_WITHIN = 20.0


async def connect(ext: Extender) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    server = ext.client.server
    return await asyncio.open_connection(str(server.host), int(server.port or 0))


def head(path: str, **headers: str | int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_and_rest(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status code of the answer, and everything after it until the server closes."""
    status_line = await asyncio.wait_for(reader.readline(), ANSWER_WITHIN * time_scale())
    rest = await asyncio.wait_for(reader.read(), ANSWER_WITHIN * time_scale())  # at EOF: the server closed
    return int(status_line.split()[1]), rest


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):  # the server may have reset a connection it stopped reading
        await writer.wait_closed()


def padded(size: int) -> bytes:
    """A filter request of exactly ``size`` bytes (JSON padded with spaces)."""
    body = json.dumps({"Pod": None, "Nodes": None, "NodeNames": ["n1"]}).encode()
    return body + b" " * (size - len(body))


async def test_a_declared_2_mib_body_is_refused_before_it_is_sent(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    for path in ("/filter", "/prioritize", "/bind"):
        reader, writer = await connect(ext)
        writer.write(head(path, Content_Length=2 * MIB))  # headers only: the body never comes
        await writer.drain()
        status, rest = await status_and_rest(reader)
        assert status == 413, path
        assert b"Connection: close" in rest
        await close(writer)


async def test_a_2_mib_body_gets_413(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    reader, writer = await connect(ext)
    writer.write(head("/filter", Content_Length=2 * MIB) + padded(2 * MIB))
    status, _ = await status_and_rest(reader)
    assert status == 413
    await close(writer)


async def test_a_chunked_body_is_cut_off_at_the_limit(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    reader, writer = await connect(ext)
    writer.write(head("/filter", Transfer_Encoding="chunked"))
    chunk = b" " * (64 * 1024)
    for _ in range(32):  # 2 MiB in 64 KiB chunks, never terminated
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    status, _ = await status_and_rest(reader)
    assert status == 413
    await close(writer)


async def test_a_body_of_exactly_the_limit_is_served(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    response = await ext.client.post("/filter", data=padded(MIB))
    assert response.status == 200
    assert (await response.json())["Error"] == "extender args missing pod"


async def test_the_limit_follows_the_flag(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], max_body_bytes=4096)
    assert (await ext.client.post("/filter", data=padded(4096))).status == 200
    too_big = await ext.client.post("/filter", data=padded(4097))
    assert too_big.status == 413
    assert await too_big.text() == "request body larger than 4096 bytes"
