"""The verdict of a level: one enum, and the questions every stage asks of it.

Verdicts used to be spelled as string sets wherever a question was asked (which fail a run,
which may be recorded as a baseline, which can be compared offline, which are warnings), and
the sets drifted.  Each question is now a property of :class:`Verdict`, so a new verdict is
added in one place and every stage answers for it.

The values are the strings the JSON, YAML and reports have always carried; reports and result
dicts keep carrying those plain strings (``Verdict.X.value``), since a ``str`` enum member
hashes by its *name* and so is not found in a set of strings.  No pytest here.

Verdicts of a level, strongest first:

- ``not-run``: an earlier level of the sweep ended in ``error``, so this one was not measured;
- ``error``: requests failed (HTTP errors, timeouts, broken streams) beyond ``max_error_rate``;
- ``invalid``: the figure cannot be trusted (wrong token counts under ``ignore_eos``, empty 200
  responses, no steady-state window, or a saturated client), so none is published;
- ``fail``: an absolute target (floor or ceiling) was missed;
- ``regression`` / ``improved`` / ``inconclusive`` / ``underpowered``: the comparison with
  the baseline (:mod:`pytest_kimi.gate.stats`) of a level that passed its targets;
- ``no-baseline``: the level passed its targets and there is nothing to compare with;
- ``inconclusive``: the estimate lies beyond the tolerance, but the drop is not significant
  at the trial cap: it fails the test (a drop beyond the tolerance is never a green job) and
  is not recorded without ``--update-baselines=force``;
- ``pass``: no significant drop beyond the tolerance, the estimate within it, and a drop of
  the detectable size would have been caught.

A ``@capacity`` test's levels are the points its search measured; each says whether every
latency ceiling held there (``held``) or not (``broke``).  Neither fails a test: a level past
the capacity is what the search looks for.  The test's own verdict is its capacity's
(:mod:`pytest_kimi.gate.capacity_gate`).
"""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    """Outcome of one level; ``str`` so it compares equal to and serialises as its value."""

    PASS = "pass"
    FAIL = "fail"
    INVALID = "invalid"
    ERROR = "error"
    NOT_RUN = "not-run"
    REGRESSION = "regression"
    IMPROVED = "improved"
    INCONCLUSIVE = "inconclusive"
    UNDERPOWERED = "underpowered"
    NO_BASELINE = "no-baseline"
    HELD = "held"
    BROKE = "broke"

    def __str__(self) -> str:
        # The JSON word in f-strings and str() on every Python (3.12 would say "Verdict.PASS").
        return self.value

    @classmethod
    def of(cls, value: object) -> Verdict | None:
        """The verdict a report string names, or None for anything else (a foreign report)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except (ValueError, TypeError):  # TypeError: an unhashable value
            return None

    def fails(self, *, strict: bool = False, require_baseline: bool = False) -> bool:
        """Does a level with this verdict fail its test?

        ``fail``, ``invalid``, ``error``, ``regression`` and ``inconclusive`` always do;
        ``no-baseline`` only with ``--perf-require-baseline`` (a suite that must never run
        unguarded); ``underpowered`` only with ``--perf-strict`` (within the tolerance, but the
        run could not have seen a drop of the detectable size: the measurement's weakness, not
        the server's).  ``inconclusive`` fails by default because its estimate lies *beyond*
        the tolerance: a green job beside a measured drop of 9% would say more than the data
        do, whether or not the drop reached significance (a 10% slower sweep on a fresh
        install was such a green job).
        """
        if self in _ALWAYS_FAILING:
            return True
        if self is Verdict.NO_BASELINE:
            return require_baseline
        if self is Verdict.UNDERPOWERED:
            return strict
        return False

    @classmethod
    def failing(cls, *, strict: bool = False, require_baseline: bool = False) -> frozenset[str]:
        """The values of the verdicts that fail a test under these flags (for report lookups)."""
        return frozenset(
            v.value for v in cls if v.fails(strict=strict, require_baseline=require_baseline)
        )

    @property
    def warning(self) -> bool:
        """Passes by default but fails with ``--perf-strict`` / ``--perf-require-baseline``:
        reports mark it so a reader sees the gate could not vouch for the level.  Not
        ``inconclusive``: its estimate lies beyond the tolerance, so it fails (:meth:`fails`)."""
        return self in (Verdict.UNDERPOWERED, Verdict.NO_BASELINE)

    @property
    def recordable(self) -> bool:
        """May a level with this verdict become a baseline (without ``--update-baselines=force``)?

        Not ``error``, ``invalid`` or ``not-run``: their samples are missing or untrustworthy,
        and every later comparison would be judged against them.  Not ``fail`` or
        ``regression`` either: their samples are sound, but the run failed on them, and
        recording it would make the figure the gate just rejected the next target (a red run
        turned green by an update).  An approved trade-off is recorded with ``force``, which
        the pull request then approves.  ``improved``, ``pass``, ``no-baseline``,
        ``underpowered`` and ``inconclusive`` may be.
        """
        return self not in _NOT_RECORDABLE

    @property
    def comparable(self) -> bool:
        """Can a level with this verdict be compared with another (``kimi-perf compare``)?

        ``error``, ``invalid`` and ``not-run`` are excluded: no trustworthy samples.  A
        ``fail`` or ``regression`` level is comparable (its samples are sound) though not
        :attr:`recordable`: the two questions differ.
        """
        return self not in _UNTRUSTWORTHY

    @property
    def headline(self) -> str:
        """What a failing test's message says a level with this verdict is (``throughput ...``);
        the conditional ones name the flag that made them fail."""
        return _HEADLINES.get(self, self.value)

    @property
    def meaning(self) -> str:
        """One line for a report's legend: what a reader should take a level's verdict to say."""
        return _MEANINGS[self]

    @property
    def stops_sweep(self) -> bool:
        """Does this verdict leave later levels of the sweep unmeasured (``not-run``)?  Only
        ``error``: a server that fails requests at one load will not serve a higher one."""
        return self is Verdict.ERROR


_ALWAYS_FAILING = frozenset(
    {Verdict.FAIL, Verdict.INVALID, Verdict.ERROR, Verdict.REGRESSION, Verdict.INCONCLUSIVE}
)
_UNTRUSTWORTHY = frozenset({Verdict.ERROR, Verdict.INVALID, Verdict.NOT_RUN})
_NOT_RECORDABLE = _UNTRUSTWORTHY | {Verdict.FAIL, Verdict.REGRESSION, Verdict.INCONCLUSIVE}
"""What ``--update-baselines`` refuses without ``force``: untrustworthy samples, and the
verdicts that failed the run on sound ones."""
_HEADLINES = {
    Verdict.FAIL: "target missed",
    Verdict.REGRESSION: "regression beyond noise",
    Verdict.ERROR: "requests failed",
    Verdict.INVALID: "measurement invalid",
    Verdict.NO_BASELINE: "no baseline (--perf-require-baseline)",
    Verdict.INCONCLUSIVE: "inconclusive: the estimate lies beyond the tolerance",
    Verdict.UNDERPOWERED: "underpowered (--perf-strict)",
}

_MEANINGS = {
    Verdict.PASS: "no significant drop beyond the tolerance, the estimate within it, and a "
    "drop of the detectable size would have been caught (or above the target, without a "
    "baseline)",
    Verdict.IMPROVED: "significantly faster than the baseline: update it so the slack cannot "
    "hide a later regression",
    Verdict.REGRESSION: "significantly slower than the baseline beyond the tolerance",
    Verdict.FAIL: "below the absolute target (min tok/s)",
    Verdict.INVALID: "the measurement cannot be trusted (client overloaded, too few requests, ...)",
    Verdict.ERROR: "the level could not be measured (requests failed, endpoint down)",
    Verdict.NOT_RUN: "skipped because an earlier level of the test errored",
    Verdict.INCONCLUSIVE: "the estimate lies beyond the tolerance but the drop is not "
    "significant, even after every trial --perf-max-trials allows: the gate cannot vouch for "
    "the level either way, so it fails the test (a drop beyond the tolerance is never green)",
    Verdict.UNDERPOWERED: "too noisy: this run could not have caught a drop of the detectable "
    "size (--perf-detectable-drop)",
    Verdict.NO_BASELINE: "nothing recorded to compare with (record with --update-baselines)",
    Verdict.HELD: "a capacity search's level where every latency ceiling held",
    Verdict.BROKE: "a capacity search's level where a latency ceiling was exceeded (beyond the "
    "capacity; not a failure)",
}

__all__ = ["Verdict"]
