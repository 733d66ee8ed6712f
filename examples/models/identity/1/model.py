"""identity: OUTPUT0 = INPUT0 (FP32, dims [-1]), passed through without any computation."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out0 = pb_utils.Tensor("OUTPUT0", in0.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("finalized identity")
