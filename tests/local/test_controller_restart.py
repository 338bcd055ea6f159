"""Persistence and restart: the SQLite file restores every job, switches are reconciled, agents keep training;
a second controller with a lower election id cannot write."""
from __future__ import annotations

import sqlite3
import time

import grpc
import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.core import Controller, Refusal
from inaproto import admission_pb2 as pb
from inaproto import wire
from tests.support.admission import register
from tests.support.frames import grant_gradient, parse_result
from topologies.loopback import LocalControlPlane, worker

TABLES = ("MyIngress.ina_job", "MyEgress.ina_worker", "MyIngress.ipv4_lpm")


@pytest.fixture
def h(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as harness:
        yield harness




def switch_state(h, name="s1"):
    sw = h.switches[name]
    return {t: sw.entries(t) for t in TABLES}, dict(sw.pipeline.multicast_groups)


def without_generations(state):
    """The switch state with the generation of every ina_job entry blanked out."""
    tables, groups = state
    tables = dict(tables)
    tables["MyIngress.ina_job"] = {m: (a, p[:5]) for m, (a, p) in tables["MyIngress.ina_job"].items()}
    return tables, groups


def job_generations(state):
    return {m[0]: p[5] for m, (_, p) in state[0]["MyIngress.ina_job"].items()}


def grants(h):
    return {j.job_id: j.grant.SerializeToString() for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs}


def send(h, grant, i, host, chunk, lanes):
    frame = grant_gradient(h.host(host, 40000 + i), grant, i, chunk % grant.switches[0].num_slots, lanes, seq=chunk)
    return h.switches["s1"].send(h.topology.hosts[host].port, frame)


def test_restart_restores_jobs_and_training_continues(h):
    a = register(h, "a", ["h11", "h12"], requested=8)
    b = register(h, "b", ["h13", "h14"], requested=16)  # gets the 8 left
    lanes = np.arange(wire.LANES, dtype=np.int32)
    assert send(h, a, 0, "h11", 0, lanes) == []  # half of chunk 0 aggregated in the switch
    before_grants, before_switch = grants(h), switch_state(h)

    h.restart_controller()

    assert grants(h) == before_grants  # same ids, generations, ranges: agents need not resync
    assert switch_state(h) == before_switch
    out = send(h, a, 1, "h12", 0, 2 * lanes)  # the switch kept its registers: no pipeline push
    assert len(out) == 2 and all(np.array_equal(parse_result(f)[1], 3 * lanes) for _, f in out)
    # job ids and generations keep counting where they were
    c = h.stub.RegisterJob(pb.RegisterJobRequest(
        name="c", workers=[pb.Worker(worker_id=0, host="s1-p5", ip="10.0.9.9", mac="02:00:00:00:09:09", udp_port=4000)],
        tensor_elements=10, requested_slots=1))
    assert c.job_id == 3 and c.generation not in (a.generation, b.generation)
    info = h.stub.GetJob(pb.GetJobRequest(job_id=b.job_id))
    assert info.state == "running" and info.request.name == "b" and info.last_heartbeat > 0


def test_restart_reconciles_deleted_altered_and_stray_entries(h):
    register(h, "a", ["h11", "h12"], requested=8)
    b = register(h, "b", ["h13", "h14"], requested=8)
    before = switch_state(h)
    h.stop_controller()
    p = h.switches["s1"].pipeline
    p.delete_entry("MyIngress.ina_job", (1,))
    p.modify_entry("MyIngress.ina_job", (b.job_id,), "MyIngress.set_job", (0, 16, 0b11, 2, 3, 999, 0))
    p.delete_entry("MyEgress.ina_worker", (b.job_id, 1))
    p.insert_entry("MyIngress.ina_job", (77,), "MyIngress.set_job", (0, 4, 1, 1, 78, 1, 0))
    p.set_multicast_group(78, [(9, 0)])
    p.delete_multicast_group(2)
    p.delete_entry("MyIngress.ipv4_lpm", ((0x0A000101, 32),))
    assert switch_state(h) != before

    h.start_controller()
    after = switch_state(h)
    assert without_generations(after) == without_generations(before)
    # Both jobs' entries were repaired: their slot state cannot be trusted, so they get new generations
    # (the data plane resets the slots, the agents resynchronise) and the grants say so.
    old, new = job_generations(before), job_generations(after)
    assert set(new) == {1, b.job_id} and all(new[j] != old[j] for j in new)
    assert {j.job_id: j.grant.generation for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs} == new


def test_restart_after_the_switch_lost_everything_pushes_and_reinstalls(h):
    a = register(h, "a", ["h11", "h12"], requested=8)
    before = switch_state(h)
    h.stop_controller()
    h.switches["s1"].restart()  # empty switch, no pipeline
    h.start_controller()
    after = switch_state(h)
    assert without_generations(after) == without_generations(before)
    assert job_generations(after)[a.job_id] != a.generation  # registers were lost: a new generation


def test_running_controller_reinstalls_a_restarted_switch(h):
    register(h, "a", ["h11", "h12"], requested=8)
    before = switch_state(h)
    h.switches["s1"].restart()
    deadline = time.monotonic() + 10
    while without_generations(switch_state(h)) != without_generations(before):
        assert time.monotonic() < deadline, "the controller did not reinstall the restarted switch"
        time.sleep(0.05)


def test_crash_after_switch_write_before_persist_rolls_back_on_restart(h, monkeypatch):
    a = register(h, "a", ["h11", "h12"], requested=8)
    before_grants, before_switch = grants(h), switch_state(h)

    def killed(*args, **kwargs):
        raise SystemExit("kill -9")

    monkeypatch.setattr(h.controller.store, "save", killed)
    with pytest.raises(SystemExit):
        h.controller.register(pb.RegisterJobRequest(name="b", workers=[worker(0, "h13")], tensor_elements=100, requested_slots=4))
    assert (1 + a.job_id,) in h.switches["s1"].entries("MyIngress.ina_job")  # written, never persisted
    monkeypatch.undo()

    h.restart_controller()
    assert grants(h) == before_grants  # the unconfirmed job never existed for any agent
    assert switch_state(h) == before_switch


def test_crash_after_persist_before_agents_heard_keeps_the_new_grant(h, monkeypatch):
    a = register(h, "a", ["h11", "h12"], requested=16)
    b = register(h, "b", ["h13", "h14"], requested=8)
    assert b.backend == "ring"
    monkeypatch.setattr(h.controller, "_publish", lambda *args: (_ for _ in ()).throw(SystemExit("kill -9")))
    with pytest.raises(SystemExit):
        h.controller.release(a.job_id)
    monkeypatch.undo()
    state = switch_state(h)

    h.restart_controller()
    assert switch_state(h) == state
    watch = h.stub.WatchJob(pb.WatchJobRequest(job_id=b.job_id), timeout=5)
    first = next(watch)  # a reconnecting agent gets the current grant first
    assert first.grant.backend == "ina" and first.grant.switches[0].num_slots == 8
    watch.cancel()


def test_a_completed_barrier_survives_a_restart(h):
    """Worker 0 got its SyncGeneration answer, worker 1's was lost in the crash: after the restart
    worker 1 asks again and gets the same answer, without worker 0 having to come back."""
    import threading

    g = register(h, "a", ["h11", "h12"], requested=8)
    answers = {}

    def call(i, chunk):
        answers[i] = h.stub.SyncGeneration(pb.SyncGenerationRequest(
            job_id=g.job_id, worker_id=i, generation=g.generation, first_missing_chunk=chunk), timeout=5).resume_chunk

    t = threading.Thread(target=call, args=(0, 12))
    t.start()
    call(1, 9)
    t.join(5)
    assert answers == {0: 9, 1: 9}
    h.restart_controller()
    call(1, 9)
    assert answers[1] == 9


def test_policy_and_counters_persist_in_sqlite_wal(h, tmp_path):
    h.stub.SetPolicy(pb.SetPolicyRequest(policy="weighted"))
    register(h, "a", ["h11"], requested=4)
    db = sqlite3.connect(tmp_path / "ctl.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(db.execute("SELECT key, value FROM meta"))
    assert meta["policy"] == "weighted" and meta["next_job_id"] == "2"
    assert db.execute("SELECT job_id, switch, base, size FROM grants").fetchall() == [(1, "s1", 0, 4)]
    db.close()
    h.restart_controller(policy="first-fit")  # the stored policy wins over the option
    assert h.stub.GetPolicy(pb.GetPolicyRequest()).policy == "weighted"


def test_second_controller_with_lower_election_id_cannot_write(h, tmp_path):
    register(h, "a", ["h11", "h12"], requested=8)
    before = switch_state(h)
    other = Controller(h.topology, ControllerConfig(db_path=tmp_path / "other.db", election_id=(0, 5), connect_timeout=2))
    with pytest.raises(Refusal) as err:
        other.start()
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "another controller is primary" in err.value.message
    assert switch_state(h) == before
    assert register(h, "b", ["h13"], requested=4).backend == "ina"  # the primary still writes


def test_restart_with_a_changed_pool_reallocates(h):
    a = register(h, "a", ["h11", "h12"], requested=16)
    b = register(h, "b", ["h13", "h14"], requested=16)
    assert b.backend == "ring"
    h.stop_controller()
    h.doc["switches"]["s1"]["pool"] = 32
    from controller.topology import Topology

    h.topology = Topology.from_dict(h.doc)
    h.start_controller()
    jobs = {j.job_id: j.grant for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs}
    assert jobs[a.job_id].generation == a.generation  # untouched
    assert jobs[b.job_id].backend == "ina" and "controller restarted" in jobs[b.job_id].reason
