"""Fixtures shared by the front-end test modules.

A module that defines a module-scoped ``server`` fixture (a running ServeProcess) gets ``conns``
(one open client per protocol, shared by the module), ``conn`` (each test once per protocol) and
``quiet_log`` (the test fails if the server logged an error or a traceback meanwhile).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.server.frontend_support import PROTOCOLS, Conn
from tests.server.serve_process import ServeProcess


# An ERROR line in either of Triton's formats ("E1123 16:39:47.123456 ..." or "...Z E ...").
ERROR_LINE = re.compile(r"^(E\d{4} \d\d:|\d{4}-\d\d-\d\dT\S+Z E )", re.MULTILINE)


@pytest.fixture(scope="module")
def conns(server: ServeProcess) -> Iterator[dict[str, Conn]]:
    opened = {protocol: Conn.open(protocol, server) for protocol in PROTOCOLS}
    yield opened
    for c in opened.values():
        c.close()


@pytest.fixture(params=PROTOCOLS)
def conn(request: pytest.FixtureRequest, conns: dict[str, Conn]) -> Conn:
    return conns[request.param]


@pytest.fixture
def quiet_log(server: ServeProcess) -> Iterator[None]:
    """Fails the test if the server logged an error or a traceback while it ran."""
    before = len(server.log)
    yield
    added = server.log[before:]
    assert "Traceback" not in added and not ERROR_LINE.search(added), added
