"""Tests that need no server: the generated types, errors, retries and
data-plane routing (against httpx.MockTransport)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List

import httpx
import pytest

from space_sdk import (
    AsyncSpace,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    QuotaExceededError,
    Space,
    UnavailableError,
    types,
)
from space_sdk._errors import error_from_response

pytestmark = pytest.mark.offline
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def test_generated_types_match_the_spec(tmp_path: Any) -> None:
    """Drift check: gen_types.py run now must write the committed _types.py."""
    pytest.importorskip("yaml")
    out = tmp_path / "_types.py"
    subprocess.run([sys.executable, os.path.join(ROOT, "gen_types.py"), "--out", str(out)], check=True)
    with open(os.path.join(ROOT, "space_sdk", "_types.py"), encoding="utf-8") as f:
        committed = f.read()
    assert out.read_text(encoding="utf-8") == committed, "space_sdk/_types.py is stale: run gen_types.py"


def test_types_round_trip() -> None:
    doc = {
        "id": "sbx_1", "team": "t", "template": "default", "state": "running", "vcpus": 1,
        "memory_mib": 256, "disk_mib": 4096, "created_at": "x", "updated_at": "y",
        "labels": {"a": "b"}, "network": {"allow": ["example.com:443"], "off": False},
        "vm": {"vmm": "fake", "vmm_version": "1", "accel": "none", "started_by": "boot", "boot_ms": 3},
        "unknown_future_field": 1,
    }
    sb = types.Sandbox.from_dict(doc)
    assert sb.network is not None and sb.network.allow == ["example.com:443"] and sb.network.off is False
    assert sb.vm is not None and sb.vm.boot_ms == 3
    back = sb.to_dict()
    doc.pop("unknown_future_field")
    assert back == doc
    ev = types.Event.from_dict({"type": "stdout", "data": "aGkK"})
    assert ev.data == b"hi\n"
    assert types.Exec(stdin=b"\x00\xff").to_dict() == {"stdin": "AP8="}


def test_error_mapping() -> None:
    body = json.dumps({"error": {"code": "failed_precondition", "message": "m", "field": "f"}}).encode()
    e = error_from_response(409, body)
    assert isinstance(e, FailedPreconditionError) and isinstance(e, ConflictError)
    assert (e.code, e.message, e.field, e.status) == ("failed_precondition", "m", "f", 409)
    assert isinstance(error_from_response(404, b"<html>nope</html>"), NotFoundError)
    ex = error_from_response(429, b'{"error":{"code":"resource_exhausted","message":"q"}}')
    assert isinstance(ex, QuotaExceededError)
    cap = error_from_response(503, b'{"error":{"code":"resource_exhausted","message":"full"}}')
    assert isinstance(cap, UnavailableError) and cap.code == "resource_exhausted"


def _sandbox(sid: str, plane: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": sid, "team": "t", "template": "d", "state": "running", "vcpus": 1, "memory_mib": 256,
            "disk_mib": 512, "created_at": "", "updated_at": "", "data_plane": plane}


def test_retries_idempotent_requests_only() -> None:
    calls: List[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.method + " " + req.url.path)
        if len([c for c in calls if c == calls[-1]]) < 3:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": {"code": "unavailable", "message": "busy"}})
        if req.method == "GET":
            return httpx.Response(200, json={"sandboxes": []})
        return httpx.Response(201, json=_sandbox("sbx_x", {}))

    sp = Space("http://api.test", "k", http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert sp.sandboxes.list() == []
    assert calls == ["GET /v1/sandboxes"] * 3
    calls.clear()
    with pytest.raises(UnavailableError):
        sp.sandboxes.create()  # a create is never retried
    assert calls == ["POST /v1/sandboxes"]


def test_data_plane_routing_and_token_refresh() -> None:
    """exec/files go to the data plane the sandbox names, with its token; a
    401 from the data plane fetches a new token once."""
    seen: List[str] = []
    tokens = iter(["tok1", "tok2"])
    exp = (datetime.now(timezone.utc) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")

    def handler(req: httpx.Request) -> httpx.Response:
        auth = req.headers.get("authorization", "")
        seen.append("%s %s%s %s" % (req.method, req.url.host, req.url.path, auth))
        if req.url.host == "api.test":
            assert auth == "Bearer key"
            return httpx.Response(200, json=_sandbox("sbx_1", {"url": "http://dp.test/", "token": next(tokens),
                                                                "expires_at": exp}))
        if auth == "Bearer tok1":
            return httpx.Response(401, json={"error": {"code": "unauthenticated", "message": "expired"}})
        return httpx.Response(200, content=b"data")

    sp = Space("http://api.test", "key", http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    sb = sp.sandboxes.get("sbx_1")
    assert sb.files.read("/etc/hostname") == b"data"
    assert seen == [
        "GET api.test/v1/sandboxes/sbx_1 Bearer key",
        "GET dp.test/v1/sandboxes/sbx_1/files Bearer tok1",
        "GET api.test/v1/sandboxes/sbx_1 Bearer key",
        "GET dp.test/v1/sandboxes/sbx_1/files Bearer tok2",
    ]


async def test_async_retry_and_errors() -> None:
    n = {"c": 0}

    def handler(req: httpx.Request) -> httpx.Response:
        n["c"] += 1
        if n["c"] == 1:
            return httpx.Response(429, headers={"Retry-After": "0"},
                                  json={"error": {"code": "resource_exhausted", "message": "slow down"}})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "sandbox \"x\": not found"}})

    async with AsyncSpace("http://api.test", "k",
                          http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler))) as sp:
        with pytest.raises(NotFoundError) as ei:
            await sp.sandboxes.get("x")
        assert ei.value.status == 404 and n["c"] == 2
