"""Stand-in ``torchvision.transforms``: see the package docstring for why it exists."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from torchvision import refusing
from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode"]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return refusing(f"transforms.{name}")
