"""The stub's bookkeeping of cancellations: a CANCEL_REQUEST names a request by its record and
serial, so one that arrives late never cancels a newer request sent in the same record."""

from __future__ import annotations

from stubhost import _core
from stubhost.backend_utils.request import InferenceRequest
from stubhost.protocol import RESPONSE_FINAL
from stubhost.stub import codec
from stubhost.stub.responder import MAX_CANCELLED, StubResponder


def request_in(pool: _core.Pool, serial: int) -> tuple[InferenceRequest, int]:
    """A request as the stub reads it from a record the parent wrote with `serial`."""
    record = _core.write_record(pool, int(_core.RecordKind.REQUEST), serial, (0, 0, 0), ("id", "{}", "", ""), [])
    return codec.read_requests(pool, record, "m", 1)[0], record


def responder(pool: _core.Pool) -> StubResponder:
    return StubResponder(pool, _core.MessageQueue.create(pool, 8), lambda: True, {})


def test_a_running_request_is_cancelled_by_its_own_serial_only(pool: _core.Pool) -> None:
    r = responder(pool)
    request, record = request_in(pool, 7)
    r.begin([request])
    r.cancel(record, 8)  # another request's serial
    assert not r.is_cancelled(request)
    r.cancel(record, 7)
    assert r.is_cancelled(request)
    r.end([request])
    assert r.cancelled == {} and r.running == {}


def test_a_late_cancellation_does_not_reach_the_next_request_in_the_record(pool: _core.Pool) -> None:
    r = responder(pool)
    first, record = request_in(pool, 1)
    r.begin([first])
    r.end([first])
    pool.free(record)
    second, again = request_in(pool, 2)
    assert again == record  # the pool hands the same offset to the next request
    r.begin([second])
    r.cancel(record, 1)  # the first request's cancellation, read only now
    assert not r.is_cancelled(second)
    r.cancel(record, 2)
    assert r.is_cancelled(second)
    assert not r.is_cancelled(first)
    r.end([second])


def test_a_cancellation_with_serial_zero_matches_no_request(pool: _core.Pool) -> None:
    """0 is the status of records no parent numbered (a BLS request): it names nothing."""
    r = responder(pool)
    request, record = request_in(pool, 9)
    r.cancel(record, 0)
    r.begin([request])
    r.cancel(record, 0)
    assert not r.is_cancelled(request) and r.cancelled == {}
    r.end([request])


def test_a_request_cancelled_before_it_starts_starts_cancelled(pool: _core.Pool) -> None:
    """A default-mode request still waiting in the stub's inbox when its caller gives up."""
    r = responder(pool)
    request, record = request_in(pool, 3)
    r.cancel(record, 3)
    r.begin([request])
    assert r.is_cancelled(request)
    r.end([request])
    assert r.cancelled == {} and r.running == {}


def test_stale_cancellations_are_forgotten_but_not_those_of_running_requests(pool: _core.Pool) -> None:
    """Cancellations that came after their requests ended are bounded; a running request's stays."""
    r = responder(pool)
    request, record = request_in(pool, 4)
    r.begin([request])
    r.cancel(record, 4)
    for handle in range(1, MAX_CANCELLED + 2):  # handles of requests that ended long ago
        r.cancel(record + 64 * handle, 99)
    assert len(r.cancelled) <= MAX_CANCELLED // 2 + 2  # pruned to half, then one more came
    assert r.is_cancelled(request)
    r.end([request])


def test_an_open_request_stays_cancellable_after_its_execute(pool: _core.Pool) -> None:
    """A request whose sender answers it later is watched: it can be cancelled until its final."""
    r = responder(pool)
    request, record = request_in(pool, 5)
    r.begin([request])
    r.watch(request, 0)
    r.end([request])
    r.cancel(record, 5)
    assert r.is_cancelled(request)
    r.send(request, None, RESPONSE_FINAL)  # its final: the request is over
    assert r.cancelled == {} and r.open == {}
