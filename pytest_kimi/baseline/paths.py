"""Where baselines live on disk: ``<root>/<profile>/<module path>/<test name>.yaml``.

One file per test, in one directory per profile, so a target moves through the same review as
a code change and ``git diff`` shows exactly which test's numbers changed.  The mapping from a
pytest nodeid to a file name has to be deterministic, safe (no escaping the directory, no
unusable names) and practically injective; that, and what a profile name may be, is all this
module decides.  Reading and writing the files is :mod:`pytest_kimi.baseline.store`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["DEFAULT_DIRNAME", "DEFAULT_PROFILE", "baseline_relpath", "check_profile"]

DEFAULT_DIRNAME = "baselines"
"""Directory under the rootdir that holds baselines unless configured otherwise."""

DEFAULT_PROFILE = "default"

_SAFE_PART = re.compile(r"[A-Za-z0-9_=+,@-][A-Za-z0-9_.=+,@-]*")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.=+,@-]+")
_MAX_PART = 100
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _safe_part(text: str) -> str:
    """A file-name-safe, deterministic, practically injective form of one nodeid component.

    Components made only of ``[A-Za-z0-9_.=+,@-]`` (not starting with ``.``, at most 100
    characters) are kept verbatim, which covers ordinary names and parameter ids.  Anything
    else has each run of other characters replaced by ``_``, is cut to 60 characters, and gets
    ``~`` plus 8 hex digits of the SHA-1 of the original appended; ``~`` never occurs in a
    verbatim component, so a sanitised name cannot collide with a verbatim one.
    """
    if _SAFE_PART.fullmatch(text) and len(text) <= _MAX_PART:
        return text
    cleaned = _UNSAFE_RUN.sub("_", text).strip("._")[:60] or "_"
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned}~{digest}"


def baseline_relpath(nodeid: str) -> Path:
    """Where a test's baseline lives, relative to ``<root>/<profile>``.

    ``tests/perf/test_ep8.py::TestSweep::test_peak[c8-512]`` becomes
    ``tests/perf/test_ep8/TestSweep.test_peak[c8-512].yaml``: the module path without ``.py``
    as directories, then class and function joined by ``.``, then the parameter id in
    brackets.  Each part goes through :func:`_safe_part`, so ``/``, spaces, ``..`` or very long
    ids can neither escape the directory nor make an unusable name.
    """
    if not isinstance(nodeid, str) or "::" not in nodeid:
        raise ValueError(f"not a pytest test nodeid (expected 'path.py::name'): {nodeid!r}")
    module, rest = nodeid.split("::", 1)
    param: str | None = None
    if "[" in rest:  # class and function names cannot hold '[': the first one opens the id
        names_text, param = rest.split("[", 1)
        if param.endswith("]"):
            param = param[:-1]
    else:
        names_text = rest
    names = [n for n in names_text.split("::") if n]
    if not names:
        raise ValueError(f"not a pytest test nodeid (no test name): {nodeid!r}")
    dirs = [c for c in module.replace("\\", "/").split("/") if c]
    if not dirs:
        raise ValueError(f"not a pytest test nodeid (no module path): {nodeid!r}")
    if dirs[-1].endswith(".py") and len(dirs[-1]) > 3:
        dirs[-1] = dirs[-1][:-3]
    stem = ".".join(_safe_part(n) for n in names)
    if param is not None:
        stem += f"[{_safe_part(param)}]"
    return Path(*[_safe_part(d) for d in dirs], f"{stem}.yaml")


def check_profile(profile: str) -> None:
    """Refuse a profile name that is not one plain directory name (``ValueError``)."""
    if not isinstance(profile, str) or not _PROFILE.fullmatch(profile):
        raise ValueError(
            f"profile must be 1-64 characters of letters, digits, '_', '.', '-' starting with a "
            f"letter or digit (it is a directory name), got {profile!r}"
        )
