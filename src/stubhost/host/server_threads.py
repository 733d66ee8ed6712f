"""What runs beside a Server: its health monitor and repository poller threads, which hold it
weakly (an unreferenced server can be collected), and the process-wide clean-up that closes
every live Server at exit and on SIGTERM."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stubhost.host.server import Server

__all__ = ["HEALTH_PERIOD_S", "close_all", "poll_repositories", "track", "untrack", "watch"]

log = logging.getLogger("stubhost")

HEALTH_PERIOD_S = 0.05


def poll_repositories(server_ref: weakref.ref[Server], closed: threading.Event, interval: float) -> None:
    """Poll mode's thread; like the health monitor it holds the server weakly."""
    while not closed.wait(interval):
        server = server_ref()
        if server is None:
            return
        try:
            server.poll()
        except Exception:  # a bad poll (a folder vanishing mid-scan) must not end polling
            log.exception("polling the model repository failed")
        del server


def watch(server_ref: weakref.ref[Server], closed: threading.Event) -> None:
    """The health monitor; it holds the server weakly, so an unreferenced server can be collected."""
    while not closed.wait(HEALTH_PERIOD_S):
        server = server_ref()
        if server is None:
            return
        server._check_health()
        del server


# ---- process-wide clean-up -----------------------------------------------------------------------
_live_servers: weakref.WeakSet[Server] = weakref.WeakSet()
_handlers_installed = False


def close_all() -> None:
    """Closes every live Server (at exit and on SIGTERM)."""
    for server in list(_live_servers):
        server.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def track(server: Server) -> None:
    """Counts a new Server among those closed at exit and on SIGTERM."""
    _live_servers.add(server)
    _install_signal_handlers()


def untrack(server: Server) -> None:
    """Forgets a closed Server."""
    _live_servers.discard(server)


def _install_signal_handlers() -> None:
    """SIGTERM closes the servers, then terminates as before; SIGINT raises KeyboardInterrupt
    as usual, which leaves ``with`` blocks and so closes them."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    atexit.register(close_all)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
