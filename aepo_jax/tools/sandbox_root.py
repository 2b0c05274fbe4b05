"""What a sandbox worker's private root contains (the parent side of `sandbox_mounts.py`).

Everything is derived from the running interpreter, never from fixed
install paths: the venv (`sys.prefix`, `sys.exec_prefix`), the base
interpreter (`sys.base_prefix`, `sys.base_exec_prefix`, the resolved
`sys.executable`) and the preload modules' own directories when they lie
outside those prefixes (an editable install: only the package directory,
not the checkout around it), found again by each worker in its own
`python -s -P` view (`extend_plan`). Add the system's `/usr`, `/bin`, `/sbin`,
`/lib*` (symlinks stay symlinks), the dynamic linker's `/etc` files, and
`/dev/null|zero|random|urandom`. All are bound read-only at their own
paths. `/etc/passwd`, `/etc/group` and `/etc/hosts` are small synthetic
files (no names of the host's users), `/tmp` and `/dev/shm` point at the
working directory, and `/proc` is mounted fresh by the worker. Nothing else (the
caller's home, the checkout, run directories, the system's temporary
directory) exists inside.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_MOUNT_POINT_PREFIX = "aepo-sandbox-root-"
WORKDIR = "/sandbox"  # the call's working directory inside the root (a fresh tmpfs per call)
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_SYNTHETIC_FILES = {
    "/etc/passwd": f"root:x:0:0:root:{WORKDIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "/etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
}
_DEV_LINKS = {"/dev/shm": WORKDIR, "/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1",
              "/dev/stderr": "/proc/self/fd/2"}


def make_mount_point() -> str:
    """An empty directory for the workers' roots, named after this process; stale ones of dead owners are removed."""
    import tempfile  # here, not at the top: workers load this module too, and tempfile would slow their start-up
    folder = tempfile.gettempdir()
    for name in os.listdir(folder):
        parts = name.split("-")
        stale = len(parts) == 5 and parts[3].isdigit() and not os.path.exists(f"/proc/{parts[3]}")
        if name.startswith(_MOUNT_POINT_PREFIX) and stale:
            try:
                os.rmdir(os.path.join(folder, name))  # only ever removes an empty directory
            except OSError:
                pass
    return tempfile.mkdtemp(prefix=f"{_MOUNT_POINT_PREFIX}{os.getpid()}-")


def _module_locations(name: str) -> list[str]:
    """Directories (or the file) holding a preload module's top-level package, without importing it."""
    try:
        spec = importlib.util.find_spec(name.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [os.path.abspath(p) for p in spec.submodule_search_locations]
    if spec.origin and os.path.isabs(spec.origin):
        return [spec.origin]
    return []  # built-in or frozen


class _Plan:
    """Accumulates binds and symlinks; a path inside an already bound directory is not bound again."""

    def __init__(self) -> None:
        self.binds: set[str] = set()
        self.symlinks: dict[str, str] = {}

    def add(self, path: str, depth: int = 0) -> None:
        """Bind `path`; every symlink on the way is recreated so the path as written resolves inside too."""
        path = os.path.abspath(path)
        if not os.path.lexists(path) or depth > 8:
            return
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if os.path.islink(prefix):
                link = os.readlink(prefix)
                self.symlinks.setdefault(prefix, link)
                resolved = os.path.join(os.path.dirname(prefix), link)
                self.add(os.path.join(resolved, *parts[i:]), depth + 1)
                return
        self.binds.add(path)

    def as_dict(self, mount_point: str) -> dict:
        """The plan for `sandbox_mounts.enter_root`, nested binds dropped."""
        binds: list[str] = []
        for path in sorted(self.binds):
            if not any(path == b or path.startswith(b + "/") for b in binds):
                binds.append(path)
        symlinks = {**self.symlinks, **_DEV_LINKS}
        if not any(b == "/tmp" or b.startswith("/tmp/") for b in binds):
            symlinks["/tmp"] = WORKDIR
        return {"mount_point": mount_point, "binds": binds, "symlinks": symlinks, "workdir": WORKDIR,
                "devices": [d for d in DEVICES if os.path.exists(d)], "files": dict(_SYNTHETIC_FILES)}


def extend_plan(plan: dict, modules: list[str]) -> dict:
    """`plan` plus the modules' locations as this interpreter finds them.

    A worker calls this before it builds its root: it runs `python -s -P`, so its
    sys.path (e.g. an editable install's finder) can differ from the parent's.
    """
    extended = _Plan()
    extended.binds = set(plan["binds"])
    extended.symlinks = {path: link for path, link in plan["symlinks"].items()
                         if path not in _DEV_LINKS and not (path == "/tmp" and link == WORKDIR)}
    for module in modules:
        for path in _module_locations(module):
            extended.add(path)
    return extended.as_dict(plan["mount_point"])


def plan_root(mount_point: str, preload: tuple[str, ...] | list[str] = ()) -> dict:
    """The root for workers that preload `preload`, to be built on the empty directory `mount_point`."""
    plan = _Plan()
    for path in (*_SYSTEM_DIRS, *_ETC_FILES):
        plan.add(path)
    for path in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                 os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)}:
        plan.add(path)
    for module in preload:
        for path in _module_locations(module):
            plan.add(path)
    return plan.as_dict(mount_point)
