"""Loading one model, tried again while it fails: tritonserver's ``--model-load-retry-count``
(``Server(model_load_retry_count=N)``).

Every load takes this path: at start-up, explicit loads (the repository API's too) and poll
mode's. Each attempt starts from nothing: a failed ``LoadedModel.load`` has already stopped every
stub it started and removed their shared memory. As in Triton, each failed attempt is logged
with its error, and the last attempt's error is the load's, reported as any failed load is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stubhost.config import ModelConfig
from stubhost.host.ensemble import EnsembleModel
from stubhost.host.errors import InferenceError
from stubhost.host.load_options import LoadOptions
from stubhost.host.model import LoadedModel
from stubhost.host.repository import ModelDir

log = logging.getLogger("stubhost")


def load_model(model_dir: ModelDir, options: LoadOptions, config: ModelConfig | None = None, *,
               stopped: Callable[[], bool] = lambda: False) -> LoadedModel | EnsembleModel:
    """``LoadedModel.load``, attempted up to ``1 + options.load_retry_count`` times; raises the
    last attempt's InferenceError. `stopped` (the server is closing) ends the retries early."""
    retries = options.load_retry_count
    attempt = 1
    while True:
        try:
            model = LoadedModel.load(model_dir, options, config)
        except InferenceError as e:
            if attempt > retries or stopped():
                raise
            log.error("failed to load '%s' (attempt %d of %d), trying again: %s", model_dir.name, attempt,
                      retries + 1, e.message)
            attempt += 1
            continue
        if options.latency_summary is not None:  # before anything reads its statistics
            model.stats.observe_latencies(options.latency_summary)
        return model
