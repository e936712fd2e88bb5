"""Processes a test starts side by side (the processes of one `jax.distributed` job on this host)."""

import socket
import subprocess


def free_port() -> int:
    """A local TCP port nothing listens on (for a job's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_lines(commands: list[list[str]], env: dict, timeout: float) -> list[str]:
    """Runs ``commands`` at once and returns the last line each printed; each must exit 0 (the assertion shows the
    end of every process's stderr). All are killed when the wait fails."""
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for command in commands]
    try:
        outputs = [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode for process in processes] == [0] * len(processes), \
        "".join(err[-1500:] for _, err in outputs)
    return [out.splitlines()[-1] for out, _ in outputs]
