"""The process that runs one piece of model-written code (started by `python_exec`).

Run as a script: `python -I sandbox_worker.py CONFIG_JSON`. It imports the
preload modules while idle (that is what makes a pool worker "warm"), then
reads the code from stdin until EOF, applies resource limits, executes the code and writes a one-line JSON status to the fd named in the config.
Stdout and stderr are the parent's pipes. It never runs a second program.
"""

import importlib
import json
import os
import resource
import signal
import sys
import traceback


def _apply_limits(config: dict) -> None:
    """RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC (soft = hard except CPU, which warns first)."""
    cpu = int(config["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Writing past RLIMIT_FSIZE raises OSError(EFBIG) instead of killing silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # The worker is a pid namespace's init, which ignores signals it has no handler for.
    signal.signal(signal.SIGXCPU, lambda *_: _report_and_exit(config, {
        "status": "timeout", "exit_code": None,
        "traceback": f"CPU-time limit of {cpu} s exceeded"}))


def _report_and_exit(config: dict, status: dict) -> None:
    """Flush output, write the status line for the parent, exit without running cleanup handlers."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001, S110 - a broken stdout must not hide the status
        pass
    try:
        os.write(config["result_fd"], json.dumps(status, default=str).encode())
    except OSError:
        pass
    os._exit(0)


def _user_traceback(error: BaseException) -> str:
    """Traceback without this worker's own frame."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def main() -> None:
    config = json.loads(sys.argv[1])
    for module in config.get("preload", []):
        importlib.import_module(module)
    code = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    _apply_limits(config)
    status = {"status": "ok", "exit_code": 0, "traceback": ""}
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<python>", "exec"), namespace)  # noqa: S102 - running it is the point
    except SystemExit as error:
        code_value = error.code
        if code_value is None or code_value == 0:
            status["exit_code"] = 0
        else:
            status = {"status": "error", "exit_code": code_value if isinstance(code_value, int) else 1,
                      "traceback": f"SystemExit: {code_value}"}
    except BaseException as error:  # noqa: BLE001 - any failure of user code is reported, not raised
        status = {"status": "error", "exit_code": 1, "traceback": _user_traceback(error)}
    _report_and_exit(config, status)


if __name__ == "__main__":
    main()
