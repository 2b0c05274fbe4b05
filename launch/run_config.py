"""A run's saved config as a config file: `--config launch/run_config.py:RUN_DIR` is RUN_DIR/config.json
(`aepo_jax.experiment.config_from_run`), so `--config.KEY=VALUE` overrides apply on top of the config the
run trained with. `launch.evaluate --checkpoint RUN_DIR --config.KEY=VALUE` without `--config` uses it.

JSON keeps no type for a None, nor which fields may be None. Both come from the defaults the run's
algorithm starts from (`configs.base.get_base_config`): a field they declare None-able
(`config_dict.placeholder(T)`) takes `None` or a T whatever the run saved, and a field the run saved as
null takes a value of the type the defaults give it. A null field the defaults do not know stays an
untyped placeholder, whose override is read as a Python literal (`512` an int, `0.5` a float).
JSON also turns tuples into lists, which ml-collections cannot override (`--config.rollout.python_preload=
"('numpy',)"`): every list becomes a tuple again.

JSON keeps no link between fields either. The defaults' shared references (`c.train.total_steps =
c.get_ref("total_steps")`) are made again, so `--config.total_steps=N` on a resume sets the length the
trainer reads (`train.total_steps`) as it does with the config file; a config.json whose linked fields
disagree is refused.
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
        elif isinstance(value, list):  # JSON made the config's tuples lists, which no override can set
            del node[key]  # a list-typed field would keep a tuple assigned to it a list
            node[key] = tuple(value)
        elif value is None or dotted in nullable:
            node[key] = config_dict.placeholder(types.get(dotted, object))
            if value is not None:
                node[key] = value


def _linked_keys(defaults: ml_collections.ConfigDict) -> list[tuple[list[str], type | None]]:
    """(dotted keys, declared type) of each field reference `defaults` hold under more than one key."""
    holders: dict[int, tuple[list[str], config_dict.FieldReference]] = {}

    def walk(node: ml_collections.ConfigDict, prefix: str) -> None:
        for key, value in node.items(preserve_field_references=True):
            if isinstance(value, config_dict.FieldReference):
                holders.setdefault(id(value), ([], value))[0].append(prefix + key)
                value = value.get()
            if isinstance(value, ml_collections.ConfigDict):
                walk(value, f"{prefix}{key}.")

    walk(defaults, "")
    return [(keys, ref.get_type()) for keys, ref in holders.values() if len(keys) > 1]


def _relink(config: ml_collections.ConfigDict, linked: list[tuple[list[str], type | None]], source: str) -> None:
    """Make each group of `linked` keys that `config` holds one shared field reference again; a ValueError
    naming `source` when their values differ (the run would read one of them and report the other)."""
    for keys, field_type in linked:
        present = []
        for dotted in keys:
            parent, _, name = dotted.rpartition(".")
            node = config
            for part in parent.split(".") if parent else ():
                node = node.get(part)
                if not isinstance(node, ml_collections.ConfigDict):
                    break
            if isinstance(node, ml_collections.ConfigDict) and name in node:
                present.append((dotted, node, name))
        values = {dotted: node[name] for dotted, node, name in present}
        if len({repr(value) for value in values.values()}) > 1:
            listed = ", ".join(f"{dotted}={value!r}" for dotted, value in values.items())
            raise ValueError(f"{source}: {listed} differ, but they are one setting (a shared field reference of "
                             "the config files); set them to the same value in that file")
        if len(present) > 1:
            ref = config_dict.FieldReference(next(iter(values.values())), field_type=field_type)
            for _, node, name in present:
                node[name] = ref


def get_config(run_dir: str) -> ml_collections.ConfigDict:
    """RUN_DIR/config.json as a ConfigDict typed and linked as its algorithm's defaults (module docstring)."""
    from aepo_jax.experiment import config_from_run
    from configs.base import get_base_config
    from launch.config_args import nullable_keys

    config = config_from_run(run_dir)
    try:
        defaults = get_base_config(str(config.get("algorithm", "aepo")))
    except (KeyError, ValueError):  # an algorithm this code no longer has: the run's own values only
        defaults = ml_collections.ConfigDict()
    _type_like(config, _declared_types(defaults), nullable_keys(defaults))
    _relink(config, _linked_keys(defaults), os.path.join(run_dir, "config.json"))
    return config
