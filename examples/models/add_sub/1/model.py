"""add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, dims [4])."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Every Python-backend model defines a class with this name."""

    def initialize(self, args):
        """Called once when the model instance is loaded.

        `args` maps strings to strings; `model_config` holds the model configuration as JSON.
        The output dtypes are read from it once here rather than on every request.
        """
        self.model_config = model_config = json.loads(args["model_config"])

        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        """Returns one InferenceResponse per InferenceRequest, in the same order."""
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()

            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.output0_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.output1_dtype))

            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        """Called once when the model is unloaded."""
        pb_utils.Logger.log_info("finalized add_sub")
