"""Exposed ports: probe, wait, and HTTP requests to a server in the sandbox."""

from __future__ import annotations

import asyncio

import pytest

from space_sdk import AsyncSpace, Sandbox, UnavailableError


def test_ports_reach_a_guest_server(shared: Sandbox) -> None:
    assert not shared.ports.is_open(8000)
    shared.files.write("/srv/www/hello.txt", "hello through the gateway\n")
    shared.commands.run("python3 -m http.server 8000 --directory /srv/www", background=True).disconnect()
    shared.ports.wait_open(8000, timeout=60)
    assert shared.port_open(8000)

    r = shared.ports.get(8000, "/hello.txt")
    assert (r.status_code, r.text) == (200, "hello through the gateway\n")
    assert r.headers["Space-Port"] == "8000"
    # The guest's own errors come back as answers, not exceptions.
    assert shared.ports.get(8000, "/missing").status_code == 404
    assert shared.ports.post(8000, "/hello.txt", content=b"x").status_code == 501
    # SPACE's own refusal (nothing listens on 8001) raises.
    with pytest.raises(UnavailableError):
        shared.ports.get(8001, "/")
    with pytest.raises(TimeoutError):
        shared.ports.wait_open(8001, timeout=0.5)
    with pytest.raises(ValueError):
        shared.ports.get(70000)

    async def the_async_api() -> None:
        async with AsyncSpace() as aspace:
            sb = aspace.sandboxes.connect(shared.id)
            await sb.ports.wait_open(8000, timeout=5)
            r = await sb.ports.get(8000, "hello.txt")
            assert (r.status_code, r.text) == (200, "hello through the gateway\n")
            with pytest.raises(UnavailableError):
                await sb.ports.get(8001)

    asyncio.run(the_async_api())
