"""A stand-in for the ``sglang`` package, used only by pytest-kimi's own tests.

Put ``tests/fake_sglang`` first on ``PYTHONPATH`` and ``python -m sglang.launch_server``
runs :mod:`sglang.launch_server` from here: it parses SGLang's flags, logs like SGLang
while "loading", then serves the pytest-kimi simulator.  This lets the launcher's whole
lifecycle (readiness, crashes, timeouts, group kill) be tested without a GPU.
"""

__version__ = "0.0.0-fake"
