"""Admission service end to end: controller + ina-switch's P4Runtime server + pipeline, all in process.

Entries are read back from the pipeline itself; aggregation uses real frames through ``pipeline.process``.
"""
from __future__ import annotations

import ipaddress
import threading
import time

import grpc
import numpy as np
import pytest

from inaproto import admission_pb2 as pb
from inaproto import wire
from tests.support.admission import register
from tests.support.frames import grant_gradient, parse_result
from topologies.loopback import LocalControlPlane

STALE = wire.DropReason.STALE_GENERATION


@pytest.fixture
def h(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as harness:
        yield harness




def mac_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def ip_int(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


class Job:
    """A job's workers sending chunks SwitchML's way: chunk k in slot k mod S, shadow (k div S) mod 2."""

    def __init__(self, h: LocalControlPlane, grant: pb.JobGrant, hosts: list[str]):
        self.h, self.grant = h, grant
        self.hosts = hosts
        self.ports = [h.topology.hosts[x].port for x in hosts]
        self.sw = h.switches[grant.switches[0].switch]

    def addr(self, i):
        return self.h.host(self.hosts[i], 40000 + i)

    def send(self, i: int, chunk: int, lanes, generation: int | None = None) -> list[tuple[int, bytes]]:
        s = self.grant.switches[0].num_slots
        frame = grant_gradient(self.addr(i), self.grant, i, chunk % s, lanes, seq=chunk, shadow=(chunk // s) % 2, generation=generation)
        return self.sw.send(self.ports[i], frame)

    def chunk(self, chunk: int, data: np.ndarray, workers=None) -> dict[int, np.ndarray]:
        """Every (listed) worker sends its lanes of `chunk`; returns worker -> result lanes received."""
        out = []
        for i in workers if workers is not None else range(len(self.hosts)):
            out += self.send(i, chunk, data[i])
        results = {}
        for port, frame in out:
            hdr, lanes, ip, udp = parse_result(frame)
            assert hdr.msg_type == wire.MsgType.RESULT and hdr.seq == chunk and hdr.job_id == self.grant.job_id
            i = self.ports.index(port)
            assert (ip, udp, hdr.worker_id) == (self.addr(i).ip, self.addr(i).udp_port, i)
            results[i] = lanes
        return results


def counter(h, name, index, switch="s1"):
    return h.switches[switch].pipeline.counter(name)[index]


# --- admission writes the exact entries ---------------------------------------------------------------
def test_admission_writes_the_exact_entries(h):
    g = register(h, "a", ["h11", "h12"], requested=8)
    assert (g.job_id, g.backend, g.ina_port, g.lanes, g.scale) == (1, "ina", 47000, 32, 65536.0)
    (sg,) = g.switches
    assert (sg.switch, sg.base_slot, sg.num_slots, sg.mcast_grp, list(sg.worker_ids), sg.rack) == ("s1", 0, 8, 2, [0, 1], "r1")
    assert (sg.switch_ip, sg.switch_mac) == ("10.0.1.254", "02:00:00:00:01:fe")
    sw = h.switches["s1"]
    assert sw.entries("MyIngress.ina_job") == {(1,): ("MyIngress.set_job", (0, 8, 0b11, 2, 2, g.generation, 0))}
    assert sw.entries("MyEgress.ina_worker") == {
        (1, 0): ("MyEgress.set_worker_addr", (mac_int("02:00:00:00:01:01"), ip_int("10.0.1.1"), 40000)),
        (1, 1): ("MyEgress.set_worker_addr", (mac_int("02:00:00:00:01:02"), ip_int("10.0.1.2"), 40001)),
    }
    assert {g: sorted(r) for g, r in sw.pipeline.multicast_groups.items()} == {2: [(1, 0), (2, 1)]}
    routes = sw.entries("MyIngress.ipv4_lpm")
    assert routes[((ip_int("10.0.1.3"), 32),)] == ("MyIngress.ipv4_forward", (mac_int("02:00:00:00:01:03"), 3))
    assert len(routes) == 4
    # and release removes all of the job's entries
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=g.job_id))
    assert not sw.entries("MyIngress.ina_job") and not sw.entries("MyEgress.ina_worker") and not sw.pipeline.multicast_groups
    assert len(sw.entries("MyIngress.ipv4_lpm")) == 4


def test_two_jobs_aggregate_concurrently_through_their_ranges(h):
    a = Job(h, register(h, "a", ["h11", "h12"], requested=4), ["h11", "h12"])
    b = Job(h, register(h, "b", ["h13", "h14"], requested=4), ["h13", "h14"])
    ra, rb = a.grant.switches[0], b.grant.switches[0]
    assert (ra.base_slot, ra.num_slots, rb.base_slot, rb.num_slots) == (0, 4, 4, 4)
    rng = np.random.default_rng(1)
    for chunk in range(12):  # 3 rounds over the 4 slots, both shadow copies, interleaved jobs
        da = rng.integers(-1000, 1000, size=(2, wire.LANES), dtype=np.int32)
        db = rng.integers(-1000, 1000, size=(2, wire.LANES), dtype=np.int32)
        out_a = a.send(0, chunk, da[0]) + b.send(0, chunk, db[0]) + a.send(1, chunk, da[1])
        out_b = b.send(1, chunk, db[1])
        assert {p for p, _ in out_a} == {1, 2} and {p for p, _ in out_b} == {3, 4}
        for _, f in out_a:
            assert np.array_equal(parse_result(f)[1], da.sum(axis=0))
        for _, f in out_b:
            assert np.array_equal(parse_result(f)[1], db.sum(axis=0))
    assert counter(h, "MyIngress.ina_aggregated", a.grant.job_id) == 24
    assert counter(h, "MyIngress.ina_aggregated", b.grant.job_id) == 24
    assert counter(h, "MyEgress.ina_results", b.grant.job_id) == 24
    owners = h.switches["s1"].pipeline.ina_owner
    assert {owners[s] >> 16 for s in range(4)} == {a.grant.job_id}
    assert {owners[s] >> 16 for s in range(4, 8)} == {b.grant.job_id}


# --- reallocation ------------------------------------------------------------------------------------
def test_reallocation_mid_stream_loses_and_double_counts_nothing(h):
    """Job b runs on 8 of 16 slots; job a's release upgrades it to 16 (moved to slot 0): new generation,
    old-generation packets dropped, the barrier resumes both workers at the first chunk one of them lacks."""
    a = register(h, "a", ["h11", "h12"], requested=8)
    hosts = ["h13", "h14"]
    b = Job(h, register(h, "b", hosts, requested=16), hosts)
    assert (b.grant.switches[0].base_slot, b.grant.switches[0].num_slots) == (8, 8)
    watch = h.stub.WatchJob(pb.WatchJobRequest(job_id=b.grant.job_id, worker_id=0), timeout=10)
    assert next(watch).grant.generation == b.grant.generation

    rng = np.random.default_rng(7)
    data = rng.integers(-(2**20), 2**20, size=(12, 2, wire.LANES), dtype=np.int32)
    got: dict[int, dict[int, np.ndarray]] = {0: {}, 1: {}}
    for k in range(5):
        for i, lanes in b.chunk(k, data[k]).items():
            got[i][k] = lanes
    # chunk 5: both contributed, but worker 1's result is lost; chunk 6: only worker 0 contributed
    res = b.chunk(5, data[5])
    got[0][5] = res[0]
    b.chunk(6, data[6], workers=[0])
    old = b.grant

    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=a.job_id))
    event = next(watch)
    new = event.grant
    assert not event.released and new.generation != old.generation and new.backend == "ina"
    assert (new.switches[0].base_slot, new.switches[0].num_slots) == (0, 16)
    assert new.reason.startswith("upgraded") and f"job {a.job_id} released" in new.reason
    assert h.switches["s1"].entries("MyIngress.ina_job")[(b.grant.job_id,)][1][5] == new.generation

    # worker 1 still sends chunk 6 under the old generation: dropped and counted, no state touched
    before = h.switches["s1"].pipeline.register_snapshot()
    stale = counter(h, "MyIngress.ina_job_drops", b.grant.job_id * wire.NUM_DROP_REASONS + STALE)
    assert b.send(1, 6, data[6][1]) == []
    assert counter(h, "MyIngress.ina_job_drops", b.grant.job_id * wire.NUM_DROP_REASONS + STALE) == stale + 1
    after = h.switches["s1"].pipeline.register_snapshot()
    assert all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(before, after))

    # the barrier: worker 0 has results up to chunk 5 and lacks 6; worker 1 lacks 5 (its result was lost)
    first_missing = {i: min(k for k in range(12) if k not in got[i]) for i in (0, 1)}
    assert first_missing == {0: 6, 1: 5}
    resume = {}

    def sync(i):
        r = h.stub.SyncGeneration(pb.SyncGenerationRequest(
            job_id=new.job_id, worker_id=i, generation=new.generation, first_missing_chunk=first_missing[i]), timeout=10)
        resume[i] = r.resume_chunk

    threads = [threading.Thread(target=sync, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert resume == {0: 5, 1: 5}

    b.grant = new
    for k in range(resume[0], 12):
        res = b.chunk(k, data[k])
        for i, lanes in res.items():
            got[i][k] = lanes
    for i in (0, 1):
        assert sorted(got[i]) == list(range(12))
        for k in range(12):
            assert np.array_equal(got[i][k], data[k].sum(axis=0)), (i, k)  # each chunk exactly once
    watch.cancel()


def test_priority_policy_preempts_and_tells_the_victim(h):
    h.stub.SetPolicy(pb.SetPolicyRequest(policy="priority"))
    low = register(h, "low", ["h11", "h12"], requested=16, priority=1)
    assert low.switches[0].num_slots == 16
    watch = h.stub.WatchJob(pb.WatchJobRequest(job_id=low.job_id), timeout=10)
    next(watch)
    high = register(h, "high", ["h13", "h14"], requested=16, priority=5)
    assert high.backend == "ina" and high.switches[0].num_slots == 16
    ev = next(watch)
    assert ev.grant.backend == "ring" and ev.grant.switches[0].num_slots == 0 and ev.grant.generation != low.generation
    assert f"job {high.job_id} admitted" in ev.grant.reason
    # the victim keeps its entry with no slots and a new generation: its packets drop, counted
    assert h.switches["s1"].entries("MyIngress.ina_job")[(low.job_id,)][1][:2] == (0, 0)
    jobs = {j.job_id: j.state for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs}
    assert jobs == {low.job_id: "waiting", high.job_id: "running"}
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=high.job_id))
    ev = next(watch)
    assert ev.grant.backend == "ina" and ev.grant.switches[0].num_slots == 16
    watch.cancel()


def test_full_pool_gives_ring_at_once_and_upgrades_when_slots_free(h):
    a = register(h, "a", ["h11", "h12"], requested=16, min_slots=16)
    b = register(h, "b", ["h13", "h14"], requested=8, min_slots=8)
    assert b.backend == "ring" and b.switches[0].num_slots == 0 and "no slots" in b.reason
    assert h.stub.GetJob(pb.GetJobRequest(job_id=b.job_id)).state == "waiting"
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=a.job_id))
    g = h.stub.GetJob(pb.GetJobRequest(job_id=b.job_id)).grant
    assert g.backend == "ina" and g.switches[0].num_slots == 8 and g.generation != b.generation


def test_set_policy_reallocates_every_job(h):
    a = register(h, "a", ["h11", "h12"], requested=16)
    b = register(h, "b", ["h13", "h14"], requested=16)
    assert (a.switches[0].num_slots, b.backend) == (16, "ring")
    info = h.stub.SetPolicy(pb.SetPolicyRequest(policy="equal"))
    assert info.policy == "equal" and set(info.available) >= {"equal", "first-fit", "weighted", "priority"}
    mem = h.stub.GetMemory(pb.GetMemoryRequest()).switches[0]
    assert [(r.base, r.size, r.job_id) for r in mem.ranges] == [(0, 8, a.job_id), (8, 8, b.job_id)]
    assert (mem.used, mem.free, mem.largest_free, mem.fragmentation) == (16, 0, 0, 0.0)


def test_memory_map_reports_gaps_and_fragmentation(h):
    a = register(h, "a", ["h11"], requested=4)
    b = register(h, "b", ["h12"], requested=4)
    register(h, "c", ["h13"], requested=4)
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=b.job_id))
    mem = h.stub.GetMemory(pb.GetMemoryRequest()).switches[0]
    assert [(r.base, r.size, r.free) for r in mem.ranges] == [(0, 4, False), (4, 4, True), (8, 4, False), (12, 4, True)]
    assert (mem.used, mem.free, mem.largest_free) == (8, 8, 4) and mem.fragmentation == pytest.approx(0.5)
    assert mem.ranges[0].job_id == a.job_id


def test_worker_without_host_is_located_by_its_ip(h):
    g = h.stub.RegisterJob(pb.RegisterJobRequest(
        name="byip", tensor_elements=100, workers=[pb.Worker(worker_id=0, ip="10.0.1.3", udp_port=5000)]))
    info = h.stub.GetJob(pb.GetJobRequest(job_id=g.job_id))
    assert (info.request.workers[0].host, info.request.workers[0].mac) == ("h13", "02:00:00:00:01:03")
    assert h.switches["s1"].pipeline.multicast_groups[g.job_id + 1] == ((3, 0),)


def test_jobs_across_racks_get_rina_on_chains(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", n_switches=2, pool=16) as h:
        g = register(h, "x", ["h11", "h12", "h21"], requested=8)
        assert g.backend == "rina"
        assert g.chain_rtt_floor == 0.0  # the star topology gives no link rates
        assert [(s.switch, s.rack, list(s.worker_ids), s.num_slots, s.mcast_grp) for s in g.switches] == [
            ("s1", "r1", [0, 1], 8, 2), ("s2", "r2", [2], 8, 2)]
        assert h.switches["s1"].entries("MyIngress.ina_job")[(g.job_id,)][1][2:4] == (0b011, 2)
        assert h.switches["s2"].entries("MyIngress.ina_job")[(g.job_id,)][1][2:4] == (0b100, 1)
        assert h.switches["s2"].entries("MyIngress.ina_chain")  # the ring's entries
        # routes between racks go over the trunk
        assert h.switches["s1"].entries("MyIngress.ipv4_lpm")[((ip_int("10.0.2.1"), 32),)][1][1] == 100


# --- SyncGeneration ----------------------------------------------------------------------------------
def sync(h, job, worker_id, generation, chunk, timeout=10):
    return h.stub.SyncGeneration(pb.SyncGenerationRequest(
        job_id=job, worker_id=worker_id, generation=generation, first_missing_chunk=chunk), timeout=timeout)


def test_sync_generation_waits_for_every_worker_then_returns_the_minimum(h):
    g = register(h, "a", ["h11", "h12", "h13"])
    results = {}
    threads = [threading.Thread(target=lambda i=i, c=c: results.__setitem__(i, sync(h, g.job_id, i, g.generation, c)))
               for i, c in ((0, 40), (1, 17))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert results == {}  # worker 2 has not reported
    assert sync(h, g.job_id, 2, g.generation, 25).resume_chunk == 17
    for t in threads:
        t.join(5)
    assert {i: r.resume_chunk for i, r in results.items()} == {0: 17, 1: 17}
    assert sync(h, g.job_id, 0, g.generation, 99).resume_chunk == 17  # a late repeat gets the same answer


def test_sync_generation_errors(h):
    g = register(h, "a", ["h11", "h12"])
    with pytest.raises(grpc.RpcError) as err:
        sync(h, g.job_id, 0, g.generation + 1000, 0)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        sync(h, 99, 0, g.generation, 0)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        sync(h, g.job_id, 7, g.generation, 0)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        sync(h, g.job_id, 0, g.generation, 0, timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 3


def test_sync_generation_timeout_of_the_controller(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", sync_timeout=0.3) as h:
        g = register(h, "a", ["h11", "h12"])
        with pytest.raises(grpc.RpcError) as err:
            sync(h, g.job_id, 0, g.generation, 0)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "[1]" in err.value.details()


def test_sync_waiting_on_a_replaced_generation_fails(h):
    register(h, "a", ["h11", "h12"], requested=16)
    b = register(h, "b", ["h13", "h14"], requested=8)
    errors = []

    def waiter():
        try:
            sync(h, b.job_id, 0, b.generation, 3)
        except grpc.RpcError as exc:
            errors.append(exc.code())

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=1))  # b is upgraded: new generation
    t.join(5)
    assert errors == [grpc.StatusCode.FAILED_PRECONDITION]


# --- heartbeats ----------------------------------------------------------------------------------------
def test_silent_job_is_released_and_the_waiting_job_upgraded(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16, heartbeat_timeout=1.2, monitor_interval=0.05) as h:
        a = register(h, "a", ["h11", "h12"], requested=16)
        b = register(h, "b", ["h13", "h14"], requested=16)
        assert b.backend == "ring"
        watch = h.stub.WatchJob(pb.WatchJobRequest(job_id=b.job_id, worker_id=1), timeout=10)
        assert next(watch).grant.backend == "ring"
        watch_a = h.stub.WatchJob(pb.WatchJobRequest(job_id=a.job_id, worker_id=0), timeout=10)
        next(watch_a)
        stop = threading.Event()

        def beat():
            while not stop.is_set():
                assert h.stub.Heartbeat(pb.HeartbeatRequest(job_id=b.job_id, worker_id=0)).generation > 0
                time.sleep(0.1)

        t = threading.Thread(target=beat)
        t.start()
        try:
            ev = next(watch)
        finally:
            stop.set()
            t.join()
        assert ev.grant.backend == "ina" and ev.grant.switches[0].num_slots == 16
        assert "heartbeat timeout" in ev.grant.reason
        gone = next(watch_a)
        assert gone.released
        assert [j.job_id for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs] == [b.job_id]
        assert set(h.switches["s1"].entries("MyIngress.ina_job")) == {(b.job_id,)}
        with pytest.raises(grpc.RpcError) as err:
            h.stub.Heartbeat(pb.HeartbeatRequest(job_id=a.job_id, worker_id=0))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        watch.cancel()


# --- bad requests ------------------------------------------------------------------------------------
def snapshot(h):
    sw = h.switches["s1"]
    return (
        {t: sw.entries(t) for t in ("MyIngress.ina_job", "MyEgress.ina_worker", "MyIngress.ipv4_lpm")},
        dict(sw.pipeline.multicast_groups),
        h.stub.ListJobs(pb.ListJobsRequest()).SerializeToString(),
        h.stub.GetMemory(pb.GetMemoryRequest()).SerializeToString(),
        h.controller.store.load_jobs(),
    )


def W(i, host="h13", **kw):
    return pb.Worker(worker_id=i, host=host, udp_port=kw.pop("udp_port", 41000 + i), **kw)


BAD_REGISTRATIONS = [
    ({"workers": []}, grpc.StatusCode.INVALID_ARGUMENT, "at least one worker"),
    ({"workers": [W(32)]}, grpc.StatusCode.INVALID_ARGUMENT, "beyond the 32-bit worker bitmap"),
    ({"workers": [W(i, f"s1-p{i + 1}") for i in range(33)]}, grpc.StatusCode.INVALID_ARGUMENT, "at most 32"),
    ({"workers": [W(1), W(1, "h14")]}, grpc.StatusCode.INVALID_ARGUMENT, "appears twice"),
    ({"workers": [W(0, "h99")]}, grpc.StatusCode.INVALID_ARGUMENT, "unknown host 'h99'"),
    ({"workers": [W(0, "", ip="10.9.9.9")]}, grpc.StatusCode.INVALID_ARGUMENT, "host is empty"),
    ({"workers": [W(0, ip="10.0.1")]}, grpc.StatusCode.INVALID_ARGUMENT, "not an IPv4 address"),
    ({"workers": [W(0, mac="zz:00:00:00:00:01")]}, grpc.StatusCode.INVALID_ARGUMENT, "not a MAC address"),
    ({"workers": [W(0, udp_port=0)]}, grpc.StatusCode.INVALID_ARGUMENT, "not a port number"),
    ({"workers": [W(0, udp_port=47000)]}, grpc.StatusCode.INVALID_ARGUMENT, "is the INA port"),
    ({"workers": [W(0), W(1, ip="10.0.1.3", udp_port=41000)]}, grpc.StatusCode.INVALID_ARGUMENT, "used by another worker"),
    ({"tensor_elements": 0}, grpc.StatusCode.INVALID_ARGUMENT, "tensor_elements"),
    ({"requested_slots": 1025}, grpc.StatusCode.INVALID_ARGUMENT, "exceeds the switch pool"),
    ({"requested_slots": 4, "min_slots": 5}, grpc.StatusCode.INVALID_ARGUMENT, "larger than requested_slots"),
    ({"weight": -1.0}, grpc.StatusCode.INVALID_ARGUMENT, "weight"),
    ({"weight": float("nan")}, grpc.StatusCode.INVALID_ARGUMENT, "weight"),
    ({"name": "taken"}, grpc.StatusCode.ALREADY_EXISTS, "already registered"),
    ({"workers": [W(0, "h11", udp_port=40000)]}, grpc.StatusCode.ALREADY_EXISTS, "10.0.1.1:40000 is already registered"),
]


@pytest.mark.parametrize("fields, code, words", BAD_REGISTRATIONS, ids=[w for _, _, w in BAD_REGISTRATIONS])
def test_bad_registration_gets_its_status_and_changes_nothing(h, fields, code, words):
    register(h, "taken", ["h11", "h12"], requested=4)
    before = snapshot(h)
    req = {"name": "new", "workers": [W(0)], "tensor_elements": 1000, "requested_slots": 4}
    req.update(fields)
    with pytest.raises(grpc.RpcError) as err:
        h.stub.RegisterJob(pb.RegisterJobRequest(**req))
    assert err.value.code() == code
    assert words in err.value.details()
    assert snapshot(h) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.Heartbeat(pb.HeartbeatRequest(job_id=42, worker_id=0)),
        lambda s: s.Heartbeat(pb.HeartbeatRequest(job_id=1, worker_id=9)),
        lambda s: s.ReleaseJob(pb.ReleaseJobRequest(job_id=42)),
        lambda s: s.GetJob(pb.GetJobRequest(job_id=42)),
        lambda s: s.GetStats(pb.GetStatsRequest(job_id=42)),
        lambda s: next(s.WatchJob(pb.WatchJobRequest(job_id=42), timeout=5)),
        lambda s: next(s.WatchJob(pb.WatchJobRequest(job_id=1, worker_id=9), timeout=5)),
    ],
    ids=["heartbeat-job", "heartbeat-worker", "release", "get", "stats", "watch-job", "watch-worker"],
)
def test_unknown_job_or_worker_is_not_found_and_changes_nothing(h, call):
    register(h, "a", ["h11", "h12"])
    before = snapshot(h)
    with pytest.raises(grpc.RpcError) as err:
        call(h.stub)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and err.value.details()
    assert snapshot(h) == before


def test_unknown_policy_is_invalid_and_changes_nothing(h):
    register(h, "a", ["h11", "h12"])
    before = snapshot(h)
    with pytest.raises(grpc.RpcError) as err:
        h.stub.SetPolicy(pb.SetPolicyRequest(policy="lottery"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "first-fit" in err.value.details()
    assert h.stub.GetPolicy(pb.GetPolicyRequest()).policy == "first-fit"
    assert snapshot(h) == before


def test_a_failing_switch_write_leaves_nothing_half_applied(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", n_switches=2, pool=16, connect_timeout=0.5) as h:
        register(h, "a", ["h11", "h12"], requested=4)
        s1 = h.switches["s1"]
        before = (s1.entries("MyIngress.ina_job"), s1.entries("MyEgress.ina_worker"), dict(s1.pipeline.multicast_groups))
        jobs = h.controller.store.load_jobs()
        h.switches["s2"].stop()  # s2 goes away: a job spanning s1 and s2 cannot be installed
        with pytest.raises(grpc.RpcError) as err:
            register(h, "b", ["h13", "h21"], requested=4)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "nothing applied" in err.value.details()
        assert (s1.entries("MyIngress.ina_job"), s1.entries("MyEgress.ina_worker"), dict(s1.pipeline.multicast_groups)) == before
        assert h.controller.store.load_jobs() == jobs
        assert [j.name for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs] == ["a"]


# --- stats -------------------------------------------------------------------------------------------
def test_stats_read_the_switch_counters(h):
    hosts = ["h11", "h12"]
    j = Job(h, register(h, "a", hosts, requested=4), hosts)
    data = np.ones((2, wire.LANES), dtype=np.int32)
    j.chunk(0, data)
    j.send(0, 0, data[0])  # duplicate of a complete slot: answered from the switch
    j.send(0, 1, data[0], generation=j.grant.generation + 1)  # stale
    st = h.stub.GetStats(pb.GetStatsRequest(job_id=j.grant.job_id))
    (s,) = st.stats
    assert (s.job_id, s.switch, s.aggregated, s.duplicates, s.results) == (j.grant.job_id, "s1", 2, 1, 3)
    assert s.drops["stale_generation"] == 1 and s.drops["slot_out_of_range"] == 0
    assert st.switch_drops["s1/stale_generation"] == 1
