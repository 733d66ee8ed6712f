"""Streams each element of IN back as its own response, DELAY_MS apart, from a worker thread.

The way Triton's decoupled examples work: ``execute`` hands each request to a thread and
returns None at once; the thread sends through the request's response sender and ends the
request with the final flag. A request whose caller cancels stops early with CANCELLED.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("model 'repeat' must use the decoupled transaction policy")
        self.workers = []

    def execute(self, requests):
        for request in requests:
            worker = threading.Thread(target=self.respond, args=(request,), daemon=True)
            worker.start()
            self.workers.append(worker)
        self.workers = [w for w in self.workers if w.is_alive()]
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS")
        pause = float(delay.as_numpy()[0]) / 1000.0 if delay is not None else 0.0
        for index, value in enumerate(values):
            if request.is_cancelled():
                error = pb_utils.TritonError("request cancelled after %d responses" % index,
                                             pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            outputs = [pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                       pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))]
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
            if pause:
                time.sleep(pause)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for worker in self.workers:
            worker.join(timeout=5)
