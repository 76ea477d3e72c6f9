"""Start and stop a real SGLang 0.5.23 CPU server by hand: the one copy of how.

Why a module: three places start the real server outside the plugin's launcher (the tests of
``test_real_server_checks.py``, ``tests/data/sglang-0.5.23/record.py`` that records the
samples the fakes are held to, and ``bench/sglang_side_by_side.py`` beside SGLang's own bench
client), and all three must use the flags the samples were recorded with.  Standard library
only, so the recorder runs from any Python; the plugin's managed profile
(``servers/sglang-cpu-tiny.yaml``) says what each flag does.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LAUNCH_FLAGS = (
    "--device cpu --dtype float32 --attention-backend torch_native --sampling-backend pytorch "
    "--grammar-backend none --disable-overlap-schedule --skip-server-warmup --enable-metrics "
    "--max-total-tokens 8192 --max-running-requests 8 --context-length 2048 "
    "--mem-fraction-static 0.1"
).split()
"""The CPU profile's flags (issue 24)."""
READY_TIMEOUT_S = 300.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


SKIP_REASON = (
    "SGLang 0.5.23 is not installed in this environment; `tox -e sglang` creates one and runs "
    "these tests (or set KIMI_SGLANG_PYTHON to the python of such an env)"
)


def sglang_python() -> str | None:
    """The Python to start SGLang from: ``KIMI_SGLANG_PYTHON``, else this one when it has the
    real package (``tests/fake_sglang`` is also called ``sglang``: its version says fake)."""
    configured = os.environ.get("KIMI_SGLANG_PYTHON")
    if configured:
        return configured if Path(configured).exists() else None
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None or "fake_sglang" in spec.origin:
        return None
    return sys.executable


class NotReady(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message has its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    python: str, model: str | Path, log: Path, *extra: str
) -> tuple[str, int, subprocess.Popen[bytes]]:
    """``python -m sglang.launch_server`` with :data:`LAUNCH_FLAGS` and ``extra`` on a free
    127.0.0.1 port, in its own process group (:func:`stop` kills the group), output to
    ``log``: (url, port, process).  Not waited for: :func:`wait_ready`."""
    port = free_port()
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model), *LAUNCH_FLAGS]
    argv += ["--host", "127.0.0.1", "--port", str(port), *extra]
    # 0.5.23 runs on the CPU only with SGLANG_USE_CPU_ENGINE (else is_cpu() is false)
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return f"http://127.0.0.1:{port}", port, proc


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = READY_TIMEOUT_S
) -> None:
    """Poll ``/health`` until it answers 200; :class:`NotReady` (with the log's tail) when the
    server exits first or ``timeout`` passes.  The caller stops the server either way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise NotReady(f"SGLang exited {proc.returncode} while starting; log {log}:\n{tail}")
        try:
            with _NO_PROXY.open(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:]
    raise NotReady(f"SGLang was not healthy after {timeout:g} s; log {log}:\n{tail}")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM the server's group, SIGKILL it after ``grace_s``, and reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
