"""Two-process demo of the IPC core: ``python -m stubhost.demo``.

The parent creates a pool and an IPC control block with its queues, starts a child interpreter
that attaches them (one structured JSON argument), hands it tensors as zero-copy views, and reads
its answers back, the way the stub protocol will: handshake, Execute*, Finalize, exit, unlink.
Later issues replace this with ``stubhost serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

from stubhost import _core
from stubhost._core import Command, IPCControl, IPCMessage, MessageQueue, Pool
from stubhost.tensor import SharedTensor

TIMEOUT_S = 10.0


# ---- child ---------------------------------------------------------------------------------------
def child_main(spec_json: str) -> int:
    """The child side: attach, then answer Execute requests until Finalize or the parent dies."""
    spec = json.loads(spec_json)
    pool = Pool.attach(spec["pool"])
    control = IPCControl.attach(pool, spec["control"])
    inbox = MessageQueue.attach(pool, control.stub_message_queue)
    outbox = MessageQueue.attach(pool, control.parent_message_queue)
    control.stub_pid = os.getpid()
    control.set_health(stub=True, value=True)
    hello = IPCMessage.create(pool, Command.PING, request_id=os.getpid())
    outbox.push(hello.handle, timeout=TIMEOUT_S)
    while True:
        handle = inbox.pop(timeout=1.0)
        if handle is None:
            if os.getppid() != control.parent_pid:  # orphaned: clean up the parent's segments
                pool.unlink()
                return 1
            continue
        request = IPCMessage.attach(pool, handle)
        if request.command == Command.FINALIZE_REQUEST:
            done = IPCMessage.create(pool, Command.FINALIZE_RESPONSE, request_id=request.request_id)
            request.release()
            outbox.push(done.handle, timeout=TIMEOUT_S)
            return 0
        source = SharedTensor.read(pool, request.args)
        result = SharedTensor.empty(pool, "OUTPUT0", source.dtype, source.shape)
        np.multiply(source.as_numpy(), 2, out=result.as_numpy())  # reads and writes pool memory in place
        reply = IPCMessage.create(pool, Command.EXECUTE_RESPONSE, args=result.handle, request_id=request.request_id)
        request.release()  # popped, so ours; its input tensor stays the parent's
        outbox.push(reply.handle, timeout=TIMEOUT_S)


# ---- parent --------------------------------------------------------------------------------------
class Demo:
    """The parent side: owns the pool, the control block, the queues and the child."""

    def __init__(self) -> None:
        self.pool = Pool.create()
        self.control = IPCControl.create(self.pool)
        self.to_child = MessageQueue.create(self.pool, 64)
        self.to_parent = MessageQueue.create(self.pool, 64)
        self.control.stub_message_queue = self.to_child.handle
        self.control.parent_message_queue = self.to_parent.handle
        self.control.parent_pid = os.getpid()
        self.control.set_health(stub=False, value=True)
        spec = json.dumps({"pool": self.pool.name, "control": self.control.handle})
        self.child = subprocess.Popen([sys.executable, "-m", "stubhost.demo", "--child", spec])

    def receive(self, expected: Command) -> IPCMessage:
        handle = self.to_parent.pop(timeout=TIMEOUT_S)
        if handle is None:
            raise TimeoutError(f"child sent no {expected.name} within {TIMEOUT_S} s (exit code {self.child.poll()})")
        message = IPCMessage.attach(self.pool, handle)
        if message.command != expected:
            raise RuntimeError(f"expected {expected.name}, child sent {message.command.name}")
        return message

    def execute(self, array: np.ndarray, request_id: int) -> np.ndarray:
        """Sends one tensor, returns a copy of the child's answer and frees everything."""
        tensor = SharedTensor.from_numpy(self.pool, "INPUT0", array)
        request = IPCMessage.create(self.pool, Command.EXECUTE_REQUEST, args=tensor.handle, request_id=request_id)
        self.to_child.push(request.handle, timeout=TIMEOUT_S)
        reply = self.receive(Command.EXECUTE_RESPONSE)
        result = SharedTensor.read(self.pool, reply.args)
        out = result.as_numpy().copy()
        # The child passed us its reply and its output tensor; the input tensor was only lent.
        reply.release()
        result.free()
        tensor.free()
        return out

    def finalize(self) -> int:
        request = IPCMessage.create(self.pool, Command.FINALIZE_REQUEST, request_id=0)
        self.to_child.push(request.handle, timeout=TIMEOUT_S)
        self.receive(Command.FINALIZE_RESPONSE).release()
        return self.child.wait(TIMEOUT_S)

    def close(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        self.pool.close()


def run(elements: int, iterations: int) -> int:
    """Runs the demo and prints one line per step; returns the process exit code."""
    rows: list[tuple[str, str]] = []
    demo = Demo()
    baseline = demo.pool.used_bytes
    try:
        hello = demo.receive(Command.PING)
        rows.append(("handshake", f"child {hello.request_id} attached pool {demo.pool.name} (layout v{_core.LAYOUT_VERSION})"))
        hello.release()

        big = np.arange(elements, dtype=np.float32)
        start = time.perf_counter()
        out = demo.execute(big, request_id=1)
        elapsed = time.perf_counter() - start
        ok = np.array_equal(out, big * 2)
        rows.append((f"execute {elements:,} x FP32 (x2)", f"{'correct' if ok else 'WRONG'} in {elapsed * 1e3:.1f} ms"))

        small = np.arange(4, dtype=np.float32)
        times = []
        for i in range(iterations):
            t0 = time.perf_counter_ns()
            demo.execute(small, request_id=i + 2)
            times.append(time.perf_counter_ns() - t0)
        median, p99 = np.percentile(np.array(times) / 1e3, [50, 99])
        rows.append((f"round trip 4 x FP32 (n={iterations})", f"median {median:.1f} us, p99 {p99:.1f} us"))

        code = demo.finalize()
        rows.append(("finalize", f"child exited with {code}"))
        ok = ok and code == 0
    finally:
        used = demo.pool.used_bytes - baseline
        demo.close()
    leaked = [n for n in os.listdir("/dev/shm") if demo.pool.name.lstrip("/") in n]
    rows.append(("pool after finalize", f"{used} bytes in use beyond the control block and queues; /dev/shm {'clean' if not leaked else f'LEAKED {leaked}'}"))
    width = max(len(step) for step, _ in rows)
    print(f"{'step'.ljust(width)}  result")
    for step, result in rows:
        print(f"{step.ljust(width)}  {result}")
    return 0 if ok and not leaked and used == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m stubhost.demo``."""
    parser = argparse.ArgumentParser(prog="python -m stubhost.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 22, help="elements of the large tensor")
    parser.add_argument("--iterations", type=int, default=2000, help="small round trips to time")
    parser.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    return run(args.elements, args.iterations)


if __name__ == "__main__":
    sys.exit(main())
