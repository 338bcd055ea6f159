"""Simulator traces: CSV round trip and errors, the synthetic generator, Philly/Helios job-log readers."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from simulator.trace import (
    COLUMNS,
    JobSpec,
    SyntheticConfig,
    TraceError,
    TraceFormat,
    generate_trace,
    interarrival_for_load,
    read_job_log,
    read_trace,
    write_trace,
)


def test_csv_round_trip_keeps_every_field(tmp_path):
    jobs = [
        JobSpec(0, 0.0, 4, 102_228_128, 500, (0.1,)),
        JobSpec(1, 12.345678901, 3, 5, 7, (0.1, 0.2000001, 1 / 3), priority=2, deadline_s=99.5, slots=64,
                min_slots=8, weight=2.5, model="bert-base"),
    ]
    generated = generate_trace(SyntheticConfig(num_jobs=50, hetero=0.5), seed=4)
    path = tmp_path / "trace.csv"
    write_trace(path, jobs + [JobSpec(**{**j.__dict__, "job_id": j.job_id + 10}) for j in generated])
    back = read_trace(path)
    assert back[:2] == jobs
    assert back[2:] == [JobSpec(**{**j.__dict__, "job_id": j.job_id + 10}) for j in generated]
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)


def test_optional_columns_may_be_left_out(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n7,1.5,2,1000,10,0.25\n")
    assert read_trace(path) == [JobSpec(7, 1.5, 2, 1000, 10, (0.25,))]


@pytest.mark.parametrize(
    "text, message",
    [
        ("job_id,arrival_s\n", "missing column"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s,deadline\n", "unknown column"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,0,two,1,1,0.1\n", ":2: column 'num_workers'"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,0,2,1,1,\n", ":2: column 'compute_s' is empty"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,0,3,1,1,0.1;0.2\n", "one per worker"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,0,2,1,1,0.1\n1,0,2,1,1,0.1\n", ":3: duplicate job_id"),
        ("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,-5,2,1,1,0.1\n", "arrival_s"),
    ],
)
def test_bad_traces_name_the_line_and_field(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_missing_trace_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.csv")


def test_generator_is_deterministic_and_follows_its_parameters():
    cfg = SyntheticConfig(num_jobs=2000, mean_interarrival_s=10.0, deadline_fraction=0.5)
    a, b, c = generate_trace(cfg, 1), generate_trace(cfg, 1), generate_trace(cfg, 2)
    assert a == b and a != c
    gaps = [y.arrival_s - x.arrival_s for x, y in itertools.pairwise(a)]
    assert sum(gaps) / len(gaps) == pytest.approx(10.0, rel=0.1)  # Poisson arrivals at the asked rate
    assert {j.num_workers for j in a} <= {1, 2, 4, 8, 16, 32}
    assert sum(j.deadline_s is not None for j in a) / len(a) == pytest.approx(0.5, abs=0.05)
    assert all(cfg.iterations_min <= j.iterations <= cfg.iterations_max for j in a)
    hetero = generate_trace(SyntheticConfig(num_jobs=20, hetero=1.0), 1)
    assert all(len(j.compute_s) == j.num_workers for j in hetero)


def test_interarrival_for_load_scales_with_cluster_and_load():
    cfg = SyntheticConfig()
    base = interarrival_for_load(cfg, 512, 0.8)
    assert interarrival_for_load(cfg, 1024, 0.8) == pytest.approx(base / 2)
    assert interarrival_for_load(cfg, 512, 0.4) == pytest.approx(base * 2)


def test_generator_rejects_nonsense():
    with pytest.raises(ValueError, match="unknown model"):
        SyntheticConfig(models=(("alexnet", 1.0),))
    with pytest.raises(ValueError, match="deadline_fraction"):
        SyntheticConfig(deadline_fraction=2)


DATA = Path(__file__).with_name("data")


def test_philly_cluster_job_log():
    """A fixture written to Philly's published schema (msr-fiddle/philly-traces, README): GPUs are the most any
    attempt held over its machines, run time the attempts' sum; no attempt, or no end time, is no run."""
    jobs, skipped = read_job_log(DATA / "philly_cluster_job_log.json", TraceFormat.PHILLY, seed=1)
    assert skipped == 2  # a job without attempts, and one still running (end_time null)
    assert [(j.arrival_s, j.num_workers) for j in jobs] == [(0.0, 16), (120.0, 2), (153.0, 4)]
    run = [j.iterations * j.compute_s[0] for j in jobs]
    assert run == pytest.approx([3600, 210, 1800], rel=0.01)  # iterations of the drawn model's compute time
    assert read_job_log(DATA / "philly_cluster_job_log.json", TraceFormat.PHILLY, seed=1) == (jobs, 2)
    assert read_job_log(DATA / "philly_cluster_job_log.json", TraceFormat.PHILLY, seed=1, max_jobs=2)[0] == jobs[:2]


def test_helios_cluster_log():
    """A fixture written to Helios' published schema (S-Lab-System-Group/HeliosData, README): CPU-only jobs and
    jobs that never ran are left out."""
    jobs, skipped = read_job_log(DATA / "helios_cluster_log.csv", TraceFormat.HELIOS, seed=1)
    assert skipped == 2
    assert [(j.arrival_s, j.num_workers) for j in jobs] == [(0.0, 8), (60.0, 16), (180.0, 2)]
    run = [j.iterations * j.compute_s[0] for j in jobs]
    assert run == pytest.approx([3600, 300, 86400], rel=0.01)


def test_a_job_log_not_in_its_schema_is_refused(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="missing column.*gpu_num"):
        read_job_log(path, TraceFormat.HELIOS)
    path.write_text('{"jobs": []}')
    with pytest.raises(TraceError, match="JSON list"):
        read_job_log(path, TraceFormat.PHILLY)
    path.write_text('[{"jobid": "a", "attempts": [{"start_time": "2017-10-03", "end_time": "x", "detail": []}]}]')
    with pytest.raises(TraceError, match="job 0"):
        read_job_log(path, TraceFormat.PHILLY)
