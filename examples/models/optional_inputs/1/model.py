"""optional_inputs: OUTPUT0 = INPUT0 + INPUT1 when INPUT1 is sent, else INPUT0 + 1 (FP32, dims [-1])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            # An optional input that the request left out comes back as None.
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")

            if in1 is None:
                out = in0 + np.float32(1)
            else:
                in1 = in1.as_numpy()
                if in1.shape != in0.shape:
                    error = pb_utils.TritonError(
                        f"INPUT1 has shape {list(in1.shape)}, expected the shape of INPUT0 "
                        f"{list(in0.shape)}",
                        pb_utils.TritonError.INVALID_ARG,
                    )
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                out = in0 + in1

            out0 = pb_utils.Tensor("OUTPUT0", out.astype(np.float32, copy=False))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("finalized optional_inputs")
