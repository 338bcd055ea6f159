"""Simulator traces: CSV round trip and errors, the synthetic generator, Philly/Helios job-log readers."""
from __future__ import annotations

import itertools
import json

import pytest

from simulator.trace import (
    COLUMNS,
    JobSpec,
    SyntheticConfig,
    TraceError,
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


def test_philly_job_log(tmp_path):
    log = [
        {"jobid": "a", "status": "Pass", "submitted_time": "2017-10-03 02:45:27", "user": "u",
         "attempts": [{"start_time": "2017-10-03 02:46:00", "end_time": "2017-10-03 03:46:00",
                       "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}, {"ip": "m2", "gpus": ["gpu0", "gpu1"]}]}]},
        {"jobid": "b", "status": "Failed", "submitted_time": "2017-10-03 02:45:37", "user": "u",
         "attempts": [{"start_time": None, "end_time": None, "detail": []}]},
        {"jobid": "c", "status": "Killed", "submitted_time": "2017-10-03 02:47:27", "user": "u",
         "attempts": [{"start_time": "2017-10-03 02:50:00", "end_time": "2017-10-03 02:51:00",
                       "detail": [{"ip": "m3", "gpus": ["gpu3"]}]}]},
    ]
    path = tmp_path / "cluster_job_log.json"
    path.write_text(json.dumps(log))
    jobs, skipped = read_job_log(path, seed=1)
    assert skipped == 1
    assert [(j.arrival_s, j.num_workers) for j in jobs] == [(0.0, 4), (120.0, 1)]
    assert jobs[0].iterations == round(3600 / jobs[0].compute_s[0])
    assert read_job_log(path, seed=1) == (jobs, 1)


def test_helios_style_csv_job_log(tmp_path):
    path = tmp_path / "cluster_log.csv"
    path.write_text(
        "job_id,user,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
        "j1,u,8,32,1,COMPLETED,2020-04-01 00:00:10,2020-04-01 00:00:20,2020-04-01 01:00:20,3600,10\n"
        "j2,u,0,4,1,COMPLETED,2020-04-01 00:00:11,2020-04-01 00:00:20,2020-04-01 00:10:20,600,9\n"
        "j3,u,2,8,1,FAILED,2020-04-01 00:01:10,2020-04-01 00:01:20,2020-04-01 00:11:20,,10\n"
    )
    jobs, skipped = read_job_log(path, fmt="helios")
    assert skipped == 1  # no GPUs
    assert [(j.arrival_s, j.num_workers) for j in jobs] == [(0.0, 8), (60.0, 2)]
    assert jobs[1].iterations == round(600 / jobs[1].compute_s[0])  # from start/end when duration is empty


def test_unreadable_job_log_says_what_it_needs(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="need a submit time"):
        read_job_log(path)
