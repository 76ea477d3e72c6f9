"""Put ``tests/sglang/standin`` (the ``sgl_kernel`` and ``torchvision`` stand-ins) on this
Python's path with a ``.pth`` file, so every process of the env, the SGLang server included,
imports them.

Why a ``.pth`` and not ``PYTHONPATH``: the server may be started from this env by hand or by
another tool (``python -m sglang.bench_serving``, a helper script), which a tox ``set_env`` does
not reach; a ``.pth`` in the env's site-packages does.  Run by ``tox -e sglang``::

    python tests/sglang/install_standin.py
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "standin"
PTH_NAME = "kimi_sglang_standin.pth"


def install() -> Path:
    """Write the ``.pth`` (idempotent) and return its path."""
    if not (STANDIN / "sgl_kernel" / "__init__.py").exists():
        raise SystemExit(f"the stand-ins are missing under {STANDIN}: is this a full checkout?")
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    pth.write_text(f"{STANDIN}\n")
    return pth


if __name__ == "__main__":
    print(f"stand-ins for sgl_kernel and torchvision on the path: {install()}")
