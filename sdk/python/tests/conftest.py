"""Fixtures for the tests, which run against a real SPACE server.

SPACE_API_URL and SPACE_API_KEY (an admin key) name it; run-tests.sh
starts one. The machine has 2 cores: sandboxes are 256 MiB and at most
two are alive at once (a module's shared sandbox plus one of a test).
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any, Dict, Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from space_sdk import Sandbox, Space  # noqa: E402

RUN = uuid.uuid4().hex[:8]
LABELS = {"sdk-test": RUN}
MEM = 256


def sandbox_args(**kw: Any) -> Dict[str, Any]:
    """create() arguments of a test sandbox: small, labelled, short-lived."""
    args: Dict[str, Any] = {"memory_mib": MEM, "labels": dict(LABELS), "timeout": 1800}
    if "labels" in kw:
        args["labels"].update(kw.pop("labels"))
    args.update(kw)
    return args


def pytest_collection_modifyitems(config: pytest.Config, items: Any) -> None:
    if not os.environ.get("SPACE_API_URL") or not os.environ.get("SPACE_API_KEY"):
        skip = pytest.mark.skip(reason="needs a server: SPACE_API_URL and SPACE_API_KEY (run-tests.sh)")
        for item in items:
            if "offline" not in item.keywords:
                item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "offline: needs no server")


@pytest.fixture(scope="session")
def space() -> Iterator[Space]:
    s = Space()
    yield s
    # Whatever a failed test left behind.
    for sb in s.sandboxes.list(labels=LABELS):
        sb.delete(missing_ok=True)
    s.close()


@pytest.fixture(scope="module")
def shared(space: Space) -> Iterator[Sandbox]:
    """One sandbox for a whole module's tests that leave it running."""
    sb = space.sandboxes.create(**sandbox_args())
    yield sb
    sb.delete(missing_ok=True)


@pytest.fixture
def sandbox(space: Space) -> Iterator[Sandbox]:
    """A sandbox of the test's own."""
    sb = space.sandboxes.create(**sandbox_args())
    yield sb
    sb.delete(missing_ok=True)
