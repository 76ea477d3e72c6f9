"""Stand-in ``torchvision.transforms.functional``: see the package docstring for why it exists.

``InterpolationMode`` is a real enum (same members as torchvision's), because SGLang reads its
members at call sites' default arguments; everything else refuses when called.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NoReturn

from torchvision import refusing


class InterpolationMode(Enum):
    """torchvision's interpolation names, so ``InterpolationMode.BICUBIC`` can be evaluated."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return refusing(f"transforms.functional.{name}")
