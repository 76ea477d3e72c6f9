"""A stand-in for ``torchvision``, which SGLang 0.5.23 imports at start but never uses for text.

Why it exists: ``sglang.srt.configs`` imports ``torchvision.transforms`` when it loads (the
InternVL and DeepSeek-OCR image helpers), so the server does not start without it.  The
torchvision wheels on PyPI are linked against CUDA torch (``libtorch_cuda.so``) and fail to
import beside the CPU torch this env uses (``operator torchvision::nms does not exist``); the
matching CUDA torch + torchvision pair would make the env 5.5 GB instead of about 3.  A text-only
Llama never transforms an image, so names that import are enough.

Every function or class looked up here raises :class:`NotImplementedError` naming itself when
called; ``tests/sglang`` checks the server log never shows one.  There is no ``dist-info``, so
``transformers`` (which asks package metadata) still sees torchvision as absent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import NoReturn

__version__ = "0.0.0+kimi.standin"
STANDIN = True

MESSAGE = (
    "torchvision.{name} was called, but this torchvision is the CI stand-in "
    "(tests/sglang/standin): the CI server serves text only; an image model needs the real "
    "torchvision, whose PyPI wheel needs CUDA torch"
)


def refusing(name: str) -> Callable[..., NoReturn]:
    """A callable named ``name`` that raises NotImplementedError naming itself."""

    def refuse(*_args: object, **_kwargs: object) -> NoReturn:
        raise NotImplementedError(MESSAGE.format(name=name))

    refuse.__name__ = refuse.__qualname__ = name.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Stand-in for torchvision.{name}: always raises NotImplementedError."
    return refuse


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return refusing(name)


class _RefusingModule(types.ModuleType):
    """Any other ``torchvision.*`` module (``io``, ``transforms.v2`` ...): names that import,
    callables that refuse.  ``transformers`` imports several of them at module level once it
    sees a ``torchvision`` on the path."""

    def __getattr__(self, name: str) -> Callable[..., NoReturn]:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return refusing(f"{self.__name__.removeprefix('torchvision.')}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a :class:`_RefusingModule` for each ``torchvision`` submodule with no file here."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _RefusingModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.append(_Finder())
