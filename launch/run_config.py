"""A run's saved config as a config file: `--config launch/run_config.py:RUN_DIR` is RUN_DIR/config.json
(`aepo_jax.experiment.config_from_run`), so `--config.KEY=VALUE` overrides apply on top of the config the
run trained with. `launch.evaluate --checkpoint RUN_DIR --config.KEY=VALUE` without `--config` uses it.

JSON keeps no type for a None, nor which fields may be None. Both come from the defaults the run's
algorithm starts from (`configs.base.get_base_config`): a field they declare None-able
(`config_dict.placeholder(T)`) takes `None` or a T whatever the run saved, and a field the run saved as
null takes a value of the type the defaults give it. A null field the defaults do not know stays an
untyped placeholder, whose override is read as a Python literal (`512` an int, `0.5` a float).
"""

from __future__ import annotations

import os

import ml_collections
from ml_collections import config_dict

CONFIG_FILE = os.path.abspath(__file__)


def _declared_types(defaults: ml_collections.ConfigDict, prefix: str = "") -> dict[str, type]:
    """Dotted key -> the type `defaults` give it (a placeholder's declared type, else its value's type)."""
    out: dict[str, type] = {}
    for key, field in defaults.items(preserve_field_references=True):
        if isinstance(field, config_dict.FieldReference):
            out[prefix + key] = field.get_type()
        elif isinstance(field, ml_collections.ConfigDict):
            out.update(_declared_types(field, f"{prefix}{key}."))
        elif field is not None:
            out[prefix + key] = type(field)
    return out


def _type_like(node: ml_collections.ConfigDict, types: dict[str, type], nullable: set[str], prefix: str = "") -> None:
    for key, value in list(node.items()):
        dotted = prefix + key
        if isinstance(value, ml_collections.ConfigDict):
            _type_like(value, types, nullable, dotted + ".")
        elif value is None or dotted in nullable:
            node[key] = config_dict.placeholder(types.get(dotted, object))
            if value is not None:
                node[key] = value


def get_config(run_dir: str) -> ml_collections.ConfigDict:
    """RUN_DIR/config.json as a ConfigDict typed by its algorithm's defaults (module docstring)."""
    from aepo_jax.experiment import config_from_run
    from configs.base import get_base_config
    from launch.config_args import nullable_keys

    config = config_from_run(run_dir)
    try:
        defaults = get_base_config(str(config.get("algorithm", "aepo")))
    except (KeyError, ValueError):  # an algorithm this code no longer has: the run's own values only
        defaults = ml_collections.ConfigDict()
    _type_like(config, _declared_types(defaults), nullable_keys(defaults))
    return config
