"""Write SGLang's own command-line flags as the JSON the plugin and the fake SGLang read.

Why: the plugin checks a user's SGLang profile before launch (unknown flag, abbreviation,
deprecated or dead flag) and the fake SGLang parses with the same flag list, so both must
come from SGLang's real parser, not from a list written here.  This script builds that
parser (``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser(prog="sglang serve")``,
exactly as ``sglang.srt.server_args.prepare_server_args`` does) and records each flag.

"Dead" flags are parsed and never read: their field name appears in no source file outside
the field declarations (``srt/arg_groups/fields/``) and the field order list.  Regenerate
(SGLang's wheel unpacked, or installed, where ``import sglang`` finds it; the import needs
msgspec, numpy, orjson, psutil, pybase64, requests, torch, packaging, pillow, starlette,
pydantic, pyzmq, tqdm, ipython and aiohttp, but no GPU)::

    python -m venv /tmp/sgl-args && /tmp/sgl-args/bin/pip install --no-deps sglang==0.5.23
    /tmp/sgl-args/bin/pip install msgspec numpy orjson psutil pybase64 requests torch \
        packaging pillow starlette pydantic pyzmq tqdm ipython aiohttp
    SGLANG_USE_CPU_ENGINE=1 /tmp/sgl-args/bin/python tests/fake_sglang/dump_args.py \
        > pytest_kimi/data/sglang_0_5_23_args.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any

# SGLang marks a deprecated flag by its action (a warning at parse time) or by a help text
# that starts "Deprecated." / "(Deprecated, ..." (no warning: the flag still acts).
_DEPRECATED_HELP = re.compile(r"^\(?deprecated\b", re.IGNORECASE)
_FIELD_FILES = ("arg_groups/fields/", "arg_groups/field_order.py")


def _warning(action: argparse.Action, flag: str) -> str | None:
    """The warning SGLang prints when the flag is given (its Deprecated* actions' text)."""
    kind = type(action).__name__
    new_flag = getattr(action, "new_flag", None)
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    if kind in (
        "DeprecatedStoreTrueAction",
        "DeprecatedStoreConstAction",
        "DeprecatedAliasStoreAction",
    ):
        return f"'{flag}' is deprecated and will be removed in a future release.{replacement}"
    if kind == "DeprecatedAction":
        return f"The command line argument '{flag}' is deprecated and will be removed in future versions."
    return None


def _plain(value: object) -> object:
    """A default as JSON has it; anything else (a sentinel, a set) as None."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def _read_elsewhere(root: pathlib.Path) -> str:
    """All of SGLang's source except the field declarations, to search for reads of a field."""
    parts = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not any(marker in rel for marker in _FIELD_FILES):
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def main() -> int:
    # This file sits beside the fake ``sglang`` package: drop its folder from the path so
    # the import finds the real one.
    here = str(pathlib.Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(pathlib.Path(p or ".").resolve()) != here]
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    root = pathlib.Path(sglang.__file__).parent / "srt"
    elsewhere = _read_elsewhere(root)
    flags: list[dict[str, Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for option in action.option_strings:
            if not option.startswith("--"):
                continue
            help_text = str(action.help or "")
            warning = _warning(action, option)
            errors = getattr(action, "error_message", None)
            flags.append(
                {
                    "name": option[2:],
                    "dest": action.dest,
                    "takes_value": action.nargs != 0,
                    "choices": sorted(str(c) for c in action.choices) if action.choices else None,
                    "deprecated": warning is not None or bool(_DEPRECATED_HELP.search(help_text)),
                    "warning": warning,
                    "error": errors,
                    "type": getattr(action.type, "__name__", None) if action.type else None,
                    "nargs": action.nargs if action.nargs != 0 else None,
                    "default": _plain(action.default),
                    "note": help_text
                    if warning is not None or _DEPRECATED_HELP.search(help_text)
                    else None,
                    "dead": re.search(rf"\b{re.escape(action.dest)}\b", elsewhere) is None,
                }
            )
    flags.sort(key=lambda f: f["name"])
    out = {
        "sglang_version": sglang.__version__,
        "source": "sglang.srt.server_args.ServerArgs.add_cli_args on argparse.ArgumentParser(prog='sglang serve')",
        "regenerate": "tests/fake_sglang/dump_args.py (see its docstring)",
        "allow_abbrev": parser.allow_abbrev,
        "flags": flags,
    }
    # One flag a line: a new SGLang version's regeneration diffs flag by flag.
    head = json.dumps({k: v for k, v in out.items() if k != "flags"}, indent=1)[:-2]
    rows = ",\n  ".join(json.dumps(f, sort_keys=True) for f in flags)
    sys.stdout.write(f'{head},\n "flags": [\n  {rows}\n ]\n}}\n')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
