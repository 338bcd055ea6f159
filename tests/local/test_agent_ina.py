"""The agent's INA all-reduce through the pipeline model on loopback: exact sums, loss recovery, overflow, several jobs."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from host_agent.agent import AgentOptions
from host_agent.fixedpoint import chunk_count
from host_agent.options import StreamOptions
from softswitch.udp import Faults
from topologies.loopback import LoopbackCluster, exact_sum

FAULTY = Faults(drop=0.05, duplicate=0.05, reorder=0.05, reorder_delay=0.002)
QUICK = AgentOptions(stream=StreamOptions(op_timeout=20.0))
# For switches that do not check a copy's seq: slots stay idle longer than the shim holds packets back.
GUARDED = AgentOptions(stream=StreamOptions(reorder_guard=0.003, op_timeout=20.0))


def _inputs(n: int, seed: int) -> list[list[np.ndarray]]:
    """Per worker: a 1000-vector, a (7, 33) matrix (not a multiple of the lane count), a scalar-ish vector."""
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal(1000) * 10).astype(np.float32),
             rng.standard_normal((7, 33)).astype(np.float32),
             np.array([rng.standard_normal()], dtype=np.float32)] for _ in range(n)]


def _check_exact(results: list[list[np.ndarray]], inputs: list[list[np.ndarray]]) -> None:
    for k in range(len(inputs[0])):
        want = exact_sum([inp[k] for inp in inputs])
        for res in results:
            assert res[k].dtype == np.float32 and res[k].shape == want.shape
            assert res[k].tobytes() == want.tobytes()


@pytest.mark.parametrize("n", range(2, 9))
def test_ina_sums_exactly(n: int) -> None:
    inputs = _inputs(n, seed=n)
    with LoopbackCluster(["s1"] * n, slots=16, options=QUICK) as cl:
        def work(agent):
            assert agent.backend == "ina"
            return [agent.allreduce(x) for x in inputs[agent.rank]], agent.stats, agent.job_id

        out = cl.run(work)
        _check_exact([o[0] for o in out], inputs)
        chunks = sum(chunk_count(x.size) for x in inputs[0])
        sw = cl.switch()
        # every chunk of every worker was aggregated once (plus the closing barrier), none was dropped
        assert sw.counter("MyIngress.ina_aggregated", out[0][2]) == n * (chunks + 1)
        assert all(o[1].overflow_chunks == 0 and o[1].resyncs == 1 for o in out)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ina_exact_under_loss_duplication_and_reordering(n: int) -> None:
    rng = np.random.default_rng(n)
    inputs = [[rng.standard_normal(1500).astype(np.float32) for _ in range(2)] for _ in range(n)]
    with LoopbackCluster(["s1"] * n, slots=32, faults=FAULTY, seed=n, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(x) for x in inputs[agent.rank]], agent.stats))
        _check_exact([o[0] for o in out], inputs)
        assert cl.switch().dropped > 0
        assert sum(o[1].retransmits for o in out) > 0


def test_reorder_guard_keeps_sums_exact() -> None:
    """The guard (for switches without the per-copy seq check) delays slot reuse and changes nothing else."""
    n = 4
    rng = np.random.default_rng(9)
    inputs = [[rng.standard_normal(1500).astype(np.float32)] for _ in range(n)]
    with LoopbackCluster(["s1"] * n, slots=32, faults=FAULTY, seed=9, options=GUARDED) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank][0])], agent.stats))
    _check_exact([o[0] for o in out], inputs)


def test_overflow_is_recovered_exactly() -> None:
    """Chunks whose int32 sum overflows in the switch come back flagged and are resent split in two halves."""
    n, scale = 3, float(2**16)
    rng = np.random.default_rng(7)
    inputs = []
    for _ in range(n):
        x = rng.standard_normal(32 * 40).astype(np.float32)
        x[32 * 5 : 32 * 8] = 20000.0 + rng.random(96).astype(np.float32)  # 3 chunks: 3 x 1.3e9 > 2**31
        x[32 * 20 + 3] = -30000.0  # 1 chunk: one lane's sum reaches -5.9e9
        inputs.append([x])
    with LoopbackCluster(["s1"] * n, slots=8, scale=scale, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank][0])], agent.stats))
    _check_exact([o[0] for o in out], inputs)
    assert out[0][0][0][32 * 5] > 59999  # far beyond what an int32 sum at this scale can hold
    assert all(o[1].overflow_chunks == 4 for o in out)


def test_overflow_recovery_under_loss() -> None:
    n = 3
    rng = np.random.default_rng(3)
    inputs = [[np.where(rng.random(640) < 0.3, 25000.0, rng.standard_normal(640)).astype(np.float32)] for _ in range(n)]
    with LoopbackCluster(["s1"] * n, slots=8, faults=FAULTY, seed=5, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank][0])], agent.stats))
    _check_exact([o[0] for o in out], inputs)
    assert out[0][1].overflow_chunks > 0


def test_several_jobs_on_one_host_at_once() -> None:
    """Two jobs share the hosts and the switch (each its own slot range and sockets) and run concurrently."""
    rng = np.random.default_rng(11)
    with LoopbackCluster(["s1"] * 3, slots=16, options=QUICK, name="a") as cl:
        spec_b, sockets_b = cl.new_job("b", workers=[0, 1])
        data_a = [[rng.standard_normal(3000).astype(np.float32)] for _ in range(3)]
        data_b = [[rng.standard_normal(2000).astype(np.float32)] for _ in range(2)]
        results: dict[str, list] = {}
        both_running = threading.Barrier(5)

        def job(name: str, data, **kw):
            def work(agent):
                both_running.wait(timeout=30)
                return [agent.allreduce(data[agent.rank][0]) for _ in range(3)], agent.job_id, agent.backend

            results[name] = cl.run(work, **kw)

        threads = [threading.Thread(target=job, args=("a", data_a)),
                   threading.Thread(target=job, args=("b", data_b), kwargs={"spec": spec_b, "sockets": sockets_b})]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert set(results) == {"a", "b"}
        (_, ja, ba), (_, jb, bb) = results["a"][0], results["b"][0]
        assert ja != jb and ba == bb == "ina"
        for name, data in (("a", data_a), ("b", data_b)):
            want = exact_sum([d[0] for d in data])
            for outs, _, _ in results[name]:
                assert all(o.tobytes() == want.tobytes() for o in outs)


def test_allgather_is_bit_exact_and_barrier_returns() -> None:
    values = [np.array([1 / 3, -2.5e-300, 7.0]), np.array([np.pi, 1e300, -0.0]), np.array([np.e, 5e-324, 2.0])]
    with LoopbackCluster(["s1"] * 3, slots=4, options=QUICK) as cl:
        def work(agent):
            agent.barrier()
            got = agent.allgather(values[agent.rank])
            odd = agent.allgather(np.arange(agent.rank, agent.rank + 3, dtype=np.int16))  # 6 bytes: not whole words
            return got, odd

        for got, odd in cl.run(work):
            assert got.dtype == np.float64 and got.tobytes() == np.stack(values).tobytes()
            assert odd.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]


@pytest.mark.parametrize("n", [2, 5])
def test_ring_only_without_controller(n: int) -> None:
    inputs = _inputs(n, seed=20 + n)
    with LoopbackCluster(["s1"] * n, backend="ring", options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(x) for x in inputs[agent.rank]], agent.backend), controller=False)
    _check_exact([o[0] for o in out], inputs)
    assert {o[1] for o in out} == {"ring"}


def test_ring_overflow_is_redone_in_int64() -> None:
    n = 4
    inputs = [[np.full(100, 30000.0 + i, dtype=np.float32)] for i in range(n)]
    with LoopbackCluster(["s1"] * n, backend="ring", options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank][0])], agent.stats), controller=False)
    _check_exact([o[0] for o in out], inputs)
    assert all(o[1].ring_redo_int64 == 1 for o in out)


def test_empty_and_integer_inputs() -> None:
    with LoopbackCluster(["s1"] * 2, slots=4, options=QUICK) as cl:
        def work(agent):
            return (agent.allreduce(np.zeros((0, 3), dtype=np.float32)), agent.allreduce(np.arange(5)),
                    agent.allreduce_fixed(np.array([2**31 - 1, -(2**31)], dtype=np.int32)))

        for empty, ints, fixed in cl.run(work):
            assert empty.shape == (0, 3) and empty.dtype == np.float32
            assert ints.tolist() == [0, 2, 4, 6, 8]
            assert fixed.dtype == np.int64 and fixed.tolist() == [2 * (2**31 - 1), -(2**32)]


def test_mismatched_calls_time_out_with_a_clear_error() -> None:
    from host_agent.errors import AgentError

    opts = AgentOptions(stream=StreamOptions(op_timeout=1.0), close_timeout=1.0)
    with LoopbackCluster(["s1"] * 2, slots=4, options=opts) as cl:
        def work(agent):
            if agent.rank == 0:
                with pytest.raises(AgentError, match="no result from switch"):
                    agent.allreduce(np.ones(64, dtype=np.float32))
                return "timed out"
            return "skipped"

        assert cl.run(work, timeout=30) == ["timed out", "skipped"]


@pytest.mark.parametrize("slots", [2, 4])
def test_lanes_skipped_behind_a_loss_stay_exact_under_heavy_loss(slots: int) -> None:
    """With few slots and 15 % loss most turns skip a chunk whose slot waits for a recovery (SwitchML's lanes,
    host_agent/ina_window.py) and send it later, out of order; every sum stays exact."""
    rng = np.random.default_rng(slots)
    inputs = [[rng.standard_normal(3000).astype(np.float32)] for _ in range(3)]
    faults = Faults(drop=0.15, duplicate=0.05, reorder=0.05, reorder_delay=0.002)
    with LoopbackCluster(["s1"] * 3, slots=slots, faults=faults, seed=slots, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(x) for x in inputs[agent.rank]], agent.stats))
        _check_exact([o[0] for o in out], inputs)
        assert cl.switch().dropped > 0 and all(o[1].early_resends > 0 for o in out)
        assert max(o[1].lane_lag_max for o in out) >= 2  # a lane fell more than one chunk behind the others


def test_loss_signals_resend_a_workers_own_losses_and_keep_every_sum_exact() -> None:
    """With the switch's loss signals (docs/agent.md, "Loss signals") each worker numbers its frames, learns of its
    own lost gradients from gap reports and of its lost results from the next result, and resends those; every sum
    stays exact."""
    rng = np.random.default_rng(11)
    inputs = [[rng.standard_normal(6000).astype(np.float32) for _ in range(2)] for _ in range(4)]
    with LoopbackCluster(["s1"] * 4, slots=16, faults=Faults(drop=0.05), seed=3, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(x) for x in inputs[agent.rank]], agent.stats))
        _check_exact([o[0] for o in out], inputs)
        assert cl.switch().dropped > 0
        assert all(o[1].gap_reports > 0 and o[1].signal_resends > 0 for o in out)


def _udp_rcvbuf_errors() -> int:
    """The network namespace's UDP datagrams dropped at a full receive buffer so far (/proc/net/snmp)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return int(rows[1][rows[0].index("RcvbufErrors")])


def test_without_loss_numbered_frames_reach_the_switch_in_sequence() -> None:
    """Every gradient frame (first sends in runs, skipped lanes sent late, resends) takes the next counter value:
    without loss the switch reports no gap but for frames the kernel dropped at a full socket buffer (counted, not
    assumed away), and its results show the workers it sends the signals."""
    rng = np.random.default_rng(12)
    inputs = [[rng.standard_normal(5000).astype(np.float32) for _ in range(3)] for _ in range(3)]
    rcvbuf_errors = _udp_rcvbuf_errors()
    with LoopbackCluster(["s1"] * 3, slots=8, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(x) for x in inputs[agent.rank]],
                                    agent.stats, agent.stream.ina.signals_seen))
        _check_exact([o[0] for o in out], inputs)
        assert all(o[2] for o in out)
        # loopback drops nothing but what a full socket buffer drops: each gap report names at least one frame the
        # kernel dropped before the switch read it (a send the worker's own socket refused takes no counter), and
        # each resend on a signal a frame so named (up to 63 a report) or a result dropped at a worker's socket
        # (the machine's UDP receive-buffer errors meanwhile bound those)
        reports, resends = sum(o[1].gap_reports for o in out), sum(o[1].signal_resends for o in out)
        assert reports <= cl.switch().kernel_drops
        assert resends <= 63 * reports + _udp_rcvbuf_errors() - rcvbuf_errors


def test_asynchronous_calls_run_in_submission_order_on_the_communication_thread() -> None:
    """``allreduce_async`` returns at once; the agent's communication thread runs the calls in the order submitted
    (the same on every worker), so every future gets its own exact sum; a call that fails fails its future only."""
    rng = np.random.default_rng(21)
    inputs = [[rng.standard_normal(500 + 100 * k).astype(np.float32) for k in range(4)] for _ in range(3)]

    def work(agent):
        futures = [agent.allreduce_async(x) for x in inputs[agent.rank]]
        bad = agent.submit(agent.allreduce, np.array(["not numbers"]))
        last = agent.allreduce_async(inputs[agent.rank][0])
        return [f.result(30) for f in futures], bad.exception(30), last.result(30)

    with LoopbackCluster(["s1"] * 3, slots=8, options=QUICK) as cl:
        out = cl.run(work)
    for sums, error, again in out:
        _check_exact([sums], inputs)
        assert isinstance(error, TypeError)
        assert again.tobytes() == exact_sum([inp[0] for inp in inputs]).tobytes()
