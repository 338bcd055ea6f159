"""The batch path for jobs laid out on chains (Rina's ring, aggregation trees): numpy across the batch.

``process_chain_batch`` is what ``pipeline_batch.process_batch`` does with a batch that holds frames of a job
with ``ina_chain`` entries: the same outputs, registers and counters as ``InaPipeline._process`` frame after
frame (tests/unit/test_pipeline_chains.py checks both on random chain traffic).

What is vectorised: whole INA frames from a data port that pass every check of ``MyIngress.apply`` step 4 for a
slot with a chain entry, and whose slot (absolute, the register index) no other frame of the batch names:
gradients (a local worker's or an upstream member's partial) and final sums (``RESULT`` to this switch's
member id). A frame alone in its slot reads the state the batch found, whatever its place in the batch, so the
whole step 6 runs on arrays: owner resets, the accept test (bitmap, count, seq age), the lanes' sum with the
int32 overflow test, completion, ``ina_final``, and for the frames that emit something their emitted frame
before the traffic manager (the partial sent onward, the final sum, the answer from a complete copy or the
partial sent onward again on a retransmission, the stored final sum passed on). The traffic manager
(``InaPipeline._replicate`` / ``_egress``, which only count) then runs per output, in arrival order.

Every other frame (a slot named twice in the batch, a drop, a transit or non-chain job, anything not INA) goes
through ``InaPipeline._process`` in its place in arrival order: it touches no vectorised slot, and the counters
both share are sums, so the two groups commute. ``STATS`` counts frames by the path they took.
"""
from __future__ import annotations

from collections import Counter
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from inaproto import wire
from softswitch import pipeline_batch as pb

if TYPE_CHECKING:
    from softswitch.pipeline import InaPipeline

# Chain batches of at least this many frames take the arrays; None: none do, they go one frame at a time. Off by
# default: on Rina's recorded traffic the arrays cost more CPU per frame than the per-frame path at every batch
# size up to 64 (about 100 numpy operations a batch, and the traffic manager per output; bench/chain_bench.py,
# docs/switch.md "Chains: the batch path").
CHAIN_VECTOR_MIN: int | None = None
# Frames of chain batches by the path they took: "vector" (step 6 on arrays), "per_frame" (the rest of a batch
# that took the arrays), "small" (whole batches one frame at a time: below CHAIN_VECTOR_MIN, or all while None).
STATS: Counter = Counter()

_LEN = wire.INA_FRAME_LEN
_O_IP, _O_UDP, _O_INA, _O_DATA = pb._O_IP, pb._O_UDP, pb._O_INA, pb._O_DATA
_OFF = pb._OFF
_GRADIENT, _RESULT = int(wire.MsgType.GRADIENT), int(wire.MsgType.RESULT)
_OVERFLOW, _RETRANSMIT = int(wire.Flags.OVERFLOW), int(wire.Flags.RETRANSMIT)
_M32 = 0xFFFFFFFF
_I32_LOW, _I32_HIGH = -(2**31), 2**31
# Bytes every vectorised frame carries whatever its job and type (pipeline_batch._FIXED without msg_type).
_FIXED = [c for c in pb._FIXED if c[0] != _OFF["msg_type"]]
_FIXED_COLUMNS = np.array([c for c, _, _ in _FIXED])
_FIXED_MASK = np.array([m for _, m, _ in _FIXED], np.uint8)
_FIXED_VALUE = np.array([v for _, _, v in _FIXED], np.uint8)


class _ChainArrays:
    """Tables ina_chain (per job, per slot: what set_chain sets, -1 where no entry matches) and ina_binding's
    bind_link entries as arrays, beside pipeline_batch's ``_JobArrays``; rebuilt when the tables change."""

    def __init__(self, pipeline: InaPipeline) -> None:
        self.source = (pipeline._job, pipeline._chain, pipeline._binding, pipeline._link_binding, pipeline._transit)
        n = wire.MAX_JOBS
        self.jobs = pb._JobArrays(pipeline._job, pipeline._binding)
        self.chain_job = np.zeros(n, bool)
        # per job: (member_id, upstream_mask, num_upstream, chain_end, next_grp, final_grp) per relative slot
        width = max([self.jobs.num_slots[j] for j in pipeline._chain if j < n and j in pipeline._job] + [1])
        self.params = np.full((n, int(width), 6), -1, np.int64)
        for job_id, entries in pipeline._chain.items():
            if job_id >= n or job_id not in pipeline._job or job_id in pipeline._transit:
                continue
            self.chain_job[job_id] = True
            for slot in range(int(self.jobs.num_slots[job_id])):
                for shift, key, params in entries:  # the longest prefix first, as the per-frame lookup
                    if slot >> shift == key:
                        self.params[job_id, slot] = params
                        break
        # bind_link: the two (port, UDP source port) pairs a member may send from; -1 where none
        self.link_port = np.full((n, 256, 2), -1, np.int64)
        self.link_udp = np.full((n, 256, 2), -1, np.int64)
        for (job_id, member), pairs in pipeline._link_binding.items():
            if job_id < n and member < 256 and (job_id, member) not in pipeline._binding:
                for k, (port, udp) in enumerate(sorted(pairs)):
                    self.link_port[job_id, member, k] = port
                    self.link_udp[job_id, member, k] = int.from_bytes(udp, "big")


def _chain_arrays(pipeline: InaPipeline) -> _ChainArrays:
    arrays = getattr(pipeline, "_batch_chains", None)
    current = (pipeline._job, pipeline._chain, pipeline._binding, pipeline._link_binding, pipeline._transit)
    if arrays is None or any(a is not b for a, b in zip(arrays.source, current)):
        arrays = pipeline._batch_chains = _ChainArrays(pipeline)
    return arrays


def has_chain_frames(pipeline: InaPipeline, rec: np.ndarray) -> bool:
    """Whether any frame of the batch names a job with chain entries (then the batch is this module's)."""
    if not pipeline._chain:
        return False
    chains = _chain_arrays(pipeline).chain_job
    job = rec["job_id"]
    return bool(chains[np.minimum(job, wire.MAX_JOBS - 1)].any())


def _gather_list(values: list, index: np.ndarray) -> np.ndarray:
    if len(index) == 1:
        return np.array([values[int(index[0])]], np.int64)
    return np.array(itemgetter(*index.tolist())(values), np.int64)


def process_chain_batch(pipeline: InaPipeline, port_of, ingress_port: int | np.ndarray, frames: list[bytes] | np.ndarray,
                        rec: np.ndarray, where: np.ndarray | None) -> list[tuple[int, bytes]]:
    """The batch through the pipeline, outputs in arrival order (see the module docstring); ``rec`` the whole
    INA-sized frames as pipeline_batch.FRAME_DTYPE records, ``where`` their positions in ``frames`` (None: all)."""
    n = len(frames)
    chains = _chain_arrays(pipeline)
    jobs = chains.jobs
    raw = rec.view(np.uint8).reshape(len(rec), _LEN)
    job_id = rec["job_id"].astype(np.int64)
    j = np.minimum(job_id, wire.MAX_JOBS - 1)
    worker_id = rec["worker_id"].astype(np.int64)
    slot = rec["slot"].astype(np.int64)
    msg_type = rec["msg_type"]
    known = (job_id < wire.MAX_JOBS) & chains.chain_job[j]
    # the register index every frame of a known job would use; frames naming a slot another frame names go one
    # at a time (their order matters), as do frames of other jobs in those slots
    slot_abs = jobs.base_slot[j] + slot
    named = np.flatnonzero((job_id < wire.MAX_JOBS) & (slot_abs < wire.NUM_SLOTS) & _in_job_table(pipeline, j))
    alone = np.zeros(len(rec), bool)
    if len(named):
        sa_named = slot_abs[named]
        _, first, counts = np.unique(sa_named, return_index=True, return_counts=True)
        alone[named[first[counts == 1]]] = True
    if isinstance(ingress_port, np.ndarray):
        ports = (ingress_port if where is None else ingress_port[where]).astype(np.int64)
    else:
        ports = np.full(len(rec), ingress_port, np.int64)
    # MyVerifyChecksum
    words = rec["ipv4_words"]
    checksum = words[:, 5]
    rest = words.sum(axis=1, dtype=np.int64) - checksum
    checksum_ok = checksum == (0xFFFF - rest % 0xFFFF) % 0xFFFF
    jc = np.where(known, j, 0)
    width = chains.params.shape[1]
    params = chains.params[jc, np.minimum(slot, width - 1)]
    has_chain = known & (slot < width) & (params[:, 0] >= 0)
    member_id, upstream_mask = params[:, 0], params[:, 1]
    worker_mask = jobs.worker_mask[jc] | upstream_mask
    wid = np.minimum(worker_id, 255)
    udp_src = rec["udp_srcPort"].astype(np.int64)
    member_bound = jobs.bound_port[jc, wid]
    bound = np.where(member_bound >= 0,
                     (member_bound == ports) & (jobs.bound_bytes[jc, wid] == raw[:, pb._BOUND_COLUMNS]).all(axis=1),
                     ((chains.link_port[jc, wid] == ports[:, None]) & (chains.link_udp[jc, wid] == udp_src[:, None])).any(axis=1))
    is_grad, is_result = msg_type == _GRADIENT, msg_type == _RESULT
    ok = (((raw[:, _FIXED_COLUMNS] & _FIXED_MASK) == _FIXED_VALUE).all(axis=1) & checksum_ok & has_chain & alone
          & (rec["generation"] == jobs.generation[jc]) & bound & (slot < jobs.num_slots[jc]) & (slot_abs < wire.NUM_SLOTS)
          & ((is_grad & ((worker_mask >> np.minimum(worker_id, 63)) & 1 == 1)) | (is_result & (worker_id == member_id))))
    vec = np.flatnonzero(ok)
    if len(vec) == 0:
        STATS["per_frame"] += n
        return pb._one_by_one(pipeline, port_of, pb._listed(frames))
    prepared = _step6(pipeline, jobs, rec, raw, vec, slot_abs, jc, worker_id, params, is_grad)
    STATS["vector"] += len(vec)
    STATS["per_frame"] += n - len(vec)
    frames = pb._listed(frames)
    positions = vec if where is None else where[vec]
    emits = dict(zip(positions.tolist(), prepared))
    out: list[tuple[int, bytes]] = []
    for pos in range(n):
        action = emits.get(pos, False)
        if action is False:
            out += pipeline._process(port_of(pos), frames[pos])
        elif action is not None:
            out += _emit(pipeline, action, port_of(pos))
    return out


def _in_job_table(pipeline: InaPipeline, j: np.ndarray) -> np.ndarray:
    """Whether each job id has an ina_job entry (any job: chain or not, transit excepted: it holds no state)."""
    table = getattr(pipeline, "_batch_job_table", None)
    if table is None or table[0] is not pipeline._job or table[1] is not pipeline._transit:
        present = np.zeros(wire.MAX_JOBS, bool)
        for job in pipeline._job:
            if job < wire.MAX_JOBS and job not in pipeline._transit:
                present[job] = True
        table = pipeline._batch_job_table = (pipeline._job, pipeline._transit, present)
    return table[2][j]


# What a vectorised frame emits: (kind, out frame before the traffic manager, job, member id, group)
_ONWARD, _MULTICAST, _REPLY = 0, 1, 2


def _emit(pipeline: InaPipeline, action: tuple, port: int) -> list[tuple[int, bytes]]:
    kind, out, job, member, group = action
    if kind == _ONWARD:
        return pipeline._send_onward(out, job, member, group, port)
    if kind == _MULTICAST:
        pipeline._multicast_to_job(out)
        return pipeline._replicate(group, out, port)
    pipeline._reply_to_sender(out)
    return pipeline._egress(port, port, 0, out, ina_out=True, ina_mcast=False)


def _step6(pipeline: InaPipeline, jobs: pb._JobArrays, rec: np.ndarray, raw: np.ndarray, vec: np.ndarray, slot_abs: np.ndarray, jc: np.ndarray,
           worker_id: np.ndarray, params: np.ndarray, is_grad: np.ndarray) -> list:
    """MyIngress.apply step 6 (6a, 6b, 6c) for the frames ``vec``, each alone in its slot: registers and counters
    written, and per frame what it emits (an action for ``_emit``) or None."""
    regs = pb._registers(pipeline)
    counters = pipeline.counters
    k = len(vec)
    sa = slot_abs[vec]
    job = jc[vec]
    grad = is_grad[vec]
    seq = rec["seq"][vec].astype(np.int64)
    flags = raw[vec, _OFF["flags"]].astype(np.int64)
    cell = (sa << 1) + (rec["reserved_shadow"][vec] & 1)
    other = cell ^ 1
    p = params[vec]
    member_id, num_upstream, chain_end, next_grp, final_grp = p[:, 0], p[:, 2], p[:, 3], p[:, 4], p[:, 5]
    num_workers = (jobs.num_workers[job] + num_upstream) & 0xFF
    wb = np.left_shift(1, np.minimum(worker_id[vec], 31)) & _M32
    owner = ((jobs.owner_epoch[job] << np.uint64(32)) | (job.astype(np.uint64) << np.uint64(16))
             | rec["generation"][vec].astype(np.uint64))
    stored_owner = regs.gather("ina_owner", sa, np.uint64)
    same_owner = stored_owner == owner
    reset = grad & ~same_owner  # a result never resets a slot
    bitmap = np.where(reset, 0, regs.gather("ina_bitmap", cell))
    count = np.where(reset, 0, regs.gather("ina_count", cell))
    overflow = np.where(reset, 0, regs.gather("ina_overflow", cell))
    stored_seq = np.where(reset, (seq - 1) & _M32, regs.gather("ina_seq", cell))
    final = _gather_list(pipeline.ina_final, cell)
    value = rec["lanes"][vec].astype(np.int64)
    flag_overflow = (flags & _OVERFLOW) != 0
    age = (seq - stored_seq) & _M32
    accept = grad & (bitmap & wb == 0) & np.where(count == 0, (age != 0) & (age < 0x80000000), age == 0)
    stored = ~grad & same_owner & (bitmap != 0) & (count == 0) & (stored_seq == seq) & (final == 0)  # 6c: the final sum
    answer = grad & ~accept & (count == 0) & (age == 0) & (bitmap & wb != 0)  # 6b: from a complete copy
    # --- 6: owner resets
    if reset.any():
        r = np.flatnonzero(reset)
        regs.scatter("ina_owner", sa[r], owner[r])
        zero = np.zeros(len(r), np.int64)
        both = np.concatenate([cell[r], other[r]])
        regs.scatter("ina_bitmap", both, np.concatenate([zero, zero]))
        regs.scatter("ina_count", both, np.concatenate([zero, zero]))
        regs.scatter("ina_overflow", both, np.concatenate([zero, zero]))
        s = (seq[r] - 1) & _M32
        regs.scatter("ina_seq", both, np.concatenate([s, s]))
    # --- 6a: new contributions
    lanes = pipeline.ina_lanes
    a = np.flatnonzero(accept)
    complete = np.zeros(k, bool)
    total = None
    if len(a):
        ca, oa = cell[a], other[a]
        first = count[a] == 0
        other_bitmap = np.where(reset[a], 0, regs.gather("ina_bitmap", oa))
        regs.scatter("ina_bitmap", ca, bitmap[a] | wb[a])
        regs.scatter("ina_bitmap", oa, other_bitmap & ~wb[a] & _M32)
        regs.scatter("ina_seq", ca, seq[a])  # a new round stores seq; an accepted later packet has age 0
        cur = np.where(first[:, None], 0, lanes[ca].astype(np.int64))
        exact = cur + value[a]
        lane_overflow = ((exact < _I32_LOW) | (exact >= _I32_HIGH)).any(axis=1)
        total = (((exact + _I32_HIGH) & _M32) - _I32_HIGH).astype(np.int32)
        ov = np.where(first, 0, overflow[a]) | flag_overflow[a] | lane_overflow
        overflow[a] = ov
        c = (count[a] + 1) & 0xFF
        done = c == num_workers[a]
        complete[a] = done
        regs.scatter("ina_count", ca, np.where(done, 0, c))
        lanes[ca] = total
        regs.scatter("ina_overflow", ca, ov.astype(np.int64))
        # ina_final: 0 on a new round, 1 where this completes the chain's end
        fin = np.where(done & (chain_end[a] != 0), 1, np.where(first, 0, final[a]))
        final[a] = fin
        _scatter_list(pipeline.ina_final, ca, fin)
        _add_per_job(counters["MyIngress.ina_aggregated"], job[a])
    # --- 6c: the final sum kept
    f = np.flatnonzero(stored)
    if len(f):
        lanes[cell[f]] = value[f]
        _scatter_list(pipeline.ina_final, cell[f], np.ones(len(f), np.int64))
        regs.scatter("ina_overflow", cell[f], flag_overflow[f].astype(np.int64))
    dup = ~accept & ~stored
    if dup.any():
        _add_per_job(counters["MyIngress.ina_duplicates"], job[dup])
    # --- what each frame emits, in the frame's own bytes (the traffic manager runs per output, in order)
    actions: list = [None] * k
    emitting = np.flatnonzero(complete | answer | stored)
    if not len(emitting):
        return actions
    out = raw[vec[emitting]].copy()
    e_complete, e_answer = complete[emitting], answer[emitting]
    data = lanes[cell[emitting]]  # the copy after this batch: the sum (complete), what it held (answer), the final sum
    sums = e_complete | e_answer
    out[sums, _O_DATA:_LEN] = data[sums].astype(wire.LANES_DTYPE).view(np.uint8).reshape(-1, wire.INA_DATA_LEN)
    out[sums, _O_INA] = _RESULT
    ov = overflow[emitting] != 0
    fl = np.where(ov, _OVERFLOW, 0)
    fl = np.where(e_answer & (final[emitting] != 1), fl | _RETRANSMIT, fl)
    fl = np.where(sums, fl, flags[emitting] & _OVERFLOW)
    out[:, _OFF["flags"]] = fl
    rows = pb.rows_as_bytes(out)
    e_job, e_member = job[emitting].tolist(), member_id[emitting].tolist()
    onward = (e_complete & (chain_end[emitting] == 0)) | (e_answer & (final[emitting] != 1))
    reply = e_answer & (final[emitting] == 1)
    nxt, fin_grp = next_grp[emitting].tolist(), final_grp[emitting].tolist()
    for i, (row, is_onward, is_reply) in enumerate(zip(rows, onward.tolist(), reply.tolist())):
        kind = _ONWARD if is_onward else _REPLY if is_reply else _MULTICAST
        actions[int(emitting[i])] = (kind, bytearray(row), e_job[i], e_member[i], nxt[i] if is_onward else fin_grp[i])
    return actions


def _scatter_list(values: list, index: np.ndarray, new: np.ndarray) -> None:
    for i, v in zip(index.tolist(), new.tolist()):
        values[i] = v


def _add_per_job(counter: list[int], jobs: np.ndarray) -> None:
    if len(jobs) and (jobs == jobs[0]).all():
        counter[int(jobs[0])] += len(jobs)
        return
    for job, c in zip(*np.unique(jobs, return_counts=True)):
        counter[int(job)] += int(c)
