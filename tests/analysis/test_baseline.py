"""The baseline noise rule on hand-written per-step values: no timing, no traces.

Why these cases: a real baseline often has one slow warm-up step or a hiccup, which inflated
the old mean ± sd band until a +311% slowdown passed as noise (a flaky capture test on a busy
CI host). The rule must see through one outlier step without flagging genuine noise.
"""

from __future__ import annotations

import math
import statistics

import pytest
from ranklens.analysis import baseline

MS = 1e6  # per-step values are in ns


def _step(cur: list[float], base: list[float], limit: float = 0.25) -> baseline.Change:
    return baseline.judge("step_time", "all", 0, cur, base, limit)


def _old_rule_flags(cur: list[float], base: list[float], limit: float) -> bool:
    """The rule before: means, 3·sqrt(sd²/n + sd_b²/n_b)."""
    m, m_b = statistics.mean(cur), statistics.mean(base)
    sd, sd_b = statistics.stdev(cur), statistics.stdev(base)
    noise = 3 * math.sqrt(sd * sd / len(cur) + sd_b * sd_b / len(base)) / m_b
    delta = (m - m_b) / m_b
    return delta > limit and delta > noise


@pytest.mark.parametrize(
    "base",
    [
        [1400 * MS, 300 * MS, 310 * MS],  # 3 recorded steps, the first one a warm-up
        [300 * MS, 305 * MS, 2900 * MS, 298 * MS, 310 * MS, 302 * MS],  # a stolen-CPU hiccup
    ],
)
def test_outlier_step_in_baseline_does_not_hide_a_3x_slowdown(base: list[float]) -> None:
    cur = [900 * MS, 930 * MS, 915 * MS, 905 * MS][: len(base)]
    assert not _old_rule_flags(cur, base, 0.25)  # the flake: one step widened the band
    c = _step(cur, base)
    assert c.regression, c
    assert c.delta > 1.9 and c.noise is not None and c.noise < c.delta / 4
    assert c.base == statistics.median(base)


def test_outlier_step_in_current_run_is_not_a_regression() -> None:
    """The same configuration with one hiccup step: the median does not move."""
    base = [100.0, 101.0, 99.0, 100.5, 102.0]
    cur = [100.0, 400.0, 99.5, 101.0, 100.0]
    c = _step(cur, base, limit=0.05)
    assert not c.regression and abs(c.delta) < 0.01


def test_change_within_genuine_noise_is_not_flagged() -> None:
    """Steps that really vary by ~±30%: a +30% median shift is above the 25% limit but not
    beyond the noise of 5 steps, so it is not called a regression."""
    base = [70.0, 100.0, 130.0, 85.0, 115.0]
    cur = [95.0, 130.0, 165.0, 110.0, 150.0]
    c = _step(cur, base)
    assert c.delta == pytest.approx(0.30)
    assert c.noise is not None and c.delta < c.noise
    assert not c.regression


def test_same_shift_with_quiet_steps_is_flagged() -> None:
    """The counterpart: the same +30% with ±2% step-to-step noise is a regression."""
    base = [98.0, 100.0, 102.0, 99.0, 101.0]
    c = _step([v * 1.3 for v in base], base)
    assert c.regression and c.delta == pytest.approx(0.30)


def test_identical_distributions_are_not_flagged() -> None:
    base = [100.0, 180.0, 95.0, 110.0, 105.0]
    c = _step(list(reversed(base)), base, limit=0.0)
    assert c.delta == 0.0 and not c.regression


def test_share_metrics_compare_absolute_points() -> None:
    base = [0.10, 0.11, 0.09, 0.60]  # one step with a 60% exposed share (a stall)
    cur = [0.30, 0.31, 0.29, 0.30]
    c = baseline.judge("exposed_comm", "dp", 2, cur, base, 0.05)
    assert c.regression and c.delta == pytest.approx(0.30 - 0.105)


def test_rank_whose_steps_agree_by_chance_gets_the_runs_noise() -> None:
    """Comm share per step on 4 gloo ranks, two captures of one configuration (values as
    measured on a busy 2-core host). Rank 3's 3 steps happen to agree closely in both runs, so
    its own band is narrow; the other ranks show the run's real noise, and that is the floor."""
    base = {
        (0, "DP"): [0.84, 0.54, 0.65],
        (1, "DP"): [0.71, 0.77, 0.48],
        (2, "DP"): [0.49, 0.58, 0.80],
        (3, "DP"): [0.50, 0.52, 0.80],
    }
    cur = {
        (0, "DP"): [0.52, 0.64, 0.43],
        (1, "DP"): [0.86, 0.39, 0.83],
        (2, "DP"): [0.29, 0.36, 0.80],
        (3, "DP"): [0.84, 0.85, 0.40],
    }
    alone = baseline.judge("comm_share", "DP", 3, cur[3, "DP"], base[3, "DP"], 0.25)
    assert alone.regression and alone.delta == pytest.approx(0.32)  # the false alarm
    floor = (baseline.spread_floors(cur)["DP"], baseline.spread_floors(base)["DP"])
    c = baseline.judge("comm_share", "DP", 3, cur[3, "DP"], base[3, "DP"], 0.25, floor)
    assert c.noise is not None and c.noise > c.delta and not c.regression
    # The floor never narrows a band: ranks noisier than the typical one keep their own.
    wide = baseline.judge("comm_share", "DP", 0, cur[0, "DP"], base[0, "DP"], 0.25, floor)
    own = baseline.judge("comm_share", "DP", 0, cur[0, "DP"], base[0, "DP"], 0.25)
    assert wide.noise is not None and own.noise is not None and wide.noise >= own.noise


def test_robust_sd() -> None:
    """Normal-like steps: close to the sample sd. One wild step: barely moved. One step:
    no spread, and the noise is reported as not measurable (the threshold alone decides)."""
    steps = [98.0, 101.0, 100.0, 103.0, 99.0, 102.0]
    sd = baseline.robust_sd(steps)
    assert sd is not None and sd == pytest.approx(statistics.stdev(steps), rel=0.5)
    wild = baseline.robust_sd([*steps[:-1], 1000.0])
    assert wild is not None and wild < 2 * sd
    assert baseline.robust_sd([100.0]) is None
    c = _step([200.0], [100.0])
    assert c.noise is None and c.regression


def test_a_share_that_rose_because_the_step_got_shorter_is_not_a_regression() -> None:
    """Exposed comm 20 ms in a 100 ms step, then the same 20 ms in a 70 ms step (compute got
    faster): its share rose 8.6 points, past a 5% limit, but its time did not grow."""
    base_t = ([20 * MS] * 5, [100 * MS] * 5)
    cur_t = ([20 * MS] * 5, [70 * MS] * 5)
    share = ([20 / 70] * 5, [0.20] * 5)
    alone = baseline.judge("exposed_comm", "DP", 0, *share, 0.05)
    assert alone.regression and alone.delta == pytest.approx(20 / 70 - 0.20)  # the old verdict
    c = baseline.judge("exposed_comm", "DP", 0, *share, 0.05, times=(cur_t, base_t))
    assert not c.regression and c.time_delta == pytest.approx(0.0)
    assert c.delta == alone.delta  # the share it reports is unchanged


def test_a_share_whose_time_grew_is_a_regression() -> None:
    """Exposed comm 20 -> 28 ms in a step that stayed 100 ms: +8% of the baseline's step in
    share and in time. Growth within the time's own noise, or below the limit, is not."""
    base_t = ([20 * MS] * 5, [100 * MS] * 5)
    grown = ([28 * MS] * 5, [100 * MS] * 5)
    share = ([0.28] * 5, [0.20] * 5)
    c = baseline.judge("exposed_comm", "DP", 0, *share, 0.05, times=(grown, base_t))
    assert c.regression and c.time_delta == pytest.approx(0.08)
    # The step got shorter (80 ms) and the time grew 2 ms: the share rose 10 points, but the
    # added time is 2% of the baseline's step, under the 5% limit.
    small = ([22 * MS] * 5, [80 * MS] * 5)
    c = baseline.judge(
        "exposed_comm", "DP", 0, [0.275] * 5, [0.20] * 5, 0.05, times=(small, base_t)
    )
    assert not c.regression and c.time_delta == pytest.approx(0.02)
    # +8 ms on the median, but the time varies ±15 ms from step to step in both runs.
    noisy_b = ([5 * MS, 35 * MS, 20 * MS, 8 * MS, 32 * MS], [100 * MS] * 5)
    noisy_c = ([13 * MS, 43 * MS, 28 * MS, 16 * MS, 40 * MS], [100 * MS] * 5)
    c = baseline.judge("exposed_comm", "DP", 0, *share, 0.05, times=(noisy_c, noisy_b))
    assert c.time_delta == pytest.approx(0.08) and not c.regression


def test_time_growth_without_a_baseline_step_leaves_the_share_verdict() -> None:
    assert baseline.time_growth(([1.0], [1.0]), ([1.0], [0.0])) is None
    share = ([0.30] * 3, [0.20] * 3)
    c = baseline.judge(
        "comm_share", "TP", 1, *share, 0.05, times=(([1.0] * 3, [1.0] * 3), ([], []))
    )
    assert c.regression and c.time_delta is None


def _exposed(waits_ms: dict[int, float]) -> dict[tuple[int, str], list[float]]:
    """(rank, "DP") -> 5 steps of exposed comm share in a 100 ms step, with a little jitter."""
    return {
        (r, "DP"): [(w + j) / 100 for j in (-0.2, 0.1, 0.0, 0.2, -0.1)] for r, w in waits_ms.items()
    }


def _times(waits_ms: dict[int, float]) -> dict[tuple[int, str], baseline.Times]:
    return {
        (r, "DP"): ([(w + j) * MS for j in (-0.2, 0.1, 0.0, 0.2, -0.1)], [100 * MS] * 5)
        for r, w in waits_ms.items()
    }


def _judged(cur: dict[int, float], base: dict[int, float]) -> list[baseline.Change]:
    times = (_times(cur), _times(base))
    return baseline.judge_runs("exposed_comm", _exposed(cur), _exposed(base), 0.05, times)


def test_who_waits_changing_is_offset_not_a_regression() -> None:
    """Rank 0 was the straggler (it never waited; ranks 1-3 waited 15 ms for it), now rank 1
    is (ranks 0, 2, 3 wait 15 ms): rank 0's exposed comm rose 15 points, rank 1's fell as
    much, the step is as long as before. Each rank alone is beyond the limit and the noise."""
    changes = _judged({0: 15, 1: 0, 2: 15, 3: 15}, {0: 0, 1: 15, 2: 15, 3: 15})
    by = {c.rank: c for c in changes}
    assert by[0].delta == pytest.approx(0.15) and by[1].delta == pytest.approx(-0.15)
    assert by[0].offset and not by[0].regression
    assert not any(c.regression for c in changes)
    assert baseline.summarize(changes) == []
    (moved,) = baseline.summarize(changes, offset=True)
    assert moved.startswith("DP exposed comm +15.0% of step on ranks 0 (noise ±")
    v = baseline.verdict(changes, 0.05, "flag")
    assert v.status == "pass" and "who waits changed" in v.message and "ranks 0" in v.message


@pytest.mark.parametrize(
    ("cur", "regressed"),
    [
        ({0: 15, 1: 15, 2: 15, 3: 15}, [0]),  # one rank's rise, nothing fell: kept
        ({0: 30, 1: 30, 2: 30, 3: 30}, [0, 1, 2, 3]),  # every rank waits 15 ms more
        # rank 0 rose 40 points, rank 1 fell 15: the net (+25) keeps more than half the rise
        ({0: 40, 1: 0, 2: 15, 3: 15}, [0]),
    ],
)
def test_rises_that_falls_do_not_offset_stay_regressions(
    cur: dict[int, float], regressed: list[int]
) -> None:
    changes = _judged(
        cur, {0: 0, 1: 15, 2: 15, 3: 15} if regressed == [0] else dict.fromkeys(range(4), 15.0)
    )
    assert sorted(c.rank for c in changes if c.regression) == regressed
    assert not any(c.offset for c in changes)
