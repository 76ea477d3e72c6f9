"""A stand-in for ``sgl_kernel``, SGLang's compiled kernel package, for its CPU engine in CI.

Why it exists: with ``SGLANG_USE_CPU_ENGINE=1``, SGLang 0.5.23 imports CPU ops from
``sgl_kernel`` when its modules load (``kernels/ops/kvcache/cache_move.py`` takes
``copy_all_layer_kv_cache_cpu``, for one), yet no CPU build of that package is on any registry
CI reaches (``sglang-kernel`` 0.4.10 and ``sgl-kernel`` 0.3.21 are CUDA-only wheels, no sdist).
On a CPU without AMX, SGLang serves a Llama through plain torch and never calls them, so an
importable module whose every function refuses is enough to start the server.

Every name looked up here is a function that raises :class:`NotImplementedError` naming
itself: if SGLang ever takes a path that needs a real kernel, the server log says which one
(``tests/sglang/test_sglang_cpu.py`` checks that it never does).  ``tox -e sglang`` puts this
directory on the env's path with a ``.pth`` file (``tests/sglang/install_standin.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

__version__ = "0.0.0+kimi.standin"
STANDIN = True
"""Lets a test (or a person reading ``sgl_kernel.STANDIN``) tell this module from the real one."""

MESSAGE = (
    "sgl_kernel.{name} was called, but this sgl_kernel is the CI stand-in "
    "(tests/sglang/standin): SGLang took a path that needs its compiled CPU kernels, "
    "which exist for no CPU we can install them on; keep the profile on the plain-torch path "
    "(--attention-backend torch_native --sampling-backend pytorch, a CPU without AMX)"
)


def _refusing(name: str) -> Callable[..., NoReturn]:
    def refuse(*_args: object, **_kwargs: object) -> NoReturn:
        raise NotImplementedError(MESSAGE.format(name=name))

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Stand-in for sgl_kernel.{name}: always raises NotImplementedError."
    return refuse


def __getattr__(name: str) -> Callable[..., NoReturn]:
    """Any kernel SGLang imports by name (``from sgl_kernel import x``) is a refusing function.

    Dunder lookups (``__path__``, ``__spec__`` ...) stay AttributeErrors, so the import system
    and ``hasattr`` probes see an ordinary module.
    """
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _refusing(name)
