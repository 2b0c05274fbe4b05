"""A run's saved config as a config file: `--config launch/run_config.py:RUN_DIR` is RUN_DIR/config.json
(`aepo_jax.experiment.config_from_run`), so `--config.KEY=VALUE` overrides apply on top of the config the
run trained with. `launch.evaluate --checkpoint RUN_DIR --config.KEY=VALUE` without `--config` uses it.

JSON keeps no type for a None: such a field (`model.logits_chunk_size` left unset, say) becomes an
untyped placeholder, whose override is read as a Python literal (`512` an int, `0.5` a float).
"""

from __future__ import annotations

import os

import ml_collections
from ml_collections import config_dict

CONFIG_FILE = os.path.abspath(__file__)


def _declare_nones(node: ml_collections.ConfigDict) -> None:
    for key, value in list(node.items()):
        if isinstance(value, ml_collections.ConfigDict):
            _declare_nones(value)
        elif value is None:
            node[key] = config_dict.placeholder(object)


def get_config(run_dir: str) -> ml_collections.ConfigDict:
    """RUN_DIR/config.json as a ConfigDict whose None fields take an override of any type."""
    from aepo_jax.experiment import config_from_run

    config = config_from_run(run_dir)
    _declare_nones(config)
    return config
