"""auto_complete: OUTPUT0 = INPUT0 * 2 (INT32, dims [-1]).

There is no config.pbtxt: the server calls auto_complete_config() before initialize() and the
model fills in its own inputs, outputs and max_batch_size.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Completes the (here empty) model configuration and returns it.

        Inputs and outputs the configuration already names are left as they are, so a
        config.pbtxt added later takes precedence.
        """
        inputs = [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}]

        config = auto_complete_model_config.as_dict()
        input_names = {entry["name"] for entry in config.get("input", [])}
        output_names = {entry["name"] for entry in config.get("output", [])}

        for entry in inputs:
            if entry["name"] not in input_names:
                auto_complete_model_config.add_input(entry)
        for entry in outputs:
            if entry["name"] not in output_names:
                auto_complete_model_config.add_output(entry)

        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def initialize(self, args):
        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", in0 * 2)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("finalized auto_complete")
