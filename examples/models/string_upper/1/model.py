"""string_upper: BYTES in, BYTES and INT32 out.

OUTPUT0[i] = INPUT0[i] decoded as UTF-8, upper-cased, encoded as UTF-8 again.
OUTPUT1[i] = len(INPUT0[i]) in bytes (of the input element; upper-casing can change the length,
             e.g. "ı", 2 bytes, -> "I", 1 byte).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        lengths_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.lengths_dtype = pb_utils.triton_string_to_numpy(lengths_config["data_type"])
        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            # A TYPE_STRING input arrives as a numpy array of dtype object whose elements are bytes.
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()

            upper = np.array(
                [element.decode("utf-8").upper().encode("utf-8") for element in in0.reshape(-1)],
                dtype=np.object_,
            ).reshape(in0.shape)
            lengths = np.array([len(element) for element in in0.reshape(-1)], dtype=self.lengths_dtype)

            out0 = pb_utils.Tensor("OUTPUT0", upper)
            out1 = pb_utils.Tensor("OUTPUT1", lengths.reshape(in0.shape))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("finalized string_upper")
