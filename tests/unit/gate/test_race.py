"""The race (:mod:`pytest_kimi.gate.race`) over synthetic oracles, and the grid of deployments
(:mod:`pytest_kimi.server.profile_grid`) that feeds it; no server anywhere.

Oracles are either *scripted* (each deployment's launch figures given in order: the race's
logic is seen alone) or *noisy* (seeded lognormal launch noise about a known speed: what the
statistics make of it).  The race: a clear winner, a declared tie, a start failure eliminated
with its reason, the budget's end (rounds and launches), the rotating order, the step API the
plugin drives, and the multiplicity control (equal deployments raced to the budget eliminate
one no more often than ``alpha`` allows).  The grid: expansion and naming, exclusions, the
errors that catch a typo, the GPU count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from pytest_kimi.gate import paired
from pytest_kimi.gate.race import (
    BUDGET,
    NO_DEPLOYMENT,
    TIE,
    WINNER,
    Race,
    StartFailure,
    round_order,
    run_race,
)
from pytest_kimi.gate.race_stats import nominal_alpha
from pytest_kimi.server.profile import ProfileError, parse_profile
from pytest_kimi.server.profile_grid import (
    GRID_KEYS,
    MAX_DEPLOYMENTS,
    expand,
    gpus_of,
    grid_points,
    is_grid,
    label,
    parse_grid,
)


def noisy(
    speeds: dict[str, float], noise: float, seed: int
) -> Callable[[str], float | StartFailure]:
    rng = np.random.default_rng(seed)
    return lambda name: 100.0 * speeds[name] * math.exp(rng.normal(0.0, noise))


def scripted(figures: dict[str, Sequence[float | StartFailure]]) -> Callable[[str], float]:
    """Each deployment's launches in order; a StartFailure in the script is raised."""
    taken = {name: 0 for name in figures}

    def launch(name: str) -> float:
        outcome = figures[name][taken[name]]
        taken[name] += 1
        if isinstance(outcome, StartFailure):
            raise outcome
        return outcome

    return launch


# ---------------------------------------------------------------------- the race


def test_a_clear_winner_eliminates_the_slower_deployments_with_their_reason() -> None:
    speeds = {"ep8": 0.80, "ep8-tuned": 1.00, "tp8": 0.60}
    res = run_race(list(speeds), noisy(speeds, 0.01, seed=1))
    assert res.stop == WINNER and res.winner == "ep8-tuned"
    assert res.tie == () and res.undecided == ()
    assert [e.name for e in res.ranking] == ["ep8-tuned", "ep8", "tp8"]
    assert res.rounds == 2 and res.launches == 6  # decided at the first look
    for name in ("ep8", "tp8"):
        e = res.entry(name)
        assert e.status == "eliminated" and e.eliminated_in_round == 2
        assert e.beaten_by == "ep8-tuned" and e.p_value is not None
        assert e.p_value <= res.nominal_alpha
        assert e.reason is not None and e.reason.startswith("slower than ep8-tuned: -")
        assert e.ratio_ci90 is not None and e.ratio_ci90[1] < 1.0
    top = res.ranking[0]
    assert top.ratio == 1.0 and top.p_best is not None and top.p_best > 0.99
    assert top.value is not None and top.ci90 is not None
    assert top.ci90[0] < top.value < top.ci90[1]
    assert "ep8-tuned wins" in res.summary() and "over ep8" in res.summary()


def test_deployments_within_the_tolerance_end_in_a_declared_tie() -> None:
    speeds = {"a": 1.00, "b": 0.995, "c": 0.99}
    res = run_race(list(speeds), noisy(speeds, 0.01, seed=2))
    assert res.stop == TIE and res.winner is None
    assert set(res.tie) == set(speeds)
    assert all(e.status == TIE and e.eliminated_in_round is None for e in res.ranking)
    out = res.to_dict(objective="tok/s at c=8", server_s=1234.56, grid_server_s=9999.0)
    assert out["winner"] is None and sorted(out["tie"]) == ["a", "b", "c"]
    assert "tie within 5%" in res.summary()


def test_the_json_section_has_the_issue_shape_and_takes_the_callers_fields() -> None:
    speeds = {"ep8": 0.80, "ep8-tuned": 1.00}
    res = run_race(list(speeds), noisy(speeds, 0.01, seed=3))
    out = res.to_dict(objective="tok/s", server_s=1234.56, grid_server_s=9000.0)
    assert {
        "objective",
        "ranking",
        "winner",
        "tie",
        "launches",
        "server_s",
        "grid_server_s",
    } <= set(out)
    assert out["objective"] == "tok/s" and out["server_s"] == 1234.6
    assert out["winner"] == "ep8-tuned" and out["tie"] == []
    first, second = out["ranking"]
    assert {"deployment", "value", "ci90", "eliminated_in_round"} <= set(first)
    assert first["deployment"] == "ep8-tuned" and first["eliminated_in_round"] is None
    assert second["eliminated_in_round"] == 2 and len(second["ci90"]) == 2
    assert res.to_dict()["server_s"] is None  # the run layer's to fill


def test_a_start_failure_is_eliminated_in_its_round_with_its_reason() -> None:
    bad = StartFailure("CUDA out of memory while capturing graphs")
    launch = scripted(
        {
            "ep8": [100.0, 101.0, 100.5, 99.8],
            "ep4": [bad],
            "tp8": [99.0, StartFailure("port in use")],
        }
    )
    race = Race(["ep8", "ep4", "tp8"])
    order = race.next_round()
    for name in order:
        try:
            race.record(name, launch(name))
        except StartFailure as exc:
            race.record(name, exc)
    assert race.state().survivors == ("ep8", "tp8")
    ep4 = race.result().entry("ep4")
    assert ep4.status == "failed" and ep4.eliminated_in_round == 1 and ep4.value is None
    assert ep4.reason == "did not start: CUDA out of memory while capturing graphs"
    for name in race.next_round():
        try:
            race.record(name, launch(name))
        except StartFailure as exc:
            race.record(name, exc)
    res = race.result()
    assert res.stop == WINNER and res.winner == "ep8"  # the only one left
    tp8 = res.entry("tp8")
    assert tp8.eliminated_in_round == 2 and tp8.reason == "did not start: port in use"
    assert tp8.launches == 2 and tp8.value == pytest.approx(99.0)  # its figure is kept
    assert res.launches == 5  # failed starts count: they cost a start
    assert [e.name for e in res.ranking] == ["ep8", "tp8", "ep4"]


def test_a_returned_start_failure_counts_like_a_raised_one() -> None:
    res = run_race(["a", "b"], lambda n: StartFailure("no GPU") if n == "b" else 100.0)
    assert res.winner == "a" and res.rounds == 1
    assert run_race(["a", "b"], lambda n: StartFailure("no GPU")).stop == NO_DEPLOYMENT


def test_the_rounds_budget_ends_undecided() -> None:
    # 4.5% apart with 3% launch scatter: neither separable in 3 rounds nor within 5% for sure
    launch = scripted({"a": [100.0, 104.0, 97.0], "b": [95.0, 99.0, 93.0]})
    res = run_race(["a", "b"], launch, max_rounds=3)
    assert res.stop == BUDGET and res.winner is None and res.tie == ()
    assert res.undecided == ("a", "b") and res.rounds == 3 and res.launches == 6
    assert all(e.status == "undecided" for e in res.ranking)
    assert "undecided between a, b" in res.summary()


def test_the_launch_budget_never_starts_a_round_it_cannot_finish() -> None:
    speeds = {"a": 1.0, "b": 0.99, "c": 0.98}
    res = run_race(list(speeds), noisy(speeds, 0.03, seed=4), max_launches=8, tolerance=0.01)
    assert res.stop == BUDGET and res.launches == 6 and res.rounds == 2
    with pytest.raises(ValueError, match="cannot launch each"):
        Race(["a", "b", "c"], max_launches=2)


def test_the_order_rotates_and_reverses_so_a_drift_falls_on_all_alike() -> None:
    names = ["a", "b", "c"]
    assert [round_order(names, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["b", "c", "a"],
        ["a", "c", "b"],
    ]
    for size in range(2, 7):
        deps = [str(i) for i in range(size)]
        for pair in range(size + 1):
            first, second = round_order(deps, 2 * pair), round_order(deps, 2 * pair + 1)
            sums = {d: first.index(d) + second.index(d) for d in deps}
            assert set(sums.values()) == {size - 1}  # a linear drift cancels each two rounds
        leaders = {round_order(deps, 2 * k)[0] for k in range(size)}
        assert leaders == set(deps)  # nobody always goes first


def test_the_race_launches_in_round_order_over_the_survivors() -> None:
    race = Race(["a", "b", "c", "d"])
    seen = []
    figures = {"a": 100.0, "b": 60.0, "c": 99.5, "d": 99.0}
    rng = np.random.default_rng(5)
    while order := race.next_round():
        assert order == race.next_round()  # asking again is harmless
        seen.append(order)
        for name in order:
            race.record(name, figures[name] * math.exp(rng.normal(0, 0.005)))
    assert seen[0] == ["a", "b", "c", "d"] and seen[1] == ["d", "c", "b", "a"]
    assert all("b" not in order for order in seen[2:])  # eliminated at the first look
    for k, order in enumerate(seen):
        survivors = [n for n in ["a", "b", "c", "d"] if n in order]
        assert order == round_order(survivors, k)


def test_record_refuses_what_was_not_asked_for_and_bad_figures() -> None:
    race = Race(["a", "b"])
    with pytest.raises(ValueError, match="not waiting"):
        race.record("a", 100.0)
    race.next_round()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite and positive"):
            race.record("a", bad)
    race.record("a", 100.0)
    with pytest.raises(ValueError, match="not waiting"):
        race.record("a", 100.0)
    state = race.state()
    assert state.pending == ("b",) and state.round == 1 and state.launches == 1
    assert not state.done and race.result().stop is None  # a snapshot mid-race
    with pytest.raises(ValueError, match="distinct"):
        Race(["a", "a"])
    with pytest.raises(ValueError, match="at least 2"):
        Race(["a"])


def test_a_margin_keeps_deployments_within_it_together() -> None:
    """3% apart with almost no noise: significant, so the default drops the slower one; with
    the margin at the tolerance only a gap beyond it eliminates, and the two tie."""
    speeds = {"a": 1.00, "b": 0.97}
    assert run_race(list(speeds), noisy(speeds, 0.002, seed=6)).winner == "a"
    res = run_race(list(speeds), noisy(speeds, 0.002, seed=6), margin=0.05)
    assert res.stop == TIE and set(res.tie) == {"a", "b"}


def test_the_nominal_level_spreads_alpha_over_the_looks() -> None:
    assert nominal_alpha(0.05, 4, 2) == 0.05  # one look
    levels = [nominal_alpha(0.05, 6, r) for r in (3, 6, 10)]
    assert 0.05 > levels[0] > levels[1] > levels[2] > 0.05 / 9  # better than Bonferroni
    assert nominal_alpha(0.05, 6, 6) == levels[1]  # seeded: a function of the design
    race = Race(["a", "b", "c"], max_rounds=6)
    assert race.tie_alpha == paired.nominal_alpha(0.05, 6)
    with pytest.raises(ValueError):
        nominal_alpha(0.05, 4, 1)


def test_equal_deployments_raced_to_the_budget_are_rarely_eliminated() -> None:
    """Six equal deployments, a tolerance too small to ever tie, so every race runs all its
    looks and every elimination is an error: the share of races with one stays within
    alpha plus three binomial standard errors."""
    runs, alpha = 150, 0.05
    names = [f"d{i}" for i in range(6)]
    speeds = dict.fromkeys(names, 1.0)
    rng = np.random.default_rng(7)
    wrong = 0
    for _ in range(runs):
        res = run_race(
            names,
            lambda n: 100.0 * speeds[n] * math.exp(rng.normal(0.0, 0.02)),
            tolerance=1e-4,
            max_rounds=6,
        )
        assert res.stop == BUDGET and res.rounds == 6
        wrong += any(e.eliminated_in_round is not None for e in res.ranking)
    bound = alpha + 3.0 * math.sqrt(alpha * (1 - alpha) / runs)
    assert wrong / runs <= bound


def test_the_true_best_survives_a_close_field() -> None:
    """The best 1.5% ahead of one rival and well ahead of the rest: it is the winner, or in
    the tie, in nearly every seeded race (it is eliminated with probability under alpha)."""
    speeds = {"best": 1.0, "close": 0.985, "x": 0.93, "y": 0.9, "z": 0.8}
    right = 0
    for seed in range(40):
        res = run_race(list(speeds), noisy(speeds, 0.02, seed=100 + seed))
        right += res.winner == "best" or "best" in res.tie
        assert res.winner not in ("y", "z")
    assert right >= 38


# ---------------------------------------------------------------------- the grid

GRID: dict[str, Any] = {
    "name": "kimi",
    "args": {
        "model-path": "/models/Kimi-K2.6",
        "tp-size": [4, 8],
        "ep-size": [4, 8],
        "enable-eplb": [False, True],
        "cuda-graph-bs-prefill": [1, 2, 4],  # a multi-word flag's one value
        "trust-remote-code": True,
    },
    "exclude": [{"tp-size": 4, "ep-size": 8}, {"enable-eplb": True, "ep-size": [4]}],
    "gpus": 8,
}


def test_a_grid_expands_to_every_allowed_combination_named_by_what_differs() -> None:
    points = grid_points(GRID)
    assert [p.name for p in points] == [
        "kimi-tp4-ep4-no-enable-eplb",
        "kimi-tp8-ep4-no-enable-eplb",
        "kimi-tp8-ep8-no-enable-eplb",
        "kimi-tp8-ep8-enable-eplb",
    ]
    for p in points:
        assert not set(GRID_KEYS) & set(p.profile)
        assert p.profile["name"] == p.name and p.gpus == 8
        assert p.profile["args"]["cuda-graph-bs-prefill"] == [1, 2, 4]
        assert dict(p.assignment).keys() == {"tp-size", "ep-size", "enable-eplb"}
        assert re.fullmatch(r"[A-Za-z0-9._+-]+", p.name)
        parse_profile(p.profile, source="grid", default_name=p.name)  # a valid profile
    assert expand(GRID) == [(p.name, p.profile) for p in points]
    assert GRID["args"]["tp-size"] == [4, 8]  # the input is not touched
    profiles = parse_grid(GRID, source="servers/kimi.yaml", default_name="kimi")
    assert [p.name for p, _ in profiles] == [p.name for p in points]
    assert profiles[3][0].args["enable-eplb"] is True


def test_names_leave_out_what_does_not_differ_and_stay_distinct() -> None:
    raw = {
        "args": {
            "model-path": ["/models/a/Kimi", "/other/b/Kimi"],  # same last part
            "tp-size": [8],  # one value: not in the name
            "attention-backend": ["triton", "fa3"],
        },
        "exclude": [{"attention-backend": "fa3"}],
    }
    names = [p.name for p in grid_points(raw, default_name="k2")]
    assert len(names) == 2 and len(set(names)) == 2
    assert all(n.startswith("k2-model-path-Kimi-") for n in names)  # hashed apart
    assert "triton" not in names[0]  # constant after the exclusion
    assert label("mem-fraction-static", 0.88) == "mem-fraction-static0.88"
    assert label("cuda-graph-bs-decode", [1, 2, 4]) == "cuda-graph-bs-decode1_2_4"
    assert label("disable-cuda-graph", None) == "no-disable-cuda-graph"
    assert label("chunked-prefill-size", 4096) == "chunked-prefill4096"
    long = label("served-model-name", "x" * 100)
    assert len(long) <= 40 and re.fullmatch(r"[A-Za-z0-9._+-]+", long)


def test_list_values_of_multi_word_flags_need_a_list_of_lists_to_be_an_axis() -> None:
    raw = {"args": {"cuda-graph-bs-decode": [[1, 2], [1, 2, 4, 8]], "cuda-graph-bs-prefill": [1]}}
    points = grid_points(raw, default_name="g")
    assert [p.profile["args"]["cuda-graph-bs-decode"] for p in points] == [[1, 2], [1, 2, 4, 8]]
    assert all(p.profile["args"]["cuda-graph-bs-prefill"] == [1] for p in points)
    vllm = {"engine": "vllm", "args": {"max-num-seqs": [1, 8]}}  # no parser shipped: an axis
    assert [n for n, _ in expand(vllm, default_name="v")] == ["v-max-num-seqs1", "v-max-num-seqs8"]


def test_a_profile_without_axes_is_one_deployment_as_it_was() -> None:
    raw = {"args": {"model-path": "/m", "tp-size": 8, "cuda-graph-bs-decode": [1, 2, 4]}}
    assert not is_grid(raw)
    assert expand(raw, default_name="ep8") == [("ep8", {**raw, "name": "ep8"})]
    assert is_grid(GRID) and is_grid({"args": {"model-path": "/m"}, "gpus": 4})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"exclude": [{"model-path": "/m"}]}, "not an axis"),
        ({"exclude": [{"tp-size": 16}]}, "not among the axis' values"),
        ({"exclude": [{"tp-size": [4, 16]}]}, "not among the axis' values"),
        ({"exclude": [{"enable-eplb": 1}]}, "not among"),  # true is not 1
        ({"exclude": [{"tp-size": [4, 8]}]}, "leaves none"),
        ({"exclude": {"tp-size": 4}}, "must be a list"),
        ({"exclude": [{}]}, "non-empty mapping"),
        ({"args": {"model-path": "/m", "tp-size": []}}, "empty list"),
        ({"args": {"model-path": "/m", "tp-size": [8, 8]}}, "twice"),
        ({"args": {"model-path": "/m", "tp-size": [{"a": 1}, 2]}}, "mapping"),
    ],
)
def test_a_grid_that_cannot_mean_what_it_says_is_an_error(
    change: dict[str, object], message: str
) -> None:
    raw = {
        "args": {"model-path": "/m", "tp-size": [4, 8], "enable-eplb": [False, True]},
        **change,
    }
    with pytest.raises(ProfileError, match=message):
        grid_points(raw, default_name="g")


def test_a_grid_too_large_to_race_is_refused() -> None:
    raw = {
        "args": {"model-path": "/m", "max-running-requests": list(range(1, MAX_DEPLOYMENTS + 2))}
    }
    with pytest.raises(ProfileError, match="at most"):
        expand(raw, default_name="g")
    huge = {"args": {f"flag-{i}": list(range(10)) for i in range(4)}}
    with pytest.raises(ProfileError, match="combinations"):
        expand(huge, default_name="g")


def test_gpus_come_from_the_field_or_the_parallel_sizes() -> None:
    assert gpus_of({"args": {"tp-size": 8}}) == 8
    assert gpus_of({"args": {"tp_size": 4, "dp-size": 2}}) == 8  # dp replicas add GPUs
    assert gpus_of({"args": {"tp-size": 8, "dp-size": 8, "enable-dp-attention": True}}) == 8
    assert gpus_of({"args": {"tp-size": 8, "attn-dp-size": 8}}) == 8
    assert gpus_of({"args": {"tp-size": 4, "pp-size": 2}}) == 8
    vllm = {"engine": "vllm", "args": {"tensor-parallel-size": 2, "data-parallel-size": 2}}
    assert gpus_of(vllm) == 4
    assert gpus_of({"args": {"model-path": "/m"}}) == 1  # both engines' default
    assert gpus_of({"args": {"tp-size": 8}, "gpus": 16}) == 16  # the field wins
    assert gpus_of({"url": "http://gpu-host:30000"}) is None  # external: not ours to read
    assert gpus_of({"url": "http://gpu-host:30000", "gpus": 8}) == 8
    profile = parse_profile(
        {"args": {"model-path": "/m", "tp-size": 2}}, source="p", default_name="p"
    )
    assert gpus_of(profile) == 2
    for bad in ({"args": {"tp-size": [4, 8]}}, {"args": {"tp-size": 0}}, {"gpus": True}):
        with pytest.raises(ProfileError):
            gpus_of(bad)
    assert [p.gpus for p in grid_points({"args": {"tp-size": [2, 4]}}, default_name="g")] == [2, 4]
