"""Model configuration: config.pbtxt parsing, the Triton JSON form, defaults, validation.

The schema is Triton's ``ModelConfig`` (package ``inference``, same field names and numbers; see
model_config.proto), so a Triton model repository's config.pbtxt files are read unchanged::

    import json
    from stubhost.config import (
        config_to_dict, fill_defaults, load_config_file, select_versions, validate_config,
    )

    cfg = load_config_file("models/add_sub/config.pbtxt")       # ConfigError on a bad file
    fill_defaults(cfg, "add_sub")                                 # name, backend, instance groups...
    validate_config(cfg, model_dir_name="add_sub", source="models/add_sub/config.pbtxt")
    args_model_config = json.dumps(config_to_dict(cfg))          # what initialize(args) receives
    versions = select_versions(cfg, available=[1, 2, 3])         # [3] under the default policy
"""

from stubhost.config.defaults import fill_defaults, fill_instance_groups
from stubhost.config.dict_form import config_from_dict, config_to_dict
from stubhost.config.dtypes import config_dtype_to_triton, triton_to_config_dtype
from stubhost.config.errors import ConfigError
from stubhost.config.model_config_pb2 import ModelConfig
from stubhost.config.parse import load_config_file, parse_config_text
from stubhost.config.validate import validate_config
from stubhost.config.versions import select_versions

__all__ = [
    "ConfigError",
    "ModelConfig",
    "config_dtype_to_triton",
    "config_from_dict",
    "config_to_dict",
    "fill_defaults",
    "fill_instance_groups",
    "load_config_file",
    "parse_config_text",
    "select_versions",
    "triton_to_config_dtype",
    "validate_config",
]
