"""Worker-side file-system isolation: build a private root, mount per-call working directories, drop privileges.

Loaded by `sandbox_worker.py` by file path (the worker runs `python -s -P` and
does not import the package), so this module uses the standard library only.
It runs inside a fresh mount namespace (`unshare --mount`, private
propagation) as the namespace's root user, and turns a plan made by
`sandbox_root.plan_root` into mounts:

1. a small tmpfs on the plan's (empty, parent-made) mount point becomes the
   new root; it holds the directories leading to the bind mounts, the
   plan's symlinks and synthetic files;
2. every planned path is bound read-only at its own path (device nodes
   read-only too, so their owner cannot chmod them), a fresh `proc` of the
   worker's pid namespace is mounted on `/proc` (only the pid directories
   where the kernel supports `subset=pid`; otherwise with `/proc/sys`,
   `/proc/sysrq-trigger` and friends re-bound read-only);
3. `pivot_root` into it and detach the old root, so nothing else of the
   caller's file system is reachable by any path, then make the root
   tmpfs read-only and empty the bounding set.

Per call the worker mounts a fresh size-limited tmpfs as the working
directory and detaches it afterwards. The worker empties its capability
bounding set once; the call's child drops every other capability (ambient,
effective, permitted, inheritable) and sets no-new-privileges, so the code cannot remount, unmount, mount, chroot,
mknod or open files by handle, even though it runs as uid 0 of the
namespace; read-only mounts stop the writes its uid would otherwise allow.
"""

import ctypes
import os

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# Entries of a full /proc that let a uid-0 process touch the machine: re-bound read-only.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "scsi")

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); raises OSError naming the call."""
    encode = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(encode(source), target.encode(), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {source or ''} on {target} (flags {flags:#x})")


def umount(target: str) -> None:
    """umount2(2) with MNT_DETACH."""
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _locked_flags(path: str) -> int:
    """The nosuid/nodev/noexec flags `path`'s mount already has (a remount in a user namespace must keep them)."""
    flags = os.statvfs(path).f_flag
    return ((MS_NOSUID if flags & os.ST_NOSUID else 0) | (MS_NODEV if flags & os.ST_NODEV else 0)
            | (MS_NOEXEC if flags & os.ST_NOEXEC else 0))


def _bind_read_only(source: str, target: str, extra_flags: int) -> None:
    try:
        mount(source, target, None, MS_BIND)
    except OSError:  # a user namespace refuses to bind a mount without its locked sub-mounts
        mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | extra_flags | _locked_flags(source))


def _make_mount_point(target: str, directory: bool) -> None:
    if directory:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))


def _mount_proc(target: str) -> str:
    """A proc of our pid namespace at `target`; says which kind."""
    os.makedirs(target, exist_ok=True)
    try:
        mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "subset=pid")
        return "/proc (pid directories only)"
    except OSError:
        pass
    mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_READ_ONLY:
        path = os.path.join(target, name)
        if os.path.exists(path):
            _bind_read_only(path, path, MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return "/proc (system entries read-only)"


def _pivot_root(new_root: str) -> None:
    """Make `new_root` the root and detach the old one (pivot_root(".", ".") stacks them; the detach drops the old)."""
    machine = os.uname().machine  # not the `platform` module: it costs a worker's start-up tens of ms
    number = _PIVOT_ROOT_SYSCALL.get(machine)
    if number is None:
        raise OSError(f"pivot_root: syscall number unknown on {machine}")
    os.chdir(new_root)
    _check(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    umount(".")
    os.chdir("/")


def enter_root(plan: dict) -> list[str]:
    """Build the plan's root and pivot into it; returns notes on what was mounted. Raises OSError on any failure."""
    new_root = plan["mount_point"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for path in plan["binds"]:
        target = new_root + path
        _make_mount_point(target, os.path.isdir(path))
        _bind_read_only(path, target, MS_NOSUID | MS_NODEV)
    for path in plan["devices"]:
        target = new_root + path
        _make_mount_point(target, False)
        _bind_read_only(path, target, MS_NOSUID | MS_NOEXEC)
    for path, link in plan["symlinks"].items():
        os.makedirs(os.path.dirname(new_root + path), exist_ok=True)
        os.symlink(link, new_root + path)
    for path, text in plan["files"].items():
        os.makedirs(os.path.dirname(new_root + path), exist_ok=True)
        with open(new_root + path, "w") as f:
            f.write(text)
    os.makedirs(new_root + plan["workdir"], exist_ok=True)
    proc = _mount_proc(new_root + "/proc")
    _pivot_root(new_root)
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    drop_bounding_set()
    return [proc]


def mount_workdir(path: str, size_bytes: int, max_files: int) -> None:
    """A fresh tmpfs of at most `size_bytes` and `max_files` inodes at `path` (a call's working directory)."""
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_bytes},nr_inodes={max_files},mode=0777")


def drop_bounding_set() -> None:
    """Empty the capability bounding set (the worker, once: it keeps its own capabilities, its children inherit none)."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # EINVAL past the last capability
        cap += 1
    if cap == 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


# Made once in the worker, so a call's child only makes the three calls (a forked child pays for every page it touches).
_NO_CAPABILITIES = (_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)())
_prctl, _capset = _libc.prctl, _libc.capset


def drop_privileges() -> None:
    """Drop every remaining capability for good and set no-new-privileges (a call's child, after `drop_bounding_set`)."""
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = _NO_CAPABILITIES
    _check(_capset(ctypes.byref(header), data), "capset")
