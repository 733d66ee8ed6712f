"""Decoupled models and response senders through the in-process API, in real stubs.

Covers Triton's rules for ``request.get_response_sender()`` (decoupled: any number of responses,
then the final flag; default mode since 24.06: exactly one), its error texts, ``execute``
returning responses in decoupled mode, an exception in ``execute``, a request dropped without
its final flag, cancellation (closing the iterator), async ``execute`` and leaks.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from stubhost.host.result import InferResponse
from tests.host.repo_factory import config_pbtxt, copy_examples, instance, io, wait_until, write_model

# One model, many behaviours: the request parameter "mode" picks one. Texts of exceptions the
# model catches are kept and can be read back with mode "notes".
MODES_PY = '''
import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

NOTES = []
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(value, index=0):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32)),
                                       pb_utils.Tensor("IDX", np.array([index], np.uint32))])


def attempt(call):
    try:
        call()
    except Exception as e:
        NOTES.append(str(e))


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.threads = []

    def execute(self, requests):
        results = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "repeat")
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            results.append(getattr(self, "mode_" + mode)(request, count))
        if any(r == "RETURN" for r in results):
            return [out(1) for _ in requests]
        if any(isinstance(r, pb_utils.InferenceResponse) for r in results):
            return [r if isinstance(r, pb_utils.InferenceResponse) else None for r in results]
        return None

    def later(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    # ---- decoupled ----
    def mode_repeat(self, request, count):
        sender = request.get_response_sender()
        for i in range(count):
            sender.send(out(i, i))
        sender.send(flags=FINAL)

    def mode_threaded(self, request, count):
        def run():
            sender = request.get_response_sender()
            for i in range(count):
                if request.is_cancelled():
                    NOTES.append("cancelled at %d" % i)
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "cancelled", pb_utils.TritonError.CANCELLED)), flags=FINAL)
                    return
                sender.send(out(i, i))
                time.sleep(0.01)
            sender.send(flags=FINAL)
        self.later(run)

    def mode_final_with_response(self, request, count):
        request.get_response_sender().send(out(7), flags=FINAL)

    def mode_send_after_final(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(1), flags=FINAL)
        attempt(lambda: sender.send(out(2)))

    def mode_bad_flags(self, request, count):
        sender = request.get_response_sender()
        attempt(lambda: sender.send(out(1), flags=5))
        attempt(lambda: sender.send(None, flags=0))
        sender.send(flags=FINAL)

    def mode_error_then_more(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(1))
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("second one failed")))
        sender.send(out(3))
        sender.send(flags=FINAL)

    def mode_return(self, request, count):
        return "RETURN"

    def mode_raise(self, request, count):
        raise ValueError("decoupled execute failed")

    def mode_send_then_raise(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(1), flags=FINAL)
        raise ValueError("after the final")

    def mode_never_close(self, request, count):
        request.get_response_sender().send(out(5))

    def mode_crash(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(1))
        def die():
            held = request  # the request stays open: the crash, not its release, ends it
            time.sleep(0.2)
            import os
            os._exit(3)
        self.later(die)

    def mode_notes(self, request, count):
        sender = request.get_response_sender()
        text = json.dumps(NOTES)
        NOTES.clear()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("NOTES", np.array([text.encode()], object))]),
                    flags=FINAL)

    # ---- default mode with a sender ----
    def mode_sender_one(self, request, count):
        request.get_response_sender().send(out(count), flags=FINAL)

    def mode_sender_after_return(self, request, count):
        def run():
            time.sleep(0.05)
            request.get_response_sender().send(out(count), flags=FINAL)
        self.later(run)

    def mode_sender_split(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(count))
        sender.send(flags=FINAL)

    def mode_sender_two(self, request, count):
        sender = request.get_response_sender()
        sender.send(out(count))
        attempt(lambda: sender.send(out(count + 1)))
        sender.send(flags=FINAL)

    def mode_sender_final_first(self, request, count):
        sender = request.get_response_sender()
        attempt(lambda: sender.send(None, flags=FINAL))
        sender.send(out(count), flags=FINAL)

    def mode_sender_and_return(self, request, count):
        request.get_response_sender().send(out(count), flags=FINAL)
        return out(count + 1)

    def mode_mixed(self, request, count):
        if count % 2:
            request.get_response_sender().send(out(count), flags=FINAL)
            return None
        return out(count)

    def mode_raise_with_late_sender(self, request, count):
        def run():
            time.sleep(0.2)
            attempt(lambda: request.get_response_sender().send(out(-1), flags=FINAL))
        self.later(run)
        raise ValueError("failed after handing the request to a thread")

    def mode_nothing(self, request, count):
        return None

    def mode_default_notes(self, request, count):
        text = json.dumps(NOTES)
        NOTES.clear()
        return pb_utils.InferenceResponse([pb_utils.Tensor("NOTES", np.array([text.encode()], object))])
'''

ASYNC_PY = '''
import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        delay = float(pb_utils.get_input_tensor_by_name(requests[0], "DELAY").as_numpy()[0])
        start = time.monotonic()
        await asyncio.sleep(delay)
        if delay < 0:
            raise RuntimeError("negative delay")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", np.array([start, time.monotonic()]))])
                for _ in requests]
'''

ASYNC_DECOUPLED_PY = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(count):
                await asyncio.sleep(0.001)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32)),
                                                        pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

OUTPUTS = [io("OUT", "TYPE_INT32", [1]), io("IDX", "TYPE_UINT32", [1]), io("NOTES", "TYPE_STRING", [1])]
DECOUPLED = "model_transaction_policy { decoupled: true }"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("decoupled") / "models"
    inputs = [io("IN", "TYPE_INT32", [1])]
    write_model(repo, "modes", MODES_PY, config_pbtxt("modes", inputs, OUTPUTS, extra=DECOUPLED))
    write_model(repo, "modes_default", MODES_PY, config_pbtxt("modes_default", inputs, OUTPUTS))
    write_model(repo, "async_default", ASYNC_PY, config_pbtxt(
        "async_default", [io("DELAY", "TYPE_FP64", [1])], [io("SPAN", "TYPE_FP64", [2])]))
    write_model(repo, "async_decoupled", ASYNC_DECOUPLED_PY, config_pbtxt(
        "async_decoupled", inputs, OUTPUTS[:2], extra=DECOUPLED))
    copy_examples(repo, "repeat", "add_sub")
    with stubhost.Server(repo) as s:
        yield s


def run(server: stubhost.Server, mode: str, count: int = 0, model: str = "modes") -> list[dict[str, np.ndarray]]:
    return list(server.stream(model, {"IN": np.array([count], np.int32)}, parameters={"mode": mode}, timeout=30))


def responses(server: stubhost.Server, mode: str, count: int = 0, model: str = "modes") -> list[InferResponse]:
    return list(server.stream_responses(model, {"IN": np.array([count], np.int32)}, parameters={"mode": mode},
                                        timeout=30))


def notes(server: stubhost.Server, model: str = "modes") -> list[str]:
    if model == "modes":
        (result,) = run(server, "notes")
    else:
        result = server.infer(model, {"IN": np.array([0], np.int32)}, parameters={"mode": "default_notes"})
    return json.loads(result["NOTES"][0])


def values(outputs: list[dict[str, np.ndarray]]) -> list[int]:
    return [int(o["OUT"][0]) for o in outputs]


# ---- decoupled: responses ------------------------------------------------------------------------
def test_stream_yields_each_response_in_order(server: stubhost.Server) -> None:
    outputs = run(server, "repeat", 5)
    assert values(outputs) == [0, 1, 2, 3, 4]
    assert [int(o["IDX"][0]) for o in outputs] == [0, 1, 2, 3, 4]


def test_zero_responses_then_final_is_an_empty_stream(server: stubhost.Server) -> None:
    assert run(server, "repeat", 0) == []
    (last,) = responses(server, "repeat", 0)
    assert last.final and last.empty


def test_responses_are_flagged_and_the_flag_alone_ends_the_stream(server: stubhost.Server) -> None:
    got = responses(server, "repeat", 3)
    assert [r.final for r in got] == [False, False, False, True]
    assert got[-1].empty and not got[0].empty
    assert all(r.model_version == 1 for r in got)


def test_final_flag_may_come_with_the_last_response(server: stubhost.Server) -> None:
    (only,) = responses(server, "final_with_response")
    assert only.final and not only.empty and int(only.outputs["OUT"][0]) == 7


def test_responses_sent_from_a_thread_after_execute_returned(server: stubhost.Server) -> None:
    assert values(run(server, "threaded", 20)) == list(range(20))


def test_example_repeat_model(server: stubhost.Server) -> None:
    outputs = list(server.stream("repeat", {"IN": np.array([4, 5, 6], np.int32)}))
    assert values(outputs) == [4, 5, 6]


def test_async_stream(server: stubhost.Server) -> None:
    async def collect() -> list[dict[str, np.ndarray]]:
        return [o async for o in server.stream_async("modes", {"IN": np.array([6], np.int32)},
                                                     parameters={"mode": "repeat"})]

    assert values(asyncio.run(collect())) == list(range(6))


def test_concurrent_async_streams_do_not_mix(server: stubhost.Server) -> None:
    async def one(n: int) -> list[int]:
        return values([o async for o in server.stream_async("modes", {"IN": np.array([n], np.int32)},
                                                            parameters={"mode": "threaded"})])

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(one(n) for n in range(1, 9)))

    assert asyncio.run(main()) == [list(range(n)) for n in range(1, 9)]


def test_back_to_back_streams_from_several_threads_each_get_their_own_responses(server: stubhost.Server) -> None:
    """A request record freed at a stream's end is soon reused for the next request at the same
    offset: its responses must reach the new stream, never the old one (which would drop them
    and leave the new caller waiting)."""
    failures: list[str] = []

    def caller(index: int) -> None:
        for i in range(150):
            n = 1 + (index + i) % 4
            try:
                got = values(list(server.stream("modes", {"IN": np.array([n], np.int32)},
                                                parameters={"mode": "threaded" if i % 2 else "repeat"}, timeout=20)))
            except InferenceError as e:
                failures.append(f"caller {index}, stream {i}: {e}")
                return
            if got != list(range(n)):
                failures.append(f"caller {index}, stream {i}: {got} instead of {list(range(n))}")
                return

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []


def test_infer_on_a_decoupled_model_is_refused(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        server.infer("modes", {"IN": np.array([1], np.int32)}, parameters={"mode": "repeat"})
    assert e.value.code == "UNSUPPORTED" and "decoupled" in e.value.message
    assert server.is_decoupled("modes") and not server.is_decoupled("add_sub")


def test_stream_of_a_default_mode_model_gives_its_one_response(server: stubhost.Server) -> None:
    x = np.arange(4, dtype=np.float32)
    (outputs,) = list(server.stream("add_sub", {"INPUT0": x, "INPUT1": x}))
    np.testing.assert_array_equal(outputs["OUTPUT0"], 2 * x)


# ---- decoupled: Triton's error rules ---------------------------------------------------------------
def test_send_after_the_final_flag_is_refused(server: stubhost.Server) -> None:
    assert values(run(server, "send_after_final")) == [1]
    assert notes(server) == ["Unable to send response. Response sender has been closed."]


def test_bad_flags_and_a_missing_response_are_refused(server: stubhost.Server) -> None:
    assert run(server, "bad_flags") == []
    assert notes(server) == ["Unable to send response. Unsupported flag provided.",
                             "Inference Response object must be provided when the response flags is set to zero."]


def test_an_error_response_does_not_end_the_stream(server: stubhost.Server) -> None:
    got = responses(server, "error_then_more")
    assert [r.error is not None for r in got] == [False, True, False, False]
    assert got[1].error.message == "second one failed" and got[1].error.code == "INTERNAL"
    assert int(got[2].outputs["OUT"][0]) == 3 and got[3].final
    with pytest.raises(InferenceError, match="second one failed"):
        run(server, "error_then_more")


def test_returning_responses_from_a_decoupled_execute_fails_the_requests(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        run(server, "return")
    assert "Python model 'modes_0' is using the decoupled mode and the execute function must return None." \
        in e.value.message
    assert e.value.message.startswith("Failed to process the request(s) for model 'modes_0'")


def test_an_exception_in_a_decoupled_execute_ends_each_open_request(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        run(server, "raise")
    assert "ValueError: decoupled execute failed" in e.value.message
    # A request already closed keeps what it got: the error has nowhere to go.
    assert values(run(server, "send_then_raise")) == [1]


def test_a_request_dropped_without_its_final_flag_is_closed(server: stubhost.Server,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    got = responses(server, "never_close")
    assert int(got[0].outputs["OUT"][0]) == 5
    assert got[-1].final and got[-1].empty
    assert wait_until(lambda: "released without its final response" in caplog.text, 5.0)


def test_a_stub_crash_mid_stream_fails_the_stream_and_the_instance_restarts(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "modes", MODES_PY, config_pbtxt("modes", [io("IN", "TYPE_INT32", [1])], OUTPUTS,
                                                      extra=DECOUPLED))
    with stubhost.Server(repo) as server:
        crash_mid_stream(server)


def crash_mid_stream(server: stubhost.Server) -> None:
    stream = server.stream("modes", {"IN": np.array([0], np.int32)}, parameters={"mode": "crash"}, timeout=30)
    assert values([next(stream)]) == [1]
    with pytest.raises(InferenceError, match="is not healthy"):
        next(stream)
    assert wait_until(lambda: server.model_ready("modes"), 30.0)
    assert values(run(server, "repeat", 2)) == [0, 1]


def test_timeout_bounds_the_whole_stream(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        list(server.stream("repeat", {"IN": np.arange(50, dtype=np.int32), "DELAY_MS": np.array([20], np.uint32)},
                           timeout=0.2))
    assert e.value.code == "UNAVAILABLE"
    assert values(run(server, "repeat", 2)) == [0, 1]  # nothing left stuck


# ---- cancellation ----------------------------------------------------------------------------------
def test_closing_the_iterator_cancels_the_request(server: stubhost.Server) -> None:
    notes(server)  # start clean
    stream = server.stream("modes", {"IN": np.array([500], np.int32)}, parameters={"mode": "threaded"})
    assert values([next(stream), next(stream)]) == [0, 1]
    stream.close()
    assert wait_until(lambda: any(n.startswith("cancelled at") for n in notes(server)), 10.0)


def test_leaving_an_async_for_cancels_the_request(server: stubhost.Server) -> None:
    notes(server)

    async def first_three() -> list[int]:
        got = []
        stream = server.stream_async("modes", {"IN": np.array([500], np.int32)}, parameters={"mode": "threaded"})
        async for o in stream:
            got.append(int(o["OUT"][0]))
            if len(got) == 3:
                break
        await stream.aclose()
        return got

    assert asyncio.run(first_three()) == [0, 1, 2]
    assert wait_until(lambda: any(n.startswith("cancelled at") for n in notes(server)), 10.0)


def test_cancelling_the_task_of_an_async_stream_cancels_the_request(server: stubhost.Server) -> None:
    notes(server)

    async def main() -> None:
        async def consume() -> None:
            async for _ in server.stream_async("modes", {"IN": np.array([500], np.int32)},
                                               parameters={"mode": "threaded"}):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: any(n.startswith("cancelled at") for n in notes(server)), 10.0)


# ---- default mode with a response sender (Triton 24.06+) ----------------------------------------------
@pytest.mark.parametrize("mode", ["sender_one", "sender_after_return", "sender_split"])
def test_default_mode_model_may_answer_through_its_sender(server: stubhost.Server, mode: str) -> None:
    result = server.infer("modes_default", {"IN": np.array([9], np.int32)}, parameters={"mode": mode})
    assert int(result["OUT"][0]) == 9


def test_default_mode_sender_answer_async(server: stubhost.Server) -> None:
    async def main() -> int:
        result = await server.infer_async("modes_default", {"IN": np.array([4], np.int32)},
                                          parameters={"mode": "sender_after_return"})
        return int(result["OUT"][0])

    assert asyncio.run(main()) == 4


def test_default_mode_sender_refuses_a_second_response(server: stubhost.Server) -> None:
    result = server.infer("modes_default", {"IN": np.array([3], np.int32)}, parameters={"mode": "sender_two"})
    assert int(result["OUT"][0]) == 3
    assert notes(server, "modes_default") == ["Unable to send response. Non-decoupled model cannot send more than "
                                              "one response."]


def test_default_mode_sender_refuses_final_before_a_response(server: stubhost.Server) -> None:
    result = server.infer("modes_default", {"IN": np.array([2], np.int32)},
                          parameters={"mode": "sender_final_first"})
    assert int(result["OUT"][0]) == 2
    assert notes(server, "modes_default") == ["Unable to send response. Non-decoupled model cannot send complete "
                                              "final before sending a response."]


def test_default_mode_returning_a_response_after_sending_one_keeps_the_sent_one(
        server: stubhost.Server, caplog: pytest.LogCaptureFixture) -> None:
    # As in Triton: the request was answered through its sender, so the caller gets that answer
    # and the broken rule is logged.
    result = server.infer("modes_default", {"IN": np.array([2], np.int32)}, parameters={"mode": "sender_and_return"})
    assert int(result["OUT"][0]) == 2
    assert wait_until(lambda: "Unable to send response." in caplog.text, 5.0)
    # The record the sender answered is reused by later requests without mixing answers.
    for n in range(20):
        assert int(server.infer("modes_default", {"IN": np.array([n], np.int32)},
                                parameters={"mode": "mixed"})["OUT"][0]) == n


def test_default_mode_returned_list_may_leave_sender_answered_requests_as_none(server: stubhost.Server) -> None:
    results = {}

    def call(n: int) -> None:
        results[n] = int(server.infer("modes_default", {"IN": np.array([n], np.int32)},
                                      parameters={"mode": "mixed"})["OUT"][0])

    threads = [threading.Thread(target=call, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: n for n in range(6)}


def test_default_mode_request_left_unanswered_fails_clearly(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        server.infer("modes_default", {"IN": np.array([1], np.int32)}, parameters={"mode": "nothing"})
    assert e.value.code == "INTERNAL" and "sent no response for the request" in e.value.message


# ---- async execute -----------------------------------------------------------------------------------
def test_async_default_mode_requests_overlap(server: stubhost.Server) -> None:
    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(server.infer_async("async_default", {"DELAY": np.array([0.5])})
                                      for _ in range(3)))

    begin = time.monotonic()
    spans = [r["SPAN"] for r in asyncio.run(main())]
    elapsed = time.monotonic() - begin
    # Three 0.5 s requests run at once: each started before any other ended.
    assert max(s[0] for s in spans) < min(s[1] for s in spans)
    assert elapsed < 1.4


def test_async_default_mode_exception_fails_the_request(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as e:
        server.infer("async_default", {"DELAY": np.array([-1.0])})
    assert "RuntimeError: negative delay" in e.value.message
    assert server.infer("async_default", {"DELAY": np.array([0.0])})["SPAN"].shape == (2,)


def test_async_decoupled_execute(server: stubhost.Server) -> None:
    assert values(list(server.stream("async_decoupled", {"IN": np.array([5], np.int32)}))) == list(range(5))


# ---- statistics and leaks ----------------------------------------------------------------------------
def test_statistics_count_streamed_requests(server: stubhost.Server) -> None:
    before = server.statistics("repeat")["model_stats"][0]["inference_stats"]
    for _ in range(3):
        list(server.stream("repeat", {"IN": np.array([1, 2], np.int32)}))
    after = server.statistics("repeat")["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] == before["success"]["count"] + 3


def test_a_thousand_streams_leave_the_pool_as_it_was(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "repeat")
    with stubhost.Server(repo) as server:
        pool = instance(server, "repeat").process.pool
        list(server.stream("repeat", {"IN": np.arange(3, dtype=np.int32)}))
        baseline = 5  # the control block and its four queues
        assert wait_until(lambda: pool.allocations == baseline, 5.0), pool.allocations
        for i in range(1000):
            got = list(server.stream("repeat", {"IN": np.arange(i % 4, dtype=np.int32)}))
            assert len(got) == i % 4
        for i in range(20):  # cancelled streams too
            stream = server.stream("repeat", {"IN": np.arange(100, dtype=np.int32),
                                              "DELAY_MS": np.array([5], np.uint32)})
            next(stream)
            stream.close()
        del got
        assert wait_until(lambda: not instance(server, "repeat").process.streams and pool.allocations == baseline,
                          10.0), (pool.allocations, baseline)


def test_a_failed_request_cannot_be_answered_later_by_its_sender(server: stubhost.Server) -> None:
    # The error in the Execute reply answers the request: a thread that still holds it must not
    # send an answer that the parent would route to a later request reusing the same record.
    with pytest.raises(InferenceError, match="failed after handing the request to a thread"):
        server.infer("modes_default", {"IN": np.array([0], np.int32)}, parameters={"mode": "raise_with_late_sender"})
    begin = time.monotonic()
    while time.monotonic() - begin < 0.5:
        n = int(time.monotonic() * 1000) % 1000
        result = server.infer("modes_default", {"IN": np.array([n], np.int32)}, parameters={"mode": "sender_one"})
        assert int(result["OUT"][0]) == n
    assert notes(server, "modes_default") == ["Unable to send response. Response sender has been closed."]
    assert not instance(server, "modes_default").process.streams


def test_timeout_bounds_the_whole_async_stream(server: stubhost.Server) -> None:
    async def consume() -> None:
        async for _ in server.stream_async("repeat", {"IN": np.arange(50, dtype=np.int32),
                                                      "DELAY_MS": np.array([20], np.uint32)}, timeout=0.2):
            pass

    begin = time.monotonic()
    with pytest.raises(InferenceError) as e:
        asyncio.run(consume())
    assert e.value.code == "UNAVAILABLE" and time.monotonic() - begin < 0.8
