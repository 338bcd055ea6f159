"""The rina experiment offline: framed ideal ratios, and summary, report and plot from recorded rows."""
from __future__ import annotations

import pytest

from topologies.experiments.rina import RinaConfig, RinaExperiment, framed_ideal_ina_ratio, framed_ideal_ratio


def test_framed_ideal_ratios_match_docs_experiments():
    assert framed_ideal_ratio(2, 4, 2) == pytest.approx(0.77, abs=0.005)
    assert framed_ideal_ratio(4, 2, 4) == pytest.approx(1.15, abs=0.005)
    # host members: partitions sized by hop costs (continuous shares, or whole slots), runs between host members
    assert framed_ideal_ratio(2, 4, 1) == pytest.approx(1.02, abs=0.005)
    assert framed_ideal_ratio(2, 4, 1, slots=8) == pytest.approx(1.06, abs=0.005)
    assert framed_ideal_ratio(2, 4, 1, slots=33) == pytest.approx(1.03, abs=0.005)
    assert framed_ideal_ratio(4, 2, 2) == pytest.approx(1.15, abs=0.005)
    assert framed_ideal_ratio(4, 2, 2, slots=8) == pytest.approx(1.25, abs=0.005)
    assert framed_ideal_ratio(4, 2, 2, slots=16) == pytest.approx(1.20, abs=0.005)
    assert framed_ideal_ratio(2, 4, 1, 0.5) == pytest.approx(1.02, abs=0.005)
    assert framed_ideal_ratio(2, 4, 0) == 1.0
    assert framed_ideal_ratio(2, 4, 2, 0.5) == pytest.approx(framed_ideal_ratio(2, 4, 2))
    assert framed_ideal_ina_ratio(8) == pytest.approx(0.77, abs=0.005)


def _row(run, backend, seconds, frac=None):
    return {"kind": "rina", "layout": "2x4", "racks": 2, "per_rack": 4, "run": run, "backend": backend,
            "ina_fraction": frac, "seconds_median": seconds, "elements": 4096, "retransmits": 8,
            "granted_backend": [backend], "exact": True}


def test_summary_report_and_plot(tmp_path):
    cfg = RinaConfig(layouts=((2, 4),), ina_fractions=(1.0, 0.5), elements=4096, iterations=2)
    rows = [_row("leafspine-2ina", "rina", 0.8, 1.0), _row("leafspine-1ina", "rina", 1.3, 0.5),
            _row("leafspine-ring", "ring", 1.0), _row("star", "ina", 0.79)]
    summary = RinaExperiment.summarize(rows, cfg)
    (p,) = summary["points"]
    assert p["ring_s"] == 1.0 and p["ina_s"] == 0.79
    full, half = p["rina"]
    assert full["ina_fraction"] == 1.0 and full["ratio_to_ring"] == pytest.approx(0.8)
    assert full["retransmits_per_chunk"] == pytest.approx(8 / (128 * 8 * 3))
    assert half["framed_ideal_ratio"] == pytest.approx(1.02, abs=0.005)
    lines = RinaExperiment.report(summary)
    assert lines[0].startswith("2x4: ring 1000 ms") and "framed ideal 0.77" in lines[1]
    RinaExperiment.plot(rows, summary, cfg, tmp_path / "rina.png")
    assert (tmp_path / "rina.png").stat().st_size > 0


def test_summary_of_repetitions_takes_medians_with_spread():
    cfg = RinaConfig(layouts=((2, 4),), ina_fractions=(0.5,), elements=4096, iterations=2, repetitions=3)
    rows = []
    for rep, (ring, rina) in enumerate([(1.0, 1.2), (1.1, 1.1), (0.9, 1.8)]):
        rows += [dict(_row("leafspine-ring", "ring", ring), repetition=rep),
                 dict(_row("leafspine-1ina", "rina", rina, 0.5), repetition=rep, granted_backend=["ina"])]
    (p,) = RinaExperiment.summarize(rows, cfg)["points"]
    assert p["ring_s"] == 1.0 and p["ring_spread_s"] == (0.9, 1.1) and p["ina_s"] is None
    (half,) = p["rina"]
    assert half["seconds"] == 1.2 and half["spread_s"] == (1.1, 1.8) and half["repetitions"] == 3
    assert half["ratio_to_ring"] == pytest.approx(1.2)
    assert half["ratio_to_ring_spread"] == pytest.approx((1.0, 2.0))
    assert half["granted_backend"] == "ina" and half["exact"] is True
    assert half["retransmits_per_chunk"] == pytest.approx(8 / (128 * 8 * 3))
    assert "(1.00-2.00)" in RinaExperiment.report({"points": [p]})[1]


def test_cpu_per_call_from_the_agents_reports_and_its_medians():
    from topologies.experiments.rina import cpu_per_call

    workers = [{"cpu_seconds": 2.0}, {"cpu_seconds": 4.0, "host_copy_cpu_seconds": 1.0},
               {"cpu_seconds": 6.0, "host_copy_cpu_seconds": 3.0}]
    assert cpu_per_call(workers, 4) == {"agents_cpu_s_per_call": 3.0, "host_copies_cpu_s_per_call": 1.0}
    assert cpu_per_call([{"cpu_seconds": 8.0}], 4) == {"agents_cpu_s_per_call": 2.0}
    cfg = RinaConfig(layouts=((2, 4),), ina_fractions=(0.5,), elements=4096, iterations=2, repetitions=3)
    rows = []
    for rep, cpu in enumerate([5.0, 7.0, 6.0]):
        rows += [dict(_row("leafspine-ring", "ring", 1.0), repetition=rep, agents_cpu_s_per_call=2.0),
                 dict(_row("leafspine-1ina", "rina", 1.2, 0.5), repetition=rep, agents_cpu_s_per_call=cpu,
                      host_copies_cpu_s_per_call=cpu / 4)]
    (p,) = RinaExperiment.summarize(rows, cfg)["points"]
    assert p["ring_agents_cpu_s_per_call"] == 2.0
    (half,) = p["rina"]
    assert half["agents_cpu_s_per_call"] == 6.0 and half["host_copies_cpu_s_per_call"] == 1.5
    lines = RinaExperiment.report({"points": [p]})
    assert "agents' CPU 2.0 s/call" in lines[0] and "agents' CPU 6.0 s/call (copies 1.5)" in lines[1]
