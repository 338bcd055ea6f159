"""The pipeline model on a batch of frames: numpy across the batch, state in arrival order.

``process_batch(pipeline, port, frames)`` returns exactly what ``pipeline.process(port, f)`` for each frame in
turn would return, concatenated, and leaves the registers and counters exactly as that would (the
equivalence tests in tests/unit/test_pipeline_batch.py check both on random sequences). ``port`` may be one
port per frame: the packet rings hand over every port's frames of one wake-up as one batch.

Only the common case is vectorised: whole INA gradients from a data port that pass every check of
``MyIngress.apply`` step 4 (parser states, checksum, lengths, job, generation, worker, binding, slot). The
gradients into one slot form a run in arrival order; the leading part of each run that the per-frame path
would accept one after the other into the same copy (one seq, one owner, distinct workers, no completion
before its last gradient) is aggregated at once: the slot's state read once per run, the lanes summed as a
segmented sum with the int32 overflow test at every step, the state written once. With one worker's window
(distinct slots) every run is one gradient. Every other frame (the rest of a run, a retransmission or late
duplicate, a drop, a broadcast, anything not INA, packet-outs) goes through ``pipeline._process`` one at a
time, in arrival order, afterwards: it follows its own slot's aggregated part and touches no other
aggregated slot, and the counters the two groups share are sums, so the two groups commute. Outputs are put
back in arrival order.

Loss signals (counted gradients, docs/protocol.md "Loss signals"): their registers are per member and per job,
not per slot, so the order across slots matters. A batch with counted gradients is vectorised only whole: every
frame aggregated here (no resend, duplicate, drop or other frame) and no gap in any member's counter (the
common lossless case); then each member's ina_tx_next ends as its last counted frame writes it, and each
completion names the previous one in arrival order (``_tx_counters``, ``_stamp_prev_done``). Any other batch
with counted gradients (a gap: loss; a late frame, reordered or duplicated, that leaves its member's counter
as it is) goes one frame at a time.
"""
from __future__ import annotations

import array
from collections import deque
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from inaproto import wire

if TYPE_CHECKING:
    from softswitch.pipeline import InaPipeline

# Fewer frames than this go one at a time: numpy's fixed cost (about 45 operations per batch, plus a few per
# egress port for the rows) outweighs the per-frame path. Measured per gradient (8 workers, CPU time, loaded
# machine): 15.6 us vectorised against 6.4 one at a time at 8 frames, 7.7 / 8.3 at 16, 5.7 / 6.1 at 32,
# 2.0 / 6.0 at 64 (docs/switch.md, Benchmark).
VECTOR_MIN = 32
_LEN = wire.INA_FRAME_LEN
_O_IP, _O_UDP, _O_INA = wire.ETH_LEN, wire.ETH_LEN + wire.IPV4_LEN, wire.INA_OFFSET
_O_DATA = wire.INA_OFFSET + wire.INA_HEADER_LEN
_TX_COUNTED, _PREV_DONE = int(wire.Flags.TX_COUNTED), int(wire.Flags.PREV_DONE)
# Counted gradients of several members up to this many per batch are checked in one Python loop over integers
# (about 0.12 us a frame), more with numpy (about 25 array operations a batch): the loop is cheaper below it.
TX_LOOP_MAX = 192
_O_FLAGS, _O_RS = _O_INA + wire.INA_FIELD_OFFSETS["flags"], _O_INA + wire.INA_FIELD_OFFSETS["reserved_shadow"]
_O_SEQ_LOW = _O_INA + wire.INA_FIELD_OFFSETS["seq"] + 3  # the seq's last byte (big-endian): its low 7 bits
_PREV_DONE_ROW = np.full(1 << 16, _PREV_DONE, np.uint8)  # PREV_DONE for every completion of a batch
_PREV_DONE_ROW.flags.writeable = False
_CONSECUTIVE = bytes(i & 0x7F for i in range(128 + TX_LOOP_MAX + (1 << 16)))  # counters t, t + 1, ... mod 128
_INA_PORT_BYTES = np.frombuffer(wire.INA_UDP_PORT.to_bytes(2, "big"), np.uint8)
DROP_PORT = 511
_OFF = {name: _O_INA + off for name, off in wire.INA_FIELD_OFFSETS.items()}
# A whole INA frame as a numpy record: what the vectorised parser reads (names as in p4src/ina.p4's headers).
FRAME_DTYPE = np.dtype({
    "names": ["eth_src_hi", "eth_src_lo", "ipv4_src", "udp_srcPort", "etherType", "version_ihl", "totalLen", "protocol", "ipv4_words", "udp_dstPort", "udp_length",
              "msg_type", "flags", "job_id", "generation", "slot", "seq", "worker_id", "reserved_shadow", "lanes"],
    "formats": [">u2", ">u4", ">u4", ">u2", ">u2", "u1", ">u2", "u1", (">u2", (10,)), ">u2", ">u2", "u1", "u1", ">u2", ">u2", ">u2", ">u4", "u1", "u1",
                (wire.LANES_DTYPE, (wire.LANES,))],
    "offsets": [6, 8, _O_IP + 12, _O_UDP, 12, _O_IP, _O_IP + 2, _O_IP + 9, _O_IP, _O_UDP + 2, _O_UDP + 4, _OFF["msg_type"], _OFF["flags"], _OFF["job_id"],
                _OFF["generation"], _OFF["slot"], _OFF["seq"], _OFF["worker_id"], _OFF["reserved_shadow"], _O_DATA],
    "itemsize": _LEN,
})


# Bytes every vectorised gradient carries whatever its job: etherType IPv4, IHL 5 (the version nibble is not
# checked, as the parser does not), totalLen, protocol UDP, UDP dstPort INA, UDP length, msg_type GRADIENT.
_FIXED = [(12, 0xFF, 0x08), (13, 0xFF, 0x00), (_O_IP, 0x0F, 5),
          *((_O_IP + 2 + i, 0xFF, b) for i, b in enumerate(wire.INA_IPV4_LEN.to_bytes(2, "big"))), (_O_IP + 9, 0xFF, 17),
          *((_O_UDP + 2 + i, 0xFF, b) for i, b in enumerate(wire.INA_UDP_PORT.to_bytes(2, "big"))),
          *((_O_UDP + 4 + i, 0xFF, b) for i, b in enumerate(wire.INA_UDP_LEN.to_bytes(2, "big"))),
          (_OFF["msg_type"], 0xFF, int(wire.MsgType.GRADIENT))]
_FIXED_COLUMNS = np.array([c for c, _, _ in _FIXED])
_FIXED_MASK = np.array([m for _, m, _ in _FIXED], np.uint8)
_FIXED_VALUE = np.array([v for _, _, v in _FIXED], np.uint8)
# What ina_binding's bind_member checks, in the frame: source MAC, source IPv4 address, UDP source port.
_BOUND_COLUMNS = np.r_[6:12, _O_IP + 12 : _O_IP + 16, _O_UDP : _O_UDP + 2]

# Bytes before the lanes that one sender's gradients share (all but the IPv4 identification and checksum, the
# UDP checksum, and the INA flags, slot, seq and shadow fields): equal on every frame of a batch, the checks
# that read only them (everything but the checksum and the slot) are made once.
_PER_FRAME = {*range(_O_IP + 4, _O_IP + 6), *range(_O_IP + 10, _O_IP + 12), *range(_O_UDP + 6, _O_UDP + 8)} | {
    _OFF[name] + i for name, size in wire.INA_HEADER_BYTES if name in ("flags", "slot", "seq", "reserved_shadow")
    for i in range(size)}
_IDENTITY_COLUMNS = np.array([c for c in range(_O_DATA) if c not in _PER_FRAME])


@dataclass(frozen=True)
class FrameBlock:
    """Output frames of one length as one array: row ``i`` goes out of port ``ports[i]``; rows in emission order.

    What ``process_batch(..., as_block=True)`` returns in the common case (every frame of the batch vectorised,
    one job's results), so the packet rings can take each port's rows with one copy (``PacketRing.send_rows``).
    ``period`` r > 0 says the ports repeat with period r and the first r are distinct (the replicas of each
    result), so a port's rows are a strided view.
    """

    ports: np.ndarray  # (n,) int64
    frames: np.ndarray  # (n, length) uint8
    period: int = 0

    def __len__(self) -> int:
        return len(self.ports)

    def as_list(self) -> list[tuple[int, bytes]]:
        """The frames as ``process`` returns them: [(port, frame)]."""
        blob, size = self.frames.tobytes(), self.frames.shape[1]
        return list(zip(self.ports.tolist(), [blob[o : o + size] for o in range(0, len(blob), size)]))

    def by_port(self) -> dict[int, np.ndarray]:
        """Each port's rows in emission order; the ports in the order of their last row."""
        ports = self.ports
        if not len(ports):
            return {}
        r = self.period
        if r:
            return {p: self.frames[j::r] for j, p in enumerate(ports[:r].tolist())}
        unique, first_from_end = np.unique(ports[::-1], return_index=True)
        return {int(p): self.frames[ports == p] for p in unique[np.argsort(-first_from_end)].tolist()}


def rows_as_bytes(rows: np.ndarray) -> list[bytes]:
    """An (n, length) uint8 array as n bytes objects."""
    blob, size = rows.tobytes(), rows.shape[1]
    return [blob[o : o + size] for o in range(0, len(blob), size)]


class _JobArrays:
    """Tables ina_job (indexed by job id) and ina_binding (by job id, member id) as arrays (rebuilt when the
    control plane changes the tables)."""

    def __init__(self, jobs: dict[int, tuple[int, ...]], bindings: dict[tuple[int, int], tuple]) -> None:
        self.source = jobs
        self.binding_source = bindings
        n = wire.MAX_JOBS
        self.known = np.zeros(n, bool)
        self.base_slot, self.num_slots, self.worker_mask, self.num_workers, self.mcast_grp, self.generation = (
            np.zeros(n, np.int64) for _ in range(6))
        self.owner_epoch = np.zeros(n, np.uint64)
        for job_id, (base, num, mask, workers, grp, gen, epoch) in jobs.items():
            if job_id < n:
                self.known[job_id] = True
                self.base_slot[job_id], self.num_slots[job_id], self.worker_mask[job_id] = base, num, mask
                self.num_workers[job_id], self.mcast_grp[job_id], self.generation[job_id] = workers, grp, gen
                self.owner_epoch[job_id] = epoch
        # ina_binding: port -1 where (job, member) has no binding, so that no ingress port matches; the bytes a
        # frame must carry at _BOUND_COLUMNS (source MAC, IPv4 address, UDP port)
        self.bound_port = np.full((n, 256), -1, np.int64)
        self.bound_bytes = np.zeros((n, 256, len(_BOUND_COLUMNS)), np.uint8)
        for (job_id, member), (port, mac, ip, udp) in bindings.items():
            if job_id < n:
                self.bound_port[job_id, member] = port
                self.bound_bytes[job_id, member] = np.frombuffer(mac + ip + udp, np.uint8)


def _job_arrays(pipeline: InaPipeline) -> _JobArrays:
    arrays = getattr(pipeline, "_batch_jobs", None)
    # _refresh builds new dicts on every write
    if arrays is None or arrays.source is not pipeline._job or arrays.binding_source is not pipeline._binding:
        arrays = pipeline._batch_jobs = _JobArrays(pipeline._job, pipeline._binding)
        # chains, transit and members bound by link (bind_link): one frame at a time
        link_bound = {job_id for job_id, _ in pipeline._link_binding}
        for job_id in set(pipeline._chain) | pipeline._transit | link_bound:
            if job_id < wire.MAX_JOBS:
                arrays.known[job_id] = False
    return arrays


class _Registers:
    """Numpy views of the pipeline's registers where they are ``array.array`` (InaPipeline.reset_registers), so
    a batch reads and writes them with one fancy-index operation each; lists are read and written element by
    element (in C)."""

    NAMES = ("ina_owner", "ina_bitmap", "ina_count", "ina_overflow", "ina_seq")

    def __init__(self, pipeline: InaPipeline) -> None:
        self.source = tuple(getattr(pipeline, name) for name in self.NAMES)
        self.views = {}
        for name, values in zip(self.NAMES, self.source):
            if isinstance(values, array.array) and values.typecode in "qQ":
                self.views[name] = np.frombuffer(values, np.uint64 if values.typecode == "Q" else np.int64)
        self.lists = {name: values for name, values in zip(self.NAMES, self.source)}

    def gather(self, name: str, index: np.ndarray, dtype: type = np.int64) -> np.ndarray:
        view = self.views.get(name)
        if view is not None:
            return view[index]
        values = self.lists[name]
        if len(index) == 1:
            return np.array([values[int(index[0])]], dtype)
        return np.array(itemgetter(*index.tolist())(values), dtype)

    def scatter(self, name: str, index: np.ndarray, new: np.ndarray) -> None:
        view = self.views.get(name)
        if view is not None:
            view[index] = new
        else:
            deque(map(self.lists[name].__setitem__, index.tolist(), new.tolist()), maxlen=0)  # values[index] = new, in C


def _registers(pipeline: InaPipeline) -> _Registers:
    regs = getattr(pipeline, "_batch_registers", None)
    if regs is None or any(a is not b for a, b in zip(regs.source, (getattr(pipeline, n) for n in _Registers.NAMES))):
        regs = pipeline._batch_registers = _Registers(pipeline)
    return regs


_M32 = 0xFFFFFFFF
_I32_LOW, _I32_HIGH = -(2**31), 2**31


def _wrap32(x: np.ndarray) -> np.ndarray:
    """int64 values wrapped to int32's range (bit<32> arithmetic), still as int64."""
    return ((x + _I32_HIGH) & _M32) - _I32_HIGH


_SLOT_MARK = np.zeros(wire.NUM_SLOTS, np.int64)  # scratch for finding slots used twice in a batch (one I/O thread)
_MEMBER_MARK = np.zeros(wire.MAX_JOBS * 32, np.int64)  # the same for ina_tx_next's indices (job, member)
_POSITIONS = np.arange(1 << 16)


def _distinct(slots: np.ndarray, mark: np.ndarray = _SLOT_MARK) -> bool:
    """Whether no value occurs twice in ``slots`` (values in 0..len(mark)-1)."""
    index = _POSITIONS[: len(slots)] if len(slots) <= len(_POSITIONS) else np.arange(len(slots))
    mark[slots] = index  # the last occurrence of each value wins
    return bool((mark[slots] == index).all())


def _port_of(ingress_port: int | np.ndarray):
    """A function from a frame's position to its ingress port."""
    if isinstance(ingress_port, np.ndarray):
        ports = ingress_port.tolist()
        return ports.__getitem__
    return lambda _pos: ingress_port


def process_batch(pipeline: InaPipeline, ingress_port: int | np.ndarray, frames: list[bytes] | np.ndarray, *,
                  vector_min: int = VECTOR_MIN, chain_vector_min: int | None = None, as_block: bool = False
                  ) -> list[tuple[int, bytes]] | FrameBlock:
    """Every frame of ``frames`` (in that order) through the pipeline; the caller holds ``pipeline.lock``. The
    outputs are those of ``process`` frame after frame, in the same order.

    ``ingress_port`` is the port all frames came in on, or an int64 array of one port per frame (the union of
    several ports' batches: the packet rings' one batch per wake-up). ``frames`` is a list of bytes or an
    (n, length) uint8 array of equal-length frames (what the packet rings gather). With ``as_block`` the
    outputs may come back as a ``FrameBlock`` (when every frame was vectorised and the results are one job's),
    else as [(port, frame)]. A batch with frames of a job on chains is ``pipeline_chains.process_chain_batch``'s
    from ``chain_vector_min`` frames on (by default ``pipeline_chains.CHAIN_VECTOR_MIN``; None: one at a time)."""
    from softswitch import pipeline_chains  # it builds on this module

    n = len(frames)
    chain_min = pipeline_chains.CHAIN_VECTOR_MIN if chain_vector_min is None else chain_vector_min
    low = min(vector_min, chain_min) if pipeline._chain and chain_min is not None else vector_min
    per_frame = isinstance(ingress_port, np.ndarray)
    port_of = _port_of(ingress_port)
    cpu = (ingress_port == wire.CPU_PORT).any() if per_frame else ingress_port == wire.CPU_PORT
    if isinstance(frames, np.ndarray):
        if n < low or cpu or frames.shape[1] != _LEN:
            return _one_by_one(pipeline, port_of, rows_as_bytes(frames))
        rec = frames.reshape(-1).view(FRAME_DTYPE)
        where = None  # every frame: positions are indices
    else:
        if n < low or cpu:
            return _one_by_one(pipeline, port_of, frames)
        # --- MyParser and MyVerifyChecksum for every whole INA-sized frame at once
        lengths = list(map(len, frames))
        sized = range(n) if lengths.count(_LEN) == n else [i for i, m in enumerate(lengths) if m == _LEN]
        if len(sized) < low or (len(sized) < n and wire.INA_QUERY_FRAME_LEN in lengths):  # a query reads a slot
            return _one_by_one(pipeline, port_of, frames)
        if len(sized) == n:
            rec = np.frombuffer(b"".join(frames), dtype=FRAME_DTYPE)
            where = None
        else:
            rec = np.frombuffer(b"".join([frames[i] for i in sized]), dtype=FRAME_DTYPE)
            where = np.array(sized)
    if pipeline._chain and pipeline_chains.has_chain_frames(pipeline, rec):
        if chain_min is None or n < chain_min or (where is not None and max(lengths) > _LEN):  # (a longer INA
            # frame may name any slot)
            pipeline_chains.STATS["small"] += n
            return _one_by_one(pipeline, port_of, _listed(frames))
        return pipeline_chains.process_chain_batch(pipeline, port_of, ingress_port, frames, rec, where)
    if len(rec) < vector_min:
        return _one_by_one(pipeline, port_of, _listed(frames))
    raw = rec.view(np.uint8).reshape(len(rec), _LEN)
    counted = raw[:, _O_FLAGS] & _TX_COUNTED
    n_counted = np.count_nonzero(counted)
    if n_counted:
        # loss signals: a batch with counted gradients must be one whose every frame is aggregated here (checked
        # below), so the counters and the previous completion follow arrival order (see _tx_counters); counted
        # frames only among the frames of other lengths (all per-frame, in arrival order) share no state with it
        if where is not None:
            return _one_by_one(pipeline, port_of, _listed(frames))
        counted = None if n_counted == len(rec) else np.flatnonzero(counted)
    sender = None
    # MyVerifyChecksum: the checksum field equals 0xFFFF - folded sum of the other nine words (never 0 here:
    # IHL is 5), i.e. (0xFFFF - rest % 0xFFFF) % 0xFFFF
    words = rec["ipv4_words"]
    checksum = words[:, 5]
    rest = words.sum(axis=1, dtype=np.int64) - checksum
    jobs = _job_arrays(pipeline)
    slot = rec["slot"].astype(np.int64)
    checksum_ok = checksum == (0xFFFF - rest % 0xFFFF) % 0xFFFF
    if not per_frame and (raw[:, _IDENTITY_COLUMNS] == raw[0, _IDENTITY_COLUMNS]).all():
        # one sender's frames (one worker's window): the checks of its identity on the first frame only
        first = raw[0]
        job, worker = int(rec["job_id"][0]), int(rec["worker_id"][0])
        job_id, worker_id = np.full(len(rec), job, np.int64), np.full(len(rec), worker, np.int64)
        if not (((first[_FIXED_COLUMNS] & _FIXED_MASK) == _FIXED_VALUE).all() and job < wire.MAX_JOBS
                and jobs.known[job] and int(rec["generation"][0]) == jobs.generation[job]
                and (int(jobs.worker_mask[job]) >> min(worker, 63)) & 1 and jobs.bound_port[job, worker] == ingress_port
                and (jobs.bound_bytes[job, worker] == first[_BOUND_COLUMNS]).all()):
            return _one_by_one(pipeline, port_of, _listed(frames))
        slot_abs = int(jobs.base_slot[job]) + slot
        sender = (job, worker)
        ok = checksum_ok & (slot < jobs.num_slots[job]) & (slot_abs < wire.NUM_SLOTS)
    else:
        job_id = rec["job_id"].astype(np.int64)
        j = np.minimum(job_id, wire.MAX_JOBS - 1)
        worker_id = rec["worker_id"].astype(np.int64)
        slot_abs = jobs.base_slot[j] + slot
        ports = ingress_port if where is None or not per_frame else ingress_port[where]
        # --- MyIngress.apply steps 2-4: a valid gradient of a known job, bound worker and slot
        ok = (((raw[:, _FIXED_COLUMNS] & _FIXED_MASK) == _FIXED_VALUE).all(axis=1) & checksum_ok
              & (job_id < wire.MAX_JOBS) & jobs.known[j] & (rec["generation"] == jobs.generation[j])
              & ((jobs.worker_mask[j] >> np.minimum(worker_id, 63)) & 1 == 1)
              & (jobs.bound_port[j, worker_id] == ports)
              & (jobs.bound_bytes[j, worker_id] == raw[:, _BOUND_COLUMNS]).all(axis=1)
              & (slot < jobs.num_slots[j]) & (slot_abs < wire.NUM_SLOTS))
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return _one_by_one(pipeline, port_of, _listed(frames))
    tx_writes = None
    if n_counted:
        if len(cand) < n:
            return _one_by_one(pipeline, port_of, _listed(frames))
        tx_writes = _tx_counters(pipeline, raw, counted, job_id, worker_id, sender, jobs.generation)
        if tx_writes is None:  # a gap: its report depends on the frame's fate
            return _one_by_one(pipeline, port_of, _listed(frames))
    agg = _aggregate_runs(pipeline, rec, cand, slot_abs, job_id, worker_id, jobs, whole=n_counted > 0)
    if agg is None:
        return _one_by_one(pipeline, port_of, _listed(frames))
    vec, done, total, overflow, jc_done = agg
    stamps = None
    done_rows = raw[done]  # a copy: the results are built in it
    if n_counted:
        members, values = tx_writes
        if isinstance(members, np.ndarray):
            np.frombuffer(pipeline.ina_tx_next, np.int64)[members] = values
        else:
            deque(map(pipeline.ina_tx_next.__setitem__, members, values), maxlen=0)
        if len(done):
            stamps = _stamp_prev_done(pipeline, done_rows, counted is None, jc_done, jobs.generation)
    # --- outputs, in arrival order: the completed slots' results and every frame of the per-frame path
    vector_pos = vec if where is None else where[vec]
    blocks = _replica_blocks(pipeline, done_rows, total, overflow, jc_done, jobs, stamps) if len(done) else {}
    if len(vector_pos) == n and sum(len(b[0]) for b in blocks.values()) == len(done):
        # the common case: nothing else to interleave
        if as_block and len(blocks) <= 1:
            if not blocks:
                return FrameBlock(np.zeros(0, np.int64), np.zeros((0, _LEN), np.uint8))
            (mine, ports, out, period), = blocks.values()
            return FrameBlock(_tiled(ports, len(mine)), out, period)
        replicas = _replica_lists(blocks)
        return [out for i in range(len(done)) for out in replicas[i]]
    replicas = _replica_lists(blocks)
    frames = _listed(frames)
    results: dict[int, tuple[int, bytes] | list[tuple[int, bytes]]] = {}
    done_pos = (done if where is None else where[done]).tolist()
    for i, pos in enumerate(done_pos):
        results[pos] = replicas.get(i) or (i, frames[pos])
    rest_pos = np.ones(n, bool)
    rest_pos[vector_pos] = False
    pending = sorted(set(np.flatnonzero(rest_pos).tolist()) | results.keys())
    if not pending:
        return []
    out: list[tuple[int, bytes]] = []
    total_be = total.astype(wire.LANES_DTYPE)
    mcast = jobs.mcast_grp[jc_done]
    for pos in pending:
        hit = results.get(pos)
        if hit is None:
            out += pipeline._process(port_of(pos), frames[pos])
            continue
        if isinstance(hit, list):  # replicas built by _replica_blocks
            out += hit
            continue
        i, frame = hit
        res = bytearray(frame)
        res[_O_DATA:_LEN] = total_be[i].tobytes()
        res[_O_INA] = int(wire.MsgType.RESULT)
        res[_OFF["flags"]] = int(wire.Flags.OVERFLOW) if overflow[i] else 0
        if stamps is not None:
            res[_OFF["flags"]] |= int(stamps[0][i])
            res[_OFF["reserved_shadow"]] = int(stamps[1][i])
        pipeline._multicast_to_job(res)
        out += pipeline._replicate(int(mcast[i]), res, port_of(pos))
    return out


def _aggregate_runs(pipeline: InaPipeline, rec: np.ndarray, cand: np.ndarray, slot_abs: np.ndarray, job_id: np.ndarray,
                    worker_id: np.ndarray, jobs: _JobArrays, *, whole: bool = False):
    """MyIngress.apply step 6 for the valid gradients ``cand`` (indices into ``rec``, arrival order), a run per slot.

    The gradients into one slot form a run in arrival order. The leading part of each run that the per-frame
    path would accept one after the other into one copy (same copy, seq and owner, distinct workers, the first
    accepted by the slot's state, no completion before its last) is aggregated at once: the slot's state is read
    once per run, the lanes are a segmented sum (int64, wrapped to int32, overflow tested at every step as
    the per-frame addition does) and written once. The rest of a run, and every other frame, goes through the
    per-frame path afterwards in arrival order; since it follows the aggregated part of its own slot's run and
    touches no other slot, the state it reads is the state the per-frame path would have read.

    Returns (the indices into ``rec`` aggregated, arrival order; the indices of the gradients that completed a
    slot, arrival order; their totals (int32); their overflow flags; their jobs), or None if nothing is
    aggregated, or with ``whole`` if not every gradient of ``cand`` would be (then no state has changed)."""
    m = len(cand)
    sa = slot_abs[cand]
    if _distinct(sa):
        order = None  # every run is one gradient (one worker's window): arrival order as it is
        starts = np.arange(m)
    else:
        order = np.argsort(sa, kind="stable")
        cand, sa = cand[order], sa[order]
        new_run = np.empty(m, bool)
        new_run[0] = True
        np.not_equal(sa[1:], sa[:-1], out=new_run[1:])
        starts = np.flatnonzero(new_run)
    runs = len(starts)
    seq = rec["seq"][cand].astype(np.int64)
    cell = (sa << 1) + (rec["reserved_shadow"][cand] & 1)
    jc, wid = job_id[cand], worker_id[cand]
    # owner_epoch ++ job_id ++ generation, as uint64 (the epoch may use all 32 bits)
    owner = ((jobs.owner_epoch[jc] << np.uint64(32)) | (jc.astype(np.uint64) << np.uint64(16))
             | rec["generation"][cand].astype(np.uint64))
    wb = np.left_shift(1, wid)  # < 32: the worker is in the job's mask
    # the slot's state as the run's first gradient finds it (owner reset included)
    sa_r, cell_r, seq_r, owner_r, wb_r, jc_r = (a[starts] for a in (sa, cell, seq, owner, wb, jc)) if order is not None \
        else (sa, cell, seq, owner, wb, jc)
    regs = _registers(pipeline)
    reset = regs.gather("ina_owner", sa_r, np.uint64) != owner_r
    bitmap = np.where(reset, 0, regs.gather("ina_bitmap", cell_r))
    count = np.where(reset, 0, regs.gather("ina_count", cell_r))
    overflow = np.where(reset, 0, regs.gather("ina_overflow", cell_r))
    stored_seq = np.where(reset, (seq_r - 1) & _M32, regs.gather("ina_seq", cell_r))
    age = (seq_r - stored_seq) & _M32
    num_workers = jobs.num_workers[jc_r]
    accept = (bitmap & wb_r == 0) & np.where(count == 0, (age != 0) & (age < 0x80000000), age == 0)
    if order is None:
        length = accept.astype(np.int64)  # gradients aggregated per run: 1 or 0
        vec_sorted = accept
    else:
        # the leading part of each run that joins its first gradient's round
        run_of = np.cumsum(new_run) - 1
        rank = np.arange(m) - starts[run_of]
        key = (sa << 8) | wid  # a worker twice in one run: a resend, never joined
        by_key = np.argsort(key, kind="stable")
        repeat = np.zeros(m, bool)
        repeat[by_key[1:]] = key[by_key[1:]] == key[by_key[:-1]]
        joins = ((cell == cell_r[run_of]) & (seq == seq_r[run_of]) & (owner == owner_r[run_of]) & ~repeat
                 & (bitmap[run_of] & wb == 0) & (count[run_of] + rank < num_workers[run_of]) & accept[run_of])
        length = np.minimum.reduceat(np.where(joins, m, rank), starts)  # the first rank that does not join
        length = np.minimum(length, np.diff(starts, append=m))
        vec_sorted = rank < length[run_of]
    if whole and not vec_sorted.all():
        return None
    active = np.flatnonzero(length)
    if not len(active):
        return None
    if len(active) < runs:
        sa_r, cell_r, seq_r, owner_r, jc_r, reset, bitmap, count, overflow, num_workers, length = (
            a[active] for a in (sa_r, cell_r, seq_r, owner_r, jc_r, reset, bitmap, count, overflow, num_workers, length))
    vec = cand[vec_sorted]  # rec indices aggregated, sorted by slot
    value = rec["lanes"][vec].astype(np.int64)
    wb_v = wb[vec_sorted]
    if order is None:
        bits, last, sums = wb_v, np.arange(len(vec)), value
    else:
        first_v = np.flatnonzero(rank[vec_sorted] == 0)  # each active run's start in the aggregated gradients
        last = np.append(first_v[1:], len(vec)) - 1
        bits = np.add.reduceat(wb_v, first_v)  # distinct workers' bits: the sum is the OR
        sums = np.cumsum(value, axis=0)
        sums -= np.repeat(sums[first_v] - value[first_v], length, axis=0)  # each run's running sum
    # --- 6a for every run's aggregated part at once
    if reset.any():
        r = np.flatnonzero(reset)
        other_r = cell_r[r] ^ 1
        regs.scatter("ina_owner", sa_r[r], owner_r[r])
        zero = np.zeros(len(r), np.int64)
        regs.scatter("ina_count", other_r, zero)
        regs.scatter("ina_overflow", other_r, zero)
        regs.scatter("ina_seq", other_r, (seq_r[r] - 1) & _M32)
    other = cell_r ^ 1
    other_bitmap = np.where(reset, 0, regs.gather("ina_bitmap", other))
    regs.scatter("ina_bitmap", cell_r, bitmap | bits)
    regs.scatter("ina_bitmap", other, other_bitmap & ~bits & _M32)
    first = count == 0
    regs.scatter("ina_seq", cell_r, seq_r)  # a new round stores seq; an accepted later packet has age 0
    count = count + length
    complete = count == num_workers
    regs.scatter("ina_count", cell_r, np.where(complete, 0, count))
    cur = np.where(first[:, None], 0, pipeline.ina_lanes[cell_r].astype(np.int64))
    exact = sums + (cur if order is None else np.repeat(cur, length, axis=0))  # the running sums, unwrapped
    if exact.min() >= _I32_LOW and exact.max() < _I32_HIGH:
        # every running sum within int32 (the common case): nothing wrapped, no step overflowed
        lane_overflow = np.zeros(len(last), bool)
    else:
        before = _wrap32(exact - value)  # what each addition found in the slot (int32 wraps, as bit<32> does)
        step_overflow = ((before + value < _I32_LOW) | (before + value >= _I32_HIGH)).any(axis=1)
        lane_overflow = step_overflow if order is None else np.logical_or.reduceat(step_overflow, last - length + 1)
    total = _wrap32(exact[last]).astype(np.int32)
    overflow = np.where(lane_overflow, 1, np.where(first, 0, overflow))
    pipeline.ina_lanes[cell_r] = total
    regs.scatter("ina_overflow", cell_r, overflow)
    aggregated = pipeline.counters["MyIngress.ina_aggregated"]
    if jc_r[0] == jc_r[-1] and (jc_r == jc_r[0]).all():
        aggregated[int(jc_r[0])] += len(vec)
    else:
        for job, k in zip(*np.unique(jc_r, return_counts=True)):
            aggregated[int(job)] += int(length[jc_r == job].sum())
    # the completing gradient of each complete run, in arrival order
    done_runs = np.flatnonzero(complete)
    done = vec[last[done_runs]]
    if order is not None:
        vec = np.sort(vec)
        if len(done) > 1:
            arrival = np.argsort(done)
            done, done_runs = done[arrival], done_runs[arrival]
    return vec, done, total[done_runs], overflow[done_runs], jc_r[done_runs]


def _tx_counters(pipeline: InaPipeline, raw: np.ndarray, c: np.ndarray | None, job_id: np.ndarray, worker_id: np.ndarray,
                 sender: tuple[int, int] | None, generation: np.ndarray
                 ) -> tuple[np.ndarray | list[int], np.ndarray | list[int]] | None:
    """Step 6t for the counted gradients of a batch whose every frame is aggregated here (``raw`` the frames,
    ``c`` the counted ones' indices, None: every frame; ``sender``: (job, worker) when all are one member's): if
    each continues its member's transmission counter (the first the one ina_tx_next expects, or any if none of
    the job's generation (``generation``: per job, every frame's here);
    each next one the previous plus 1, mod 128), none reveals a gap and each writes its own counter plus 1
    whatever its fate, so the registers end as the last one per member writes them: (their indices, those
    values). None if any does not continue its member's counter: a gap (its gap report depends on its fate) or a
    late frame (behind the counter: no report, no write); the batch goes one frame at a time (both are rare)."""
    tx = (raw[:, _O_RS] if c is None else raw[c, _O_RS]) >> 1  # uint8
    n = len(tx)
    tx_next = pipeline.ina_tx_next
    if sender is not None or n <= TX_LOOP_MAX:
        # each member's frames in one piece (one worker's window, or port after port) compared as bytes with a
        # run of consecutive counters; members in pieces or seen twice in one dictionary
        txs = tx.tobytes()
        if sender is not None:
            member = (sender[0] << 5) + sender[1]
            runs = [(member, 0, n)]
        else:
            idx = (job_id << 5) + worker_id if c is None else (job_id[c] << 5) + worker_id[c]  # job_id*32 + worker
            cuts = np.flatnonzero(idx[1:] != idx[:-1]).tolist()
            starts = [0, *(i + 1 for i in cuts)]
            runs = list(zip(idx[starts].tolist(), starts, [*starts[1:], n]))
        following: dict[int, int] = {}
        for member, a, b in runs:
            t0 = txs[a]
            if txs[a:b] != _CONSECUTIVE[t0 : t0 + b - a]:
                return None
            e = following.get(member)
            if e is None:
                e = tx_next[member]
                if e & 0x80 and e >> 8 == generation[member >> 5] and e & 0x7F != t0:
                    return None
            elif e != t0:
                return None
            following[member] = txs[b - 1] + 1 & 0x7F
        return list(following), [int(generation[m >> 5]) << 8 | 0x80 | t for m, t in following.items()]
    idx = (job_id << 5) + worker_id if c is None else (job_id[c] << 5) + worker_id[c]  # job_id * 32 + worker_id
    new = np.empty(n, bool)
    new[0] = True
    np.not_equal(idx[1:], idx[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    if not _distinct(idx[starts], _MEMBER_MARK):  # a member's frames not in one piece (not port after port): sort
        order = np.argsort(idx, kind="stable")
        idx, tx = idx[order], tx[order]
        np.not_equal(idx[1:], idx[:-1], out=new[1:])
        starts = np.flatnonzero(new)
    if not (new[1:] | (tx[1:] == ((tx[:-1] + 1) & 0x7F))).all():
        return None
    members = idx[starts]
    expected = np.frombuffer(pipeline.ina_tx_next, np.int64)[members]
    gen = generation[members >> 5] << 8
    if (((expected & 0x80) != 0) & ((expected & ~0xFF) == gen) & ((expected & 0x7F) != tx[starts])).any():
        return None
    ends = np.empty_like(starts)  # each member's last counted frame
    ends[:-1] = starts[1:] - 1
    ends[-1] = n - 1
    return members, gen | 0x80 | ((tx[ends] + 1) & 0x7F)


def _stamp_prev_done(pipeline: InaPipeline, rows: np.ndarray, all_counted: bool, jobs_done: np.ndarray,
                     generation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MyIngress.stamp_prev_done for the counted completions among ``rows`` (the completing gradients' frames,
    arrival order; ``all_counted``: every one is) of the jobs ``jobs_done``: each names its job's previous
    counted completion, the batch's in arrival order, the first the one ina_last_done holds if of the job's
    ``generation``, which ends as the last one's. Returns (flags to add, the reserved:7 | shadow:1 byte) per completion (uncounted ones: no
    flag, their own byte)."""
    k = len(rows)
    seq_low, byte = rows[:, _O_SEQ_LOW], rows[:, _O_RS]
    if all_counted and jobs_done[0] == jobs_done[-1] and (k < 3 or (jobs_done == jobs_done[0]).all()):
        job = int(jobs_done[0])  # the common case: one job, every completion counted
        gen = int(generation[job]) << 8
        last_done = pipeline.ina_last_done[job]
        if last_done & ~0x7F != gen | 0x80:  # none of this generation
            last_done = 0
        stamped = np.empty(k, np.uint8)  # reserved = the previous one's seq & 0x7F (<< 1 drops bit 7), the shadow
        stamped[0] = (last_done & 0x7F) << 1 | int(byte[0]) & 1
        np.bitwise_or(seq_low[:-1] << 1, byte[1:] & 1, out=stamped[1:])
        flags = _PREV_DONE_ROW[:k]
        if not last_done:
            flags = flags.copy()
            flags[0] = 0
        pipeline.ina_last_done[job] = gen | 0x80 | int(seq_low[-1]) & 0x7F
        return flags, stamped
    low = seq_low & 0x7F  # what each writes to ina_last_done, without 0x80
    flags = np.zeros(k, np.uint8)
    byte = byte.copy()
    d = np.arange(k) if all_counted else np.flatnonzero(rows[:, _O_FLAGS] & _TX_COUNTED)
    if not len(d):
        return flags, byte
    jobs_d = jobs_done[d]
    low_d = low[d].astype(np.int64) | 0x80 | generation[jobs_d] << 8  # what each writes to ina_last_done
    if jobs_d[0] != jobs_d[-1] or not (jobs_d == jobs_d[0]).all():  # several jobs: each one's in arrival order
        order = np.argsort(jobs_d, kind="stable")
        d, jobs_d, low_d = d[order], jobs_d[order], low_d[order]
    new = np.empty(len(d), bool)
    new[0] = True
    np.not_equal(jobs_d[1:], jobs_d[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = len(d) - 1
    last_done = np.frombuffer(pipeline.ina_last_done, np.int64)
    prev = np.empty(len(d), np.int64)
    prev[1:] = low_d[:-1]
    held = last_done[jobs_d[first]]
    prev[first] = np.where(held & ~0x7F == (generation[jobs_d[first]] << 8) | 0x80, held, 0)  # of this generation
    last_done[jobs_d[last]] = low_d[last]
    flags[d] = np.where(prev != 0, _PREV_DONE, 0)
    byte[d] = ((prev & 0x7F) << 1) | (byte[d] & 1)
    return flags, byte


class _GroupReplicas:
    """A job's multicast group as arrays: its ports, and per replica the bytes set_worker_addr writes and their
    share of the IPv4 checksum (the destination address's words). Kept while the group and ina_worker stand."""

    COLUMNS = np.r_[0:6, _O_IP + 16 : _O_IP + 20, _O_UDP + 2 : _O_UDP + 4, _OFF["worker_id"]]

    def __init__(self, members: tuple[tuple[int, int], ...], workers: dict, addrs: list[tuple]) -> None:
        self.members, self.workers = members, workers
        ports = [p for p, _ in members]
        self.ports = np.array(ports, np.int64)
        self.period = len(ports) if len(set(ports)) == len(ports) else 0
        self.values = np.array([list(mac + ip + udp + bytes((rid & 0xFF,)))
                                for (_, rid), (mac, ip, udp, *_rest) in zip(members, addrs)], np.uint8)
        self.ip_sum = np.array([(ip[0] << 8 | ip[1]) + (ip[2] << 8 | ip[3]) for _, ip, *_rest in addrs], np.int64)


def _group_replicas(pipeline: InaPipeline, job: int, group: int) -> _GroupReplicas | None:
    """The job's group as ``_GroupReplicas`` if every replica is a set_worker_addr worker on a data port."""
    members = pipeline.multicast_groups.get(group, ()) if group else ()
    cache = pipeline.__dict__.setdefault("_batch_groups", {})
    cached = cache.get(job)
    if cached is not None and cached.members is members and cached.workers is pipeline._worker_bytes:
        return cached
    addrs = [pipeline._worker_bytes.get((job, rid)) for _, rid in members]
    if not members or any(not a for a in addrs) or any(p in (DROP_PORT, wire.CPU_PORT) for p, _ in members):
        cache.pop(job, None)
        return None
    cache[job] = cached = _GroupReplicas(members, pipeline._worker_bytes, addrs)
    return cached


def _replica_blocks(pipeline: InaPipeline, done_rows: np.ndarray, total: np.ndarray, overflow: np.ndarray,
                    jobs_done: np.ndarray, jobs: _JobArrays, stamps: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """The replicas of every completed slot whose job's group has only set_worker_addr workers on data ports
    (the common case), built at once: the steps of ``InaPipeline._replicate`` on a (results x replicas)
    array. ``done_rows`` are the completing gradients' frames (a copy), ``total``, ``overflow`` and ``jobs_done``
    their sums, flags and jobs; ``stamps`` the loss signals' (flags to add, reserved:7 | shadow:1 byte) per result
    (``_stamp_prev_done``). Per job: (its indices into the completed results, the replicas' ports, the
    (k * r, length) frames, result after result, the ports' period). Completed slots of any other job are left
    out (the caller builds those one at a time)."""
    built: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}
    done = np.arange(len(jobs_done))
    for job in ([int(jobs_done[0])] if (jobs_done == jobs_done[0]).all() else np.unique(jobs_done).tolist()):
        g = _group_replicas(pipeline, job, int(jobs.mcast_grp[job]))
        if g is None:
            continue
        mine = done if len(built) == 0 and (jobs_done == job).all() else done[jobs_done == job]
        k, r = len(mine), len(g.ports)
        res = done_rows[mine] if len(mine) < len(done) else done_rows
        res[:, _O_DATA:_LEN] = total[mine].astype(wire.LANES_DTYPE).view(np.uint8).reshape(k, wire.INA_DATA_LEN)
        res[:, _O_INA] = int(wire.MsgType.RESULT)
        res[:, _OFF["flags"]] = np.where(overflow[mine] != 0, int(wire.Flags.OVERFLOW), 0)
        if stamps is not None:
            res[:, _OFF["flags"]] |= stamps[0][mine]
            res[:, _OFF["reserved_shadow"]] = stamps[1][mine]
        res[:, 6:12] = res[:, 0:6]  # multicast_to_job
        res[:, _O_IP + 12 : _O_IP + 16] = res[:, _O_IP + 16 : _O_IP + 20]
        res[:, _O_UDP : _O_UDP + 2] = _INA_PORT_BYTES
        res[:, _O_UDP + 6 : _O_UDP + 8] = 0  # UDP checksum 0: the payload changed
        res[:, _O_IP + 10 : _O_IP + 12] = 0  # MyComputeChecksum: over the header with the field 0
        # the IPv4 header's words but the destination address (per result) plus that address's (per replica);
        # never 0 (IHL 5), so the checksum is (0xFFFF - sum % 0xFFFF) % 0xFFFF
        base = ((res[:, _O_IP : _O_IP + 16 : 2].astype(np.int64) << 8) | res[:, _O_IP + 1 : _O_IP + 16 : 2]).sum(axis=1)
        checksum = (0xFFFF - (base[:, None] + g.ip_sum) % 0xFFFF) % 0xFFFF
        out = np.repeat(res, r, axis=0)  # MyEgress.set_worker_addr on each replica
        replicas = out.reshape(k, r, _LEN)
        replicas[:, :, _GroupReplicas.COLUMNS] = g.values
        replicas[:, :, _O_IP + 10] = checksum >> 8
        replicas[:, :, _O_IP + 11] = checksum & 0xFF
        pipeline.counters["MyEgress.ina_results"][job] += k * r
        built[job] = (mine, g.ports, out, g.period)
    return built


def _replica_lists(blocks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]]) -> dict[int, list[tuple[int, bytes]]]:
    """``_replica_blocks`` as [(port, frame)] per completed index."""
    built: dict[int, list[tuple[int, bytes]]] = {}
    for mine, ports, out, _ in blocks.values():
        r = len(ports)
        emitted = list(zip(ports.tolist() * len(mine), rows_as_bytes(out)))
        for n, i in enumerate(mine.tolist()):
            built[i] = emitted[n * r : (n + 1) * r]
    return built


_TILES: dict[tuple[bytes, int], np.ndarray] = {}


def _tiled(ports: np.ndarray, k: int) -> np.ndarray:
    """``np.tile(ports, k)``, kept (a block's ports: one replica pattern, a few batch sizes; np.tile's Python
    costs as much as a dozen array operations)."""
    key = (ports.tobytes(), k)
    tiled = _TILES.get(key)
    if tiled is None:
        if len(_TILES) > 4096:
            _TILES.clear()
        tiled = _TILES[key] = np.tile(ports, k)
        tiled.flags.writeable = False
    return tiled


def _listed(frames: list[bytes] | np.ndarray) -> list[bytes]:
    return rows_as_bytes(frames) if isinstance(frames, np.ndarray) else frames


def _one_by_one(pipeline: InaPipeline, port_of, frames: list[bytes]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    process = pipeline._process
    for pos, frame in enumerate(frames):
        out += process(port_of(pos), frame)
    return out
