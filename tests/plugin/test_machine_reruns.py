"""The suite's ``pytester`` runs a session again only when the machine voided its measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.busy_machine import MACHINE_VOIDED, SESSION_ATTEMPTS

# Each attempt counts itself in a file outside the session's directory (which is restored
# between attempts) and leaves a file inside it (which must not survive into the next one).
SESSION = """
from pathlib import Path

def test_measured():
    counter = Path({counter!r})
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    left_over = Path("left-over.txt")
    assert not left_over.exists(), "the previous attempt's files were not restored"
    left_over.write_text(str(n))
    if n < {voided_attempts} + 1:
        print("C=8 invalid: load client stalled ...: {reason}")
        assert False
"""


def _session(pytester: pytest.Pytester, tmp_path: Path, voided: int, reason: str) -> Path:
    counter = tmp_path / "attempts"
    pytester.makepyfile(SESSION.format(counter=str(counter), voided_attempts=voided, reason=reason))
    return counter


@pytest.mark.parametrize("how", ["runpytest", "runpytest_subprocess"])
def test_a_session_voided_by_the_machine_runs_again_from_the_same_files(
    pytester: pytest.Pytester, tmp_path: Path, how: str
) -> None:
    counter = _session(pytester, tmp_path, voided=1, reason=MACHINE_VOIDED)
    result = getattr(pytester, how)()
    result.assert_outcomes(passed=1)
    assert counter.read_text() == "2"


def test_the_machine_gets_a_bounded_number_of_attempts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    counter = _session(pytester, tmp_path, voided=SESSION_ATTEMPTS + 5, reason=MACHINE_VOIDED)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    assert counter.read_text() == str(SESSION_ATTEMPTS)


def test_any_other_failure_stands_at_once(pytester: pytest.Pytester, tmp_path: Path) -> None:
    counter = _session(pytester, tmp_path, voided=1, reason="throughput target missed")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    assert counter.read_text() == "1"
