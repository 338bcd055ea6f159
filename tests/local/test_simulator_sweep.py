"""ina-sim sweep: a grid of runs on any concurrent.futures executor (serially, on local processes, on a Dask
cluster) gives the same tables; one table and plot per swept setting, confidence intervals over seeds."""
from __future__ import annotations

import concurrent.futures
import csv
from pathlib import Path

import pytest

from inaproto.config import ConfigError, load
from simulator.cli import main
from simulator.sweep import SweepConfig, points, run_sweep, tables

GRID = """
out = "{out}"
metrics = ["mean_jct_s", "p99_jct_s", "slot_utilisation"]

[base.cluster]
racks = 4
slots_per_switch = 512

[base.workload]
num_jobs = 30
iterations_median = 200.0

[grid]
policy = ["first-fit", "weighted"]
"cluster.slots_per_switch" = [128, 1024]
seed = [1, 2, 3]
"""


def grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(out=tmp_path / "sweep"))
    return path


def test_a_sweep_on_a_dask_cluster_gives_the_serial_tables(tmp_path):
    distributed = pytest.importorskip("distributed")
    sweep = load(SweepConfig, grid(tmp_path))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as serial:
        expected = run_sweep(sweep, serial)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        on_dask = run_sweep(sweep, client.get_executor())
    assert on_dask == expected and len(expected) == 12
    assert tables(sweep, on_dask) == tables(sweep, expected)


def test_one_table_per_swept_setting_with_intervals_over_seeds(tmp_path):
    sweep = load(SweepConfig, grid(tmp_path))
    assert [p.config.cluster.slots_per_switch for p in points(sweep)][:3] == [128, 128, 128]  # the seeds vary fastest
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as serial:
        by = tables(sweep, run_sweep(sweep, serial))
    assert set(by) == {"policy", "cluster.slots_per_switch"}
    for table in by.values():
        assert len(table) == 4 and all(row["seeds"] == 3 and row["mean_jct_s_ci"] >= 0 for row in table)
    pools = [row["cluster.slots_per_switch"] for row in by["cluster.slots_per_switch"]]
    assert pools == [128, 1024, 128, 1024]  # each line of the plot in order of the swept setting


def test_sweep_command_writes_tables_and_plots(tmp_path, capsys):
    assert main(["sweep", str(grid(tmp_path)), "--processes", "2"]) == 0
    out = tmp_path / "sweep"
    names = {p.name for p in out.iterdir()}
    assert {"points.csv", "by_policy.csv", "by_cluster_slots_per_switch.csv", "by_policy.png",
            "by_cluster_slots_per_switch.png"} <= names
    rows = list(csv.DictReader((out / "points.csv").read_text().splitlines()))
    assert len(rows) == 12 and {r["policy"] for r in rows} == {"first-fit", "weighted"}
    assert "12 runs" in capsys.readouterr().out


def test_the_grid_is_checked_against_the_configuration(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text('[grid]\n"cluster.slot" = [1, 2]\n')
    with pytest.raises(ConfigError, match="cluster.slot.*not a setting"):
        load(SweepConfig, path)
    path.write_text('[grid]\n"cluster.racks" = [0]\n')
    assert main(["sweep", str(path)]) == 2
    assert "racks" in capsys.readouterr().err


def test_the_trees_example_is_a_grid_of_24_points():
    sweep = load(SweepConfig, Path(__file__).resolve().parents[2] / "examples" / "sim_trees.toml")
    fabrics = {(p.config.cluster.spine_slots, p.config.cluster.ina_fraction) for p in points(sweep)}
    assert len(list(points(sweep))) == 24 and fabrics == {(1024, 1.0), (0, 1.0), (1024, 0.0), (0, 0.0)}
