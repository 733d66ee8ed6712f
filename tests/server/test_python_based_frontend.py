"""A Python-based backend through `stubhost serve --backend-directory`, driven with tritonclient as
a tritonserver user drives it: the backend's model.py serves the model named in config.pbtxt, and
the model's configuration shows the runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.host.test_python_based import BACKEND, BACKEND_PY, HELPERS_PY, backend_model
from tests.server.serve_process import ServeProcess


def test_serve_runs_a_model_of_a_python_based_backend(tmp_path: Path) -> None:
    backends = tmp_path / "backends"
    (backends / BACKEND).mkdir(parents=True)
    (backends / BACKEND / "model.py").write_text(BACKEND_PY)
    (backends / BACKEND / "helpers.py").write_text(HELPERS_PY)
    repo = tmp_path / "models"
    backend_model(repo, "sub", "sub", f'backend: "{BACKEND}"\n')
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    with ServeProcess(repo, "--backend-directory", str(backends)) as srv:
        http = httpclient.InferenceServerClient(srv.http_url)
        rpc = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            for mod, client in ((httpclient, http), (grpcclient, rpc)):
                inputs = [mod.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                np.testing.assert_array_equal(client.infer("sub", inputs).as_numpy("OUTPUT"), a - b)
            config = http.get_model_config("sub")
            assert config["backend"] == BACKEND and config["runtime"] == "model.py"
        finally:
            http.close()
            rpc.close()
        assert "has no effect" not in srv.log
