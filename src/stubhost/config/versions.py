"""Which of a model's version folders its ``version_policy`` selects."""

from __future__ import annotations

from collections.abc import Sequence

from stubhost.config.model_config_pb2 import ModelConfig


def select_versions(cfg: ModelConfig, available: Sequence[int]) -> list[int]:
    """The versions to serve, ascending, out of ``available`` (the version folders present).

    - ``latest { num_versions: N }``: the N highest available versions. N = 0 (proto3 cannot tell
      it from "unset") is read as the documented default, 1. No policy at all also means latest 1.
    - ``all {}``: every available version.
    - ``specific { versions: [...] }``: those listed that are available; listed versions without a
      folder are left out (Triton logs them and goes on).

    The result may be empty. Triton then refuses the model with "at least one version must be
    available under the version policy of model '<name>'"; raising that is the caller's job.
    """
    present = sorted(set(available))
    policy = cfg.version_policy
    choice = policy.WhichOneof("policy_choice") if cfg.HasField("version_policy") else None
    if choice == "all":
        return present
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in present if v in wanted]
    count = policy.latest.num_versions if choice == "latest" else 0
    count = count or 1
    return present[-count:] if present else []
