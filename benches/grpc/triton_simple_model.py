"""Triton's `simple` example model (INPUT0 + INPUT1, INPUT0 - INPUT1 on INT32[16]) for the
python backend: the only backend of the Triton 2.51 binary available here (nvidia-pytriton
0.7.0). Used by benches/grpc/grpc_bench.sh; not a test."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                        pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
                    ]
                )
            )
        return responses
