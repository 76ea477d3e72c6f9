"""Whether the race finds the best deployment, and what it saves over the full grid, by
simulation over a table of deployments of known speed.

Each run races eight deployments (:func:`pytest_kimi.gate.race.run_race`) whose every launch
draws a lognormal speed factor exp(N(0, noise)) about the deployment's true speed (the launch
noise: 1%, 2%; the fake SGLang's ``FAKE_SGLANG_LAUNCH_NOISE``).

**The deployments** (``--table fake-sglang``, the default) are a grid profile over the fake
SGLang's flags (``tests/fake_sglang/sglang/launch_server.py``), expanded by the plugin's own
grid code (:func:`pytest_kimi.server.profile_grid.parse_grid`)::

    name: kimi
    engine: sglang
    args:
      model-path: /m
      enable-mixed-chunk: [false, true]
      enable-torch-compile: [false, true]
      enable-eplb: [false, true]

and each deployment's true speed is the fake's own: the command line the plugin would launch
(:func:`pytest_kimi.server.profile.argv`) is parsed by the fake's parser (``build_parser()``,
SGLang 0.5.23's flags) and the speed is ``1 / flag_slowdown(ns)`` (its ``FLAG_EFFECTS``,
step-time multipliers: ``enable_eplb`` 1.8, ``enable_torch_compile`` 1.15,
``enable_mixed_chunk`` 1.02; multiplied together).  The flag-effect table this gives (printed
at the start of every run; names shortened here, ``kimi-`` and the ``no-<flag>`` labels
dropped):

    deployment                                  flags                  speed
    (no flags)                                  -                      1.000   the best
    enable-mixed-chunk                          --enable-mixed-chunk   0.980   1.96% slower
    enable-torch-compile                        --enable-torch-compile 0.870
    enable-mixed-chunk-enable-torch-compile     both                   0.853
    enable-eplb                                 --enable-eplb          0.556
    enable-mixed-chunk-enable-eplb              both                   0.545
    enable-torch-compile-enable-eplb            both                   0.483
    all three                                   all three              0.474

Two lie within 2% of each other (no flags, mixed chunk); the other six are 13% or more
slower than the best.  ``--table operator`` races the earlier hand-written table instead (the
issue's write-ups: an operator's EP8 / EP4 / TP8 variants; speeds chosen, not derived, two
within 2%, the rest 7% to 40% slower):

    deployment           speed   what it is
    ep8-tuned            1.000   EP8, max-running-requests 256, decode graphs to 256: the best
    ep8-tuned-eplb       0.985   the same with --enable-eplb: 1.5% slower, within 2%
    tp8-cuda-graph       0.930   TP8 with decode CUDA graphs
    ep8                  0.900   EP8 with SGLang's defaults
    ep8-chunked-4k       0.850   EP8, chunked-prefill-size 4096
    ep4                  0.800   EP4
    tp8                  0.700   TP8 with SGLang's defaults
    tp8-no-cuda-graph    0.600   TP8, CUDA graphs disabled

A launch's server time is its start plus its warm-up plus its measurement: ``START_S`` (600
s: a Kimi-class checkpoint loads and captures its CUDA graphs in 10-20 minutes) + ``WARM_S``
(60 s) + ``MEASURE_S / speed`` (a fixed workload, 300 s at the best's speed: a slower
deployment takes longer to serve it).  The full grid launches every deployment ``max_rounds``
times (the race's cap per deployment: the same trial counts); the race's launches are its
survivors' (an eliminated deployment's skipped launches are the saving).  ``vs-grid@rounds``
compares with the stricter grid that launches every deployment as often as the race ran
rounds (what a grid would need for the race's finalists' precision).

Per cell (100 seeded runs): ``best-or-tie``: the winner is the true best, or a declared tie
contains it (acceptance: >= 95%); ``winner-best``, ``tie``, ``undecided`` (the budget ended
without a decision); ``best-out``: the true best was eliminated (bounded by alpha);
``bad-winner``: a deployment >= 10% slower than the best was declared the winner (acceptance:
none); the mean rounds and launches; server time against the grid's (acceptance: <= 35%).
The ``null`` rows race eight *equal* deployments: ``any-out`` is the share of races that
eliminated any of them (every elimination there is an error; bounded by alpha), with the
default tolerance (the race ends in a tie) and with a tolerance too small to tie (the race
runs to its budget: every look of the Pocock calibration is exercised); their ``best``
columns read the table's first deployment.

``--launch-check N`` first launches the ``N`` fastest deployments (the best first) as real
fake-SGLang processes through the plugin's own launcher (``pytest_kimi.server.open_server``:
``python -m sglang.launch_server`` with the fake first on ``PYTHONPATH``, no launch noise),
drives each with a short closed loop (8 clients, 3 non-streamed requests of 128 tokens each,
``ignore_eos``) and prints its tok/s relative to the first one beside the table's speed: the
table is the speed the fake really serves at (within 0.7%; about 3 s a launch).  The races
themselves stay simulated: 100 races of 17-23 launches a cell would be hours of processes.

    python bench/race.py [--runs 100] [--seed 1] [--tolerance 0.05] [--alpha 0.05]
                         [--max-rounds 10] [--margin 0] [--table fake-sglang|operator]
                         [--launch-check 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "fake_sglang"
sys.path.insert(0, str(REPO))

from pytest_kimi.gate import paired  # noqa: E402
from pytest_kimi.gate import race as racing  # noqa: E402
from pytest_kimi.gate import race_stats  # noqa: E402
from pytest_kimi.server.profile import ServerProfile, argv  # noqa: E402
from pytest_kimi.server.profile_grid import parse_grid  # noqa: E402

Table = tuple[tuple[str, float], ...]

GRID: dict[str, Any] = {
    "name": "kimi",
    "engine": "sglang",
    "args": {
        "model-path": "/m",
        "enable-mixed-chunk": [False, True],
        "enable-torch-compile": [False, True],
        "enable-eplb": [False, True],
    },
    "env": {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",  # `-m sglang.launch_server` is the fake
        "FAKE_SGLANG_STARTUP_S": "0.2",
        "FAKE_SGLANG_SPEED": "5",
    },
    "startup_timeout_s": 60,
    "stop_timeout_s": 3,
}
"""The deployments of ``--table fake-sglang``: a grid profile over the fake SGLang's flags
(module docstring); the ``env`` only matters to ``--launch-check``'s real launches."""


def fake_sglang_table() -> tuple[Table, dict[str, str], list[ServerProfile]]:
    """The grid's deployments, each with its true speed by the fake's own code: its argv (as
    the plugin would launch it) through the fake's parser, ``1 / flag_slowdown``.  Returns the
    table, each deployment's flags (the words besides ``--model-path``, host and port), and
    the profiles."""
    sys.path.insert(0, str(FAKE))
    try:
        from sglang.launch_server import build_parser, flag_slowdown
    finally:
        sys.path.remove(str(FAKE))
    parser = build_parser()
    table, flags, profiles = [], {}, []
    for profile, point in parse_grid(GRID, source="bench/race.py", default_name="kimi"):
        words = argv(profile, port=30000)[len(profile.command) :]
        ns = parser.parse_args(words)
        table.append((point.name, 1.0 / flag_slowdown(ns, environ={})))
        given = [w for w in words[2:] if w.startswith("--") and w not in ("--host", "--port")]
        flags[point.name] = " ".join(given) or "-"
        profiles.append(profile)
    return tuple(table), flags, profiles


OPERATOR: Table = (
    ("ep8-tuned", 1.000),
    ("ep8-tuned-eplb", 0.985),
    ("tp8-cuda-graph", 0.930),
    ("ep8", 0.900),
    ("ep8-chunked-4k", 0.850),
    ("ep4", 0.800),
    ("tp8", 0.700),
    ("tp8-no-cuda-graph", 0.600),
)
"""``--table operator``: the earlier hand-written table (module docstring)."""
OPERATOR_NOTES = {
    "ep8-tuned": "EP8, max-running-requests 256, decode graphs to 256",
    "ep8-tuned-eplb": "the same with --enable-eplb",
    "tp8-cuda-graph": "TP8 with decode CUDA graphs",
    "ep8": "EP8 with SGLang's defaults",
    "ep8-chunked-4k": "EP8, chunked-prefill-size 4096",
    "ep4": "EP4",
    "tp8": "TP8 with SGLang's defaults",
    "tp8-no-cuda-graph": "TP8, CUDA graphs disabled",
}
BEST_TOK_S = 1000.0
NOISES = (0.01, 0.02)
START_S = 600.0
WARM_S = 60.0
MEASURE_S = 300.0


def launch_s(speed: float) -> float:
    """Server seconds of one launch of a deployment of relative ``speed``."""
    return START_S + WARM_S + MEASURE_S / speed


@dataclass(slots=True)
class Tally:
    runs: int = 0
    best_or_tie: int = 0
    winner_best: int = 0
    tie: int = 0
    undecided: int = 0
    best_out: int = 0
    bad_winner: int = 0
    any_out: int = 0
    rounds: int = 0
    launches: int = 0
    server_s: float = 0.0
    grid_s: float = 0.0
    grid_rounds_s: float = 0.0

    def row(self, label: str, noise: float) -> str:
        n = max(self.runs, 1)
        return (
            f"{label:<6} {noise:>6.0%} {self.runs:>5} {self.best_or_tie / n:>12.0%} "
            f"{self.winner_best / n:>12.0%} {self.tie / n:>5.0%} {self.undecided / n:>10.0%} "
            f"{self.best_out / n:>9.1%} {self.bad_winner / n:>11.0%} {self.any_out / n:>8.1%} "
            f"{self.rounds / n:>7.2f} {self.launches / n:>9.1f} "
            f"{self.server_s / max(self.grid_s, 1e-9):>8.1%} "
            f"{self.server_s / max(self.grid_rounds_s, 1e-9):>15.1%}"
        )


def one_race(
    table: Table,
    noise: float,
    rng: np.random.Generator,
    options: dict[str, float | int],
    max_rounds: int,
) -> tuple[racing.RaceResult, float, float, float]:
    """One simulated race: its result, its server seconds, the full grid's and the grid's at
    the race's rounds."""
    speed = dict(table)
    spent = 0.0

    def launch(name: str) -> float:
        nonlocal spent
        spent += launch_s(speed[name])
        return BEST_TOK_S * speed[name] * math.exp(rng.normal(0.0, noise))

    names = [n for n, _ in table]
    order = rng.permutation(len(names))  # where the best sits in the race's order is chance
    res = racing.run_race(
        [names[i] for i in order],
        launch,
        max_rounds=max_rounds,
        tolerance=float(options["tolerance"]),
        alpha=float(options["alpha"]),
        margin=float(options["margin"]),
    )

    per_round = sum(launch_s(s) for _, s in table)
    return res, spent, per_round * max_rounds, per_round * res.rounds


def cell(
    table: Table,
    noise: float,
    runs: int,
    rng: np.random.Generator,
    options: dict[str, float | int],
    max_rounds: int,
) -> Tally:
    best_name, best_speed = max(table, key=lambda r: r[1])
    bad = {n for n, s in table if s <= 0.9 * best_speed}
    tally = Tally()
    for _ in range(runs):
        res, spent, grid, grid_rounds = one_race(table, noise, rng, options, max_rounds)
        tally.runs += 1
        tally.winner_best += res.winner == best_name
        tally.tie += res.stop == racing.TIE
        tally.best_or_tie += res.winner == best_name or best_name in res.tie
        tally.undecided += res.stop == racing.BUDGET
        tally.best_out += res.entry(best_name).eliminated_in_round is not None
        tally.bad_winner += res.winner in bad
        tally.any_out += any(e.eliminated_in_round is not None for e in res.ranking)
        tally.rounds += res.rounds
        tally.launches += res.launches
        tally.server_s += spent
        tally.grid_s += grid
        tally.grid_rounds_s += grid_rounds
    return tally


def measure_tok_s(url: str, model: str, streams: int = 8, requests: int = 3) -> float:
    """Generated tok/s of a closed loop: ``streams`` clients, each sending ``requests``
    non-streamed chat requests of 128 tokens (``ignore_eos``) one after another."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 128,
            "ignore_eos": True,
        }
    ).encode()

    def client(_: int) -> int:
        tokens = 0
        for _ in range(requests):
            req = urllib.request.Request(
                f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as resp:
                tokens += json.load(resp)["usage"]["completion_tokens"]
        return tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        tokens = sum(pool.map(client, range(streams)))
    return tokens / (time.perf_counter() - started)


def launch_check(profiles: list[ServerProfile], table: Table) -> None:
    """Launch the deployments as real fake-SGLang processes (the plugin's launcher), measure
    each, and print its tok/s relative to the first (the fastest) beside its table speed."""
    from pytest_kimi.server import open_server

    print(f"# launch check: {len(table)} real fake-SGLang launches, no launch noise")
    wn = max(len(n) for n, _ in table)
    print(f"{'deployment':<{wn}}  {'tok/s':>8} {'measured':>9} {'table':>6} {'error':>7}")
    first: tuple[float, float] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for profile, (name, speed) in zip(profiles, table, strict=True):
            server = open_server(profile, Path(tmp) / "logs").launch()
            try:
                tok_s = measure_tok_s(server.url, str(profile.args["model-path"]))
            finally:
                server.stop()
            first = first or (tok_s, speed)
            rel = tok_s / first[0] * first[1]
            print(f"{name:<{wn}}  {tok_s:>8.0f} {rel:>9.3f} {speed:>6.3f} {rel / speed - 1:>+7.2%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=racing.DEFAULT_TOLERANCE)
    ap.add_argument("--alpha", type=float, default=racing.DEFAULT_ALPHA)
    ap.add_argument("--max-rounds", type=int, default=racing.DEFAULT_MAX_ROUNDS)
    ap.add_argument("--margin", type=float, default=0.0, help="the elimination's margin")
    ap.add_argument(
        "--table",
        choices=("fake-sglang", "operator"),
        default="fake-sglang",
        help="the deployments: the fake SGLang's flag grid, or the hand-written table",
    )
    ap.add_argument(
        "--launch-check",
        type=int,
        default=0,
        metavar="N",
        help="first launch the grid's first N deployments as real fake-SGLang processes",
    )
    args = ap.parse_args(argv)
    if args.table == "fake-sglang":
        table, notes, profiles = fake_sglang_table()
        source = "the fake SGLang's flag grid, speed = 1 / flag_slowdown"
    else:
        table, notes, profiles = OPERATOR, OPERATOR_NOTES, []
        source = "the hand-written operator table"
    best = max(s for _, s in table)
    by_speed = sorted(range(len(table)), key=lambda i: -table[i][1])
    wn, wf = max(len(n) for n, _ in table), max(len(f) for f in notes.values())
    print(f"# deployments: {source}")
    what = "flags" if profiles else "what it is"
    print(f"{'deployment':<{wn}}  {what:<{wf}}  {'speed':>6} {'vs best':>8}")
    for i in by_speed:
        name, speed = table[i]
        print(f"{name:<{wn}}  {notes[name]:<{wf}}  {speed:>6.3f} {speed / best - 1:>+8.2%}")
    if args.launch_check:
        if not profiles:
            ap.error("--launch-check needs --table fake-sglang")
        fastest = by_speed[: args.launch_check]
        launch_check([profiles[i] for i in fastest], tuple(table[i] for i in fastest))
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    options: dict[str, float | int] = {
        "tolerance": args.tolerance,
        "alpha": args.alpha,
        "margin": args.margin,
    }
    n = len(table)
    print(
        f"# {args.runs} seeded runs a cell, seed {args.seed}; {n} deployments, tolerance "
        f"{args.tolerance:.0%}, alpha {args.alpha:.0%}, margin {args.margin:.0%}, at most "
        f"{args.max_rounds} rounds; elimination level per look "
        f"{race_stats.nominal_alpha(args.alpha, n, args.max_rounds):.4f} (Tukey), tie level "
        f"{paired.nominal_alpha(args.alpha, args.max_rounds):.4f}; "
        f"a launch: {START_S:.0f} s start + {WARM_S:.0f} s warm-up + {MEASURE_S:.0f} s / speed"
    )
    print(
        "cell    noise  runs  best-or-tie  winner-best   tie  undecided  best-out  "
        "bad-winner  any-out  rounds  launches  vs-grid  vs-grid@rounds"
    )
    worst_right, worst_ratio, bad = 1.0, 0.0, 0
    for noise in NOISES:
        t = cell(table, noise, args.runs, rng, options, args.max_rounds)
        print(t.row("race", noise))
        worst_right = min(worst_right, t.best_or_tie / t.runs)
        worst_ratio = max(worst_ratio, t.server_s / t.grid_s)
        bad += t.bad_winner
    equal = tuple((name, 1.0) for name, _ in table)
    null_runs = 2 * args.runs
    t = cell(equal, 0.02, null_runs, rng, options, args.max_rounds)
    print(t.row("null", 0.02))
    strict = dict(options, tolerance=1e-4)
    t = cell(equal, 0.02, null_runs, rng, strict, args.max_rounds)
    print(t.row("null*", 0.02))
    verdict = worst_right >= 0.95 and bad == 0 and worst_ratio <= 0.35
    print(
        f"# acceptance {'holds' if verdict else 'FAILS'}: best-or-tie >= 95% (worst "
        f"{worst_right:.0%}), no winner >= 10% slower ({bad} seen), server time <= 35% of "
        f"the full grid (worst {worst_ratio:.1%}); null* = equal deployments raced to the "
        f"budget (tolerance 0.01%: never a tie).  {time.perf_counter() - started:.0f} s"
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
