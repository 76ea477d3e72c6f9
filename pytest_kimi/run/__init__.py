"""The conductor: the one path a perf test takes, without pytest.

``plan`` (a test's markers -> :class:`~pytest_kimi.run.conductor.TestPlan`) -> ``setup``
(deployments, endpoint: external, simulator or managed) -> ``conductor`` (prepare, measure,
judge, annotate: :func:`~pytest_kimi.run.conductor.conduct`, a sweep or a capacity search in
its middle) -> ``finish`` (reports, history, baseline update).  ``measurer`` owns the load
loop and client every test shares; ``server_starts`` orders and pools ``--perf-sessions``;
``gating`` holds the session's gate settings and baseline store.

The plugin (:mod:`pytest_kimi.plugin`) is wiring over this package; ``bench/`` scripts and
``kimi-perf`` call it the same way.
"""
