"""The `--config` arguments of every entry point, checked and prepared before absl parses them.

ml-collections' `config_flags` reads `--config FILE[:ARG]` and `--config.KEY=VALUE` inside absl's flag
parsing, where a missing file or an unknown key surfaces as a long traceback, `None` cannot be parsed
for a float or int field, and a config file finds the `configs` package it imports only when the
current directory is the repository. `run_with_config(main, config_flag)` does, in one place for every
entry point:

- the repository root of the config file (`config_root`) goes on `sys.path`, so a launch from any
  directory imports the `configs` package that file belongs to;
- a missing file, a file that does not load (an unknown variant ARG, a run's refused config.json, an
  ARG missing), an unknown key or `--config.algorithm` is one line naming it (`check_config_arguments`);
- `--config.KEY=None` for a None-able field (`nullable_keys`) is taken out of the arguments
  absl parses and set after parsing (`apply_none_overrides`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterator, MutableMapping, Sequence

import ml_collections
from ml_collections import config_dict

CONFIG_PREFIX = "--config."
NONE_VALUE = "None"  # what `--config.KEY=None` writes for Python's None, as a config file would


def config_root(path: str) -> str:
    """The directory above the outermost package (a folder with `__init__.py`) holding the file at `path`:
    for REPO/configs/aepo_tiny.py, REPO, where `import configs.base` finds that file's own package."""
    directory = os.path.dirname(os.path.abspath(path))
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory = os.path.dirname(directory)
    return directory


def config_spec(argv: list[str]) -> str | None:
    """The `--config` value of `argv` (`--config=SPEC` or `--config SPEC`), if any."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is None and "--config" in argv[:-1]:
        spec = argv[argv.index("--config") + 1]
    return spec


def _put_root_on_path(path: str) -> None:
    """Appended, not put first: a config file of another checkout must not bring that checkout's aepo_jax in
    ahead of the one running (its `configs` package is imported only where no other is found)."""
    root = config_root(path)
    if root not in sys.path:
        sys.path.append(root)


def _get(config: ml_collections.ConfigDict, dotted: str) -> object:
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """`get_config(ARG)` of the file of `spec` (`FILE[:ARG]`), with that file's repository on `sys.path`."""
    path, _, arg = spec.partition(":")
    _put_root_on_path(path)
    module_spec = importlib.util.spec_from_file_location("_launch_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _overrides(argv: list[str]) -> list[tuple[int, str, str | None]]:
    """(index in argv, dotted key, value or None when absl reads it from the next argument) of each
    `--config.KEY[=VALUE]`."""
    found = []
    for index, arg in enumerate(argv):
        if arg.startswith(CONFIG_PREFIX):
            key, sep, value = arg[len(CONFIG_PREFIX):].partition("=")
            found.append((index, key, value if sep else None))
    return found


def _none_overrides(argv: list[str]) -> list[tuple[int, str]]:
    """(index, key) of each `--config.KEY=None` or `--config.KEY None` in argv."""
    out = []
    for index, key, value in _overrides(argv):
        if value is None and index + 1 < len(argv) and argv[index + 1] == NONE_VALUE:
            value = NONE_VALUE
        if value == NONE_VALUE:
            out.append((index, key))
    return out


def nullable_keys(config: ml_collections.ConfigDict) -> set[str]:
    """The dotted keys of `config` that may be set to None: those that are None now, and those declared
    as typed placeholders (`config_dict.placeholder(int)`, and the `X | None` objective fields of
    `configs.base.objective_from_preset`). A reference that links two keys (`c.get_ref("seed")`) is no
    declaration: setting it to None would set both."""
    holders: dict[int, list[str]] = {}
    out = set()

    def walk(node: ml_collections.ConfigDict, prefix: str) -> None:
        for key, value in node.items(preserve_field_references=True):
            if isinstance(value, config_dict.FieldReference):
                holders.setdefault(id(value), []).append(prefix + key)
                value = value.get()
            if isinstance(value, ml_collections.ConfigDict):
                walk(value, f"{prefix}{key}.")
            elif value is None:
                out.add(prefix + key)

    walk(config, "")
    return out | {keys[0] for keys in holders.values() if len(keys) == 1}


def check_config_arguments(argv: list[str]) -> None:
    """Exit with a clear message when `--config FILE[:ARG]` does not exist or does not load (an unknown
    variant ARG, a `launch/run_config.py:RUN_DIR` whose config.json is refused), a `--config.a.b=v` names a key the
    config lacks, `--config.KEY=None` names a field that is not None-able, or `--config.algorithm` is given
    (it would only relabel the run: the objective and `rollout.strategy` were filled from the file's own
    preset when it loaded).

    (ml-collections would otherwise fail deep inside flag parsing: a missing file surfaces as a chained
    traceback at the first config access, an unknown key as a bare AttributeError.) The config file's
    repository goes on `sys.path` (`load_config_file`).
    """
    spec = config_spec(argv)
    overrides = _overrides(argv)
    if spec is None:
        if overrides:
            raise SystemExit(f"error: {argv[overrides[0][0]]!r} overrides a config, but no --config FILE is given")
        return
    path = spec.partition(":")[0]
    if not os.path.isfile(path):
        raise SystemExit(f"config file not found: {path} (from --config {spec})")
    _put_root_on_path(path)  # for config_flags too, which loads the file again after this check
    try:  # config_flags would report an unknown variant ARG (or a refused run config) as a traceback
        config = load_config_file(spec)
    except (ValueError, OSError, TypeError) as err:  # TypeError: a get_config that needs an ARG got none
        raise SystemExit(f"error: {err}" if path in str(err) else f"error: --config {spec}: {err}") from err
    for index, dotted, _ in overrides:
        node, walked = config, []
        for part in dotted.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
                where = ".".join(walked) or "the config"
                raise SystemExit(f"error: unknown config key {dotted!r} in {argv[index]!r}: {where} has no {part!r}; "
                                 f"its keys are {known}")
            node, walked = node[part], walked + [part]
        if dotted == "algorithm":
            raise SystemExit(
                f"error: {argv[index]!r} would only relabel the run: {path} filled objective.* and "
                f"rollout.strategy from its own preset ({config.algorithm!r}) when it loaded. Choose the "
                "algorithm with its config file (configs/<algorithm>_tiny.py, one per family, or a file that "
                "calls configs.base.get_base_config(<algorithm>)), or set objective.* keys; launch.compare "
                "takes --algorithms")
    nullable = nullable_keys(config)
    for index, dotted in _none_overrides(argv):
        if dotted not in nullable:
            raise SystemExit(f"error: {argv[index]!r}: {dotted} cannot be None (it is {_get(config, dotted)!r}); "
                             "None is for the fields a config declares None-able (config_dict.placeholder), "
                             f"which here are {sorted(nullable)}")


def take_none_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without its `--config.KEY=None` / `--config.KEY None` arguments, their keys): absl cannot
    parse None for a float or int field, so `apply_none_overrides` sets them after parsing."""
    found = _none_overrides(argv)
    drop = {index for index, _ in found} | {index + 1 for index, _ in found if "=" not in argv[index]}
    return [arg for index, arg in enumerate(argv) if index not in drop], [key for _, key in found]


def apply_none_overrides(config: ml_collections.ConfigDict | None, keys: list[str],
                         override_values: MutableMapping[str, object]) -> None:
    """Set each of `keys` of `config` to None, and record it with the overrides config_flags parsed
    (`override_values`, `config_flags.get_override_values`), so a caller that re-applies the command
    line's overrides (launch.compare) sees them too."""
    if config is None:
        return
    for key in keys:
        parent, _, name = key.rpartition(".")
        node = _get(config, parent) if parent else config
        node[name] = None
        override_values[key] = None


def expand_flagfiles(argv: list[str]) -> list[str]:
    """`argv` with each `--flagfile=F` replaced by F's arguments, so they are checked like the command
    line's own (a flagfile may hold `--config`, its overrides or `=None`)."""
    from absl import flags

    return [argv[0], *flags.FLAGS.read_flags_from_files(argv[1:], force_gnu=False)]


def run_with_config(main: Callable[[list[str]], int], config_flag, default_spec: str | None = None) -> None:
    """`app.run(main)` after `check_config_arguments` and with `--config.KEY=None` handled
    (`take_none_overrides`, `apply_none_overrides`). `config_flag` is the FlagHolder of `--config`, defined
    without a default (config_flags would load a default file when the flag is defined, before any check);
    `default_spec` is put in `sys.argv` when it names no `--config`."""
    from absl import app, flags
    from ml_collections import config_flags

    argv = expand_flagfiles(sys.argv)
    if default_spec is not None and config_spec(argv[1:]) is None:
        argv = [argv[0], f"--config={default_spec}", *argv[1:]]
    check_config_arguments(argv[1:])
    sys.argv, none_keys = take_none_overrides(argv)  # config_flags reads sys.argv itself

    def main_with_none_overrides(argv: list[str]) -> int:
        flag = flags.FLAGS[config_flag.name]
        if flag.value is not None:
            apply_none_overrides(flag.value, none_keys, config_flags.get_override_values(flag))
        return main(argv)

    try:
        app.run(main_with_none_overrides)
    except SystemExit as exit_:
        if exit_.code == 1 and asks_for_help(sys.argv[1:]):
            raise SystemExit(0) from None  # absl exits 1 after printing the help; a help asked for is no failure
        raise


# absl's help flags (`--help`, `-?`, `--helpshort`, `--helpfull`, `--helpxml`): each prints and exits.
HELP_FLAGS = frozenset({"help", "?", "helpshort", "helpfull", "helpxml"})


def asks_for_help(args: Sequence[str]) -> bool:
    """Whether the command line (before any `--`) holds one of absl's help flags."""
    for arg in args:
        if arg == "--":
            return False
        if arg.startswith("-") and arg.lstrip("-").split("=", 1)[0] in HELP_FLAGS:
            return True
    return False


@contextlib.contextmanager
def configuration_errors(verbose: bool = False) -> Iterator[None]:
    """A ValueError, or an OSError about a path (missing, a folder where a file belongs or the reverse, no
    permission), raised inside (while a run is built from its config: a bad value, a missing file, a
    run's metrics.jsonl that is a folder) becomes `error: MESSAGE` and a non-zero exit instead of a
    traceback; with `verbose` (the config's `verbose_logs`) the traceback is printed first. Wrap only the
    building of a run: an error raised while it trains is no configuration error."""
    try:
        yield
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as err:
        if verbose:
            traceback.print_exception(err)
            raise SystemExit(f"error: {err}") from err
        # Where it was raised, so that a library's own failure (jax, orbax) is not taken for a config mistake.
        frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
        where = f"{type(err).__name__} at {frame.filename}:{frame.lineno}" if frame else type(err).__name__
        raise SystemExit(f"error: {err}\n  ({where}; --config.verbose_logs=True prints the traceback)") from err


def quiet_library_logs(verbose: bool = False) -> None:
    """absl logging at WARNING (orbax logs every checkpoint step at INFO), unless `verbose` (the config's
    `verbose_logs`) or the command line gave `--verbosity` / `-v` itself."""
    from absl import flags
    from absl import logging as absl_logging

    if verbose or flags.FLAGS["verbosity"].present:
        return
    absl_logging.set_verbosity(absl_logging.WARNING)
