"""Generation wrap through the controller: a job reallocated from just below the 16-bit wrap to past it gets
wire generations 65534, 65535, 1, 2 ... with the owner epoch counting the wraps in its ina_job entry, every
round sums exactly, and the generation barrier works on wire generations."""
from __future__ import annotations

import threading

import numpy as np

from controller.store import Store
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.job_entries import GENERATIONS
from tests.support.frames import grant_gradient, parse_result
from topologies.loopback import LocalControlPlane, worker

HOSTS = ["h11", "h12"]


def _register(h: LocalControlPlane, name: str, hosts: list[str], requested: int) -> pb.JobGrant:
    return h.stub.RegisterJob(pb.RegisterJobRequest(
        name=name, workers=[worker(i, host) for i, host in enumerate(hosts)], tensor_elements=10_000,
        requested_slots=requested), timeout=10)


def _round(h: LocalControlPlane, job_id: int, generation: int, seq: int, data: np.ndarray) -> dict[int, np.ndarray]:
    """Both workers of the job send chunk ``seq`` into slot 0 from their own ports; worker -> result lanes."""
    sw = h.switches["s1"]
    base, num = sw.entries("MyIngress.ina_job")[(job_id,)][1][:2]
    assert num > 0
    grant = pb.JobGrant(job_id=job_id, generation=generation, switches=[pb.SwitchGrant(
        switch="s1", switch_ip="10.0.1.254", switch_mac="02:00:00:00:01:fe", base_slot=base, num_slots=num)])
    out = []
    for i, host in enumerate(HOSTS):
        frame = grant_gradient(h.host(host, 40000 + i), grant, i, 0, data[i], seq=seq, shadow=seq % 2)
        out += sw.send(h.topology.hosts[host].port, frame)
    results = {}
    for _, frame in out:
        header, lanes, _, _ = parse_result(frame)
        assert (header.job_id, header.generation, header.seq) == (job_id, generation, seq)
        results[header.worker_id] = lanes
    return results


def test_a_job_reallocated_across_the_wrap(tmp_path):
    db = tmp_path / "ctl.db"
    with LocalControlPlane(db, pool=16, policy="equal") as h:
        h.stop_controller()
        store = Store(db)
        store.save(meta={"next_generation": str(GENERATIONS - 1)})  # the counter just below the wrap
        store.close()
        h.start_controller()
        a = _register(h, "a", HOSTS, requested=16)
        rng = np.random.default_rng(5)
        seen = []
        for k in range(6):
            gen = h.stub.Heartbeat(pb.HeartbeatRequest(job_id=a.job_id, worker_id=0), timeout=10).generation
            params = h.switches["s1"].entries("MyIngress.ina_job")[(a.job_id,)][1]
            assert params[5] == gen
            seen.append((params[5], params[6]))
            data = rng.integers(-(2**20), 2**20, size=(2, wire.LANES), dtype=np.int32)
            got = _round(h, a.job_id, gen, seq=k + 1, data=data)
            expected = data.astype(np.int64).sum(axis=0)
            assert set(got) == {0, 1} and all(np.array_equal(v, expected) for v in got.values())
            # a second job arrives or leaves: job a's slots change, so it gets a new generation
            if k % 2 == 0:
                b = _register(h, f"b{k}", ["h13"], requested=16)
            else:
                h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=b.job_id), timeout=10)
        # wire generations 65534, 65535, then small again (the other job takes some serials): the owner epoch
        # counts the wrap, so no (generation, epoch) pair repeats
        assert seen[:2] == [(GENERATIONS - 1, 0), (GENERATIONS, 0)], seen
        assert all(1 <= g < 20 and e == 1 for g, e in seen[2:]) and len(set(seen)) == len(seen), seen

        # the barrier after the wrap: both workers report on the wire generation and resume at the minimum
        gen = h.stub.Heartbeat(pb.HeartbeatRequest(job_id=a.job_id, worker_id=0), timeout=10).generation
        current = h.switches["s1"].entries("MyIngress.ina_job")[(a.job_id,)][1][5:7]
        assert current == (gen, 1) and gen > seen[-1][0]
        resume = {}

        def sync(i: int, first_missing: int) -> None:
            resume[i] = h.stub.SyncGeneration(pb.SyncGenerationRequest(
                job_id=a.job_id, worker_id=i, generation=gen, first_missing_chunk=first_missing), timeout=10).resume_chunk

        threads = [threading.Thread(target=sync, args=(i, 7 + i)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert resume == {0: 7, 1: 7}

        # a restarted controller keeps counting serials: no generation is handed out twice
        h.restart_controller()
        params = h.switches["s1"].entries("MyIngress.ina_job")[(a.job_id,)][1]
        assert (params[5], params[6]) == current
