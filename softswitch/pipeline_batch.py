"""The pipeline model on a batch of frames from one port: numpy across the batch, state in arrival order.

``process_batch(pipeline, port, frames)`` returns exactly what ``pipeline.process(port, f)`` for each frame in
turn would return, concatenated, and leaves the registers and counters exactly as that would (the
equivalence tests in tests/unit/test_pipeline_batch.py check both on random sequences).

Only the common case is vectorised: whole INA gradients from a data port that pass every check of
``MyIngress.apply`` step 4 (parser states, checksum, lengths, job, generation, worker, binding, slot) into a slot
no other such gradient of the batch touches, and that the slot accepts (step 6a). A slot's state (its two
copies and its owner) is touched by no other frame of the batch then, so those frames can be parsed,
checked, summed (AGGREGATE_LANE on every lane of every frame at once) and written back in one go, in any
order. Every other frame (a second gradient into the same slot, a retransmission or late duplicate, a
drop, a broadcast, anything not INA, packet-outs) goes through ``pipeline._process`` one at a time, in
arrival order; those never read a vectorised frame's slot, and the counters they share are sums, so the
two groups commute. Outputs are put back in arrival order.
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
_INA_PORT_BYTES = np.frombuffer(wire.INA_UDP_PORT.to_bytes(2, "big"), np.uint8)
DROP_PORT = 511
_OFF = {name: _O_INA + off for name, off in wire.INA_FIELD_OFFSETS.items()}
# A whole INA frame as a numpy record: what the vectorised parser reads (names as in p4src/ina.p4's headers).
FRAME_DTYPE = np.dtype({
    "names": ["eth_src_hi", "eth_src_lo", "ipv4_src", "udp_srcPort", "etherType", "version_ihl", "totalLen", "protocol", "ipv4_words", "udp_dstPort", "udp_length",
              "msg_type", "job_id", "generation", "slot", "seq", "worker_id", "reserved_shadow", "lanes"],
    "formats": [">u2", ">u4", ">u4", ">u2", ">u2", "u1", ">u2", "u1", (">u2", (10,)), ">u2", ">u2", "u1", ">u2", ">u2", ">u2", ">u4", "u1", "u1",
                (wire.LANES_DTYPE, (wire.LANES,))],
    "offsets": [6, 8, _O_IP + 12, _O_UDP, 12, _O_IP, _O_IP + 2, _O_IP + 9, _O_IP, _O_UDP + 2, _O_UDP + 4, _OFF["msg_type"], _OFF["job_id"],
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


_SLOT_MARK = np.zeros(wire.NUM_SLOTS, np.int64)  # scratch for finding slots used twice in a batch (one I/O thread)


def _used_once(slots: np.ndarray) -> np.ndarray:
    """For each element, whether its value occurs once in ``slots`` (values in 0..NUM_SLOTS-1)."""
    index = np.arange(len(slots))
    _SLOT_MARK[slots] = index  # the last occurrence of each value wins
    last = _SLOT_MARK[slots]
    _SLOT_MARK[slots[::-1]] = index[::-1]  # now the first
    return _SLOT_MARK[slots] == last


def process_batch(pipeline: InaPipeline, ingress_port: int, frames: list[bytes] | np.ndarray, *,
                  vector_min: int = VECTOR_MIN, as_block: bool = False) -> list[tuple[int, bytes]] | FrameBlock:
    """Every frame of ``frames`` (received on ``ingress_port``, in that order) through the pipeline; the caller
    holds ``pipeline.lock``. The outputs are those of ``process`` frame after frame, in the same order.

    ``frames`` is a list of bytes or an (n, length) uint8 array of equal-length frames (what the packet rings
    gather). With ``as_block`` the outputs may come back as a ``FrameBlock`` (when every frame was vectorised
    and the results are one job's), else as [(port, frame)]."""
    n = len(frames)
    if isinstance(frames, np.ndarray):
        if n < vector_min or ingress_port == wire.CPU_PORT or frames.shape[1] != _LEN:
            return _one_by_one(pipeline, ingress_port, rows_as_bytes(frames))
        rec = frames.reshape(-1).view(FRAME_DTYPE)
        where = None  # every frame: positions are indices
    else:
        if n < vector_min or ingress_port == wire.CPU_PORT:
            return _one_by_one(pipeline, ingress_port, frames)
        # --- MyParser and MyVerifyChecksum for every whole INA-sized frame at once
        lengths = list(map(len, frames))
        sized = range(n) if lengths.count(_LEN) == n else [i for i, m in enumerate(lengths) if m == _LEN]
        if len(sized) < vector_min or (len(sized) < n and wire.INA_QUERY_FRAME_LEN in lengths):  # a query reads a slot
            return _one_by_one(pipeline, ingress_port, frames)
        if len(sized) == n:
            rec = np.frombuffer(b"".join(frames), dtype=FRAME_DTYPE)
            where = None
        else:
            rec = np.frombuffer(b"".join([frames[i] for i in sized]), dtype=FRAME_DTYPE)
            where = np.array(sized)
    raw = rec.view(np.uint8).reshape(len(rec), _LEN)
    # MyVerifyChecksum: the checksum field equals 0xFFFF - folded sum of the other nine words (never 0 here:
    # IHL is 5), i.e. (0xFFFF - rest % 0xFFFF) % 0xFFFF
    words = rec["ipv4_words"]
    checksum = words[:, 5]
    rest = words.sum(axis=1, dtype=np.int64) - checksum
    jobs = _job_arrays(pipeline)
    slot = rec["slot"].astype(np.int64)
    checksum_ok = checksum == (0xFFFF - rest % 0xFFFF) % 0xFFFF
    if (raw[:, _IDENTITY_COLUMNS] == raw[0, _IDENTITY_COLUMNS]).all():
        # one sender's frames (one worker's window): the checks of its identity on the first frame only
        first = raw[0]
        job, worker = int(rec["job_id"][0]), int(rec["worker_id"][0])
        job_id, worker_id = np.full(len(rec), job, np.int64), np.full(len(rec), worker, np.int64)
        if not (((first[_FIXED_COLUMNS] & _FIXED_MASK) == _FIXED_VALUE).all() and job < wire.MAX_JOBS
                and jobs.known[job] and int(rec["generation"][0]) == jobs.generation[job]
                and (int(jobs.worker_mask[job]) >> min(worker, 63)) & 1 and jobs.bound_port[job, worker] == ingress_port
                and (jobs.bound_bytes[job, worker] == first[_BOUND_COLUMNS]).all()):
            return _one_by_one(pipeline, ingress_port, _listed(frames))
        slot_abs = int(jobs.base_slot[job]) + slot
        ok = checksum_ok & (slot < jobs.num_slots[job]) & (slot_abs < wire.NUM_SLOTS)
    else:
        job_id = rec["job_id"].astype(np.int64)
        j = np.minimum(job_id, wire.MAX_JOBS - 1)
        worker_id = rec["worker_id"].astype(np.int64)
        slot_abs = jobs.base_slot[j] + slot
        # --- MyIngress.apply steps 2-4: a valid gradient of a known job, bound worker and slot
        ok = (((raw[:, _FIXED_COLUMNS] & _FIXED_MASK) == _FIXED_VALUE).all(axis=1) & checksum_ok
              & (job_id < wire.MAX_JOBS) & jobs.known[j] & (rec["generation"] == jobs.generation[j])
              & ((jobs.worker_mask[j] >> np.minimum(worker_id, 63)) & 1 == 1)
              & (jobs.bound_port[j, worker_id] == ingress_port)
              & (jobs.bound_bytes[j, worker_id] == raw[:, _BOUND_COLUMNS]).all(axis=1)
              & (slot < jobs.num_slots[j]) & (slot_abs < wire.NUM_SLOTS))
    # ... into a slot no other such gradient of the batch touches
    cand = np.flatnonzero(ok)
    if len(cand):
        cand = cand[_used_once(slot_abs[cand])]
    if len(cand) == 0:
        return _one_by_one(pipeline, ingress_port, _listed(frames))
    # --- step 6: the slot's state, as the per-frame path would find it (owner reset included)
    seq = rec["seq"][cand].astype(np.int64)
    shadow = rec["reserved_shadow"][cand].astype(np.int64) & 1
    sa = slot_abs[cand]
    cell = (sa << 1) + shadow
    other = cell ^ 1
    jc = job_id[cand]
    # owner_epoch ++ job_id ++ generation, as uint64 (the epoch may use all 32 bits)
    owner = ((jobs.owner_epoch[jc] << np.uint64(32)) | (jc.astype(np.uint64) << np.uint64(16))
             | rec["generation"][cand].astype(np.uint64))
    regs = _registers(pipeline)
    reset = regs.gather("ina_owner", sa, np.uint64) != owner
    bitmap = np.where(reset, 0, regs.gather("ina_bitmap", cell))
    count = np.where(reset, 0, regs.gather("ina_count", cell))
    overflow = np.where(reset, 0, regs.gather("ina_overflow", cell))
    stored_seq = np.where(reset, (seq - 1) & 0xFFFFFFFF, regs.gather("ina_seq", cell))
    wb = np.left_shift(1, worker_id[cand])  # < 32: the worker is in the job's mask
    age = (seq - stored_seq) & 0xFFFFFFFF
    accept = (bitmap & wb == 0) & np.where(count == 0, (age != 0) & (age < 0x80000000), age == 0)
    if not accept.all():  # duplicates: the per-frame path (their state is untouched so far; reset implies accept)
        keep = np.flatnonzero(accept)
        cand, seq, sa, cell, other, jc, owner, reset, bitmap, count, overflow, wb = (
            a[keep] for a in (cand, seq, sa, cell, other, jc, owner, reset, bitmap, count, overflow, wb))
        if len(cand) == 0:
            return _one_by_one(pipeline, ingress_port, _listed(frames))
    # --- 6a for every accepted gradient at once
    if reset.any():
        r = np.flatnonzero(reset)
        regs.scatter("ina_owner", sa[r], owner[r])
        zero = np.zeros(len(r), np.int64)
        regs.scatter("ina_count", other[r], zero)
        regs.scatter("ina_overflow", other[r], zero)
        regs.scatter("ina_seq", other[r], (seq[r] - 1) & 0xFFFFFFFF)
    other_bitmap = np.where(reset, 0, regs.gather("ina_bitmap", other))
    regs.scatter("ina_bitmap", cell, bitmap | wb)
    regs.scatter("ina_bitmap", other, other_bitmap & ~wb & 0xFFFFFFFF)
    first = count == 0
    regs.scatter("ina_seq", cell, seq)  # a new round stores seq; an accepted later packet has age 0
    count = (count + 1) & 0xFF
    num_workers = jobs.num_workers[jc]
    complete = count == num_workers
    regs.scatter("ina_count", cell, np.where(complete, 0, count))
    value = rec["lanes"][cand].astype(np.int32)
    cur = pipeline.ina_lanes[cell].astype(np.int32)
    total = cur + value  # int32 wraps, as bit<32> does
    lane_overflow = (((cur ^ total) & (value ^ total)) < 0).any(axis=1)
    total[first] = value[first]
    overflow = np.where(first, 0, np.where(lane_overflow, 1, overflow))
    pipeline.ina_lanes[cell] = total
    regs.scatter("ina_overflow", cell, overflow)
    aggregated = pipeline.counters["MyIngress.ina_aggregated"]
    if jc[0] == jc[-1] and (jc == jc[0]).all():
        aggregated[int(jc[0])] += len(jc)
    else:
        for job, k in zip(*np.unique(jc, return_counts=True)):
            aggregated[int(job)] += int(k)
    # --- outputs, in arrival order: the completed slots' results and every frame of the per-frame path
    vector_pos = cand if where is None else where[cand]
    done = np.flatnonzero(complete)
    blocks = _replica_blocks(pipeline, rec, cand, done, jc, total, overflow, jobs) if len(done) else {}
    if len(vector_pos) == n and sum(len(b[0]) for b in blocks.values()) == len(done):
        # the common case: nothing else to interleave
        if as_block and len(blocks) <= 1:
            if not blocks:
                return FrameBlock(np.zeros(0, np.int64), np.zeros((0, _LEN), np.uint8))
            (mine, ports, out, period), = blocks.values()
            return FrameBlock(_tiled(ports, len(mine)), out, period)
        replicas = _replica_lists(blocks)
        return [out for i in done.tolist() for out in replicas[i]]
    replicas = _replica_lists(blocks)
    frames = _listed(frames)
    results: dict[int, tuple[int, bytes] | list[tuple[int, bytes]]] = {}
    positions = vector_pos.tolist()
    for i in done.tolist():
        pos = positions[i]
        results[pos] = replicas.get(i) or (i, frames[pos])
    rest_pos = np.ones(n, bool)
    rest_pos[vector_pos] = False
    pending = sorted(set(np.flatnonzero(rest_pos).tolist()) | results.keys())
    if not pending:
        return []
    out: list[tuple[int, bytes]] = []
    total_be = total.astype(wire.LANES_DTYPE)
    mcast = jobs.mcast_grp[jc]
    for pos in pending:
        hit = results.get(pos)
        if hit is None:
            out += pipeline._process(ingress_port, frames[pos])
            continue
        if isinstance(hit, list):  # replicas built by _replicate_results
            out += hit
            continue
        i, frame = hit
        res = bytearray(frame)
        res[_O_DATA:_LEN] = total_be[i].tobytes()
        res[_O_INA] = int(wire.MsgType.RESULT)
        res[_OFF["flags"]] = int(wire.Flags.OVERFLOW) if overflow[i] else 0
        pipeline._multicast_to_job(res)
        out += pipeline._replicate(int(mcast[i]), res, ingress_port)
    return out


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


def _replica_blocks(pipeline: InaPipeline, rec: np.ndarray, cand: np.ndarray, done: np.ndarray, jc: np.ndarray,
                    total: np.ndarray, overflow: np.ndarray, jobs: _JobArrays
                    ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """The replicas of every completed slot whose job's group has only set_worker_addr workers on data ports
    (the common case), built at once: the steps of ``InaPipeline._replicate`` on a (results x replicas)
    array: per job, (its completed indices into ``done``'s values, the replicas' ports, the (k * r, length) frames,
    result after result, the ports' period). Completed slots of any other job are left out (the caller builds
    those one at a time)."""
    built: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}
    raw = rec.view(np.uint8).reshape(len(rec), _LEN)
    jobs_done = jc[done]
    for job in ([int(jobs_done[0])] if (jobs_done == jobs_done[0]).all() else np.unique(jobs_done).tolist()):
        g = _group_replicas(pipeline, job, int(jobs.mcast_grp[job]))
        if g is None:
            continue
        mine = done if len(built) == 0 and (jobs_done == job).all() else done[jobs_done == job]
        k, r = len(mine), len(g.ports)
        res = raw[cand[mine]]  # a copy
        res[:, _O_DATA:_LEN] = total[mine].astype(wire.LANES_DTYPE).view(np.uint8).reshape(k, wire.INA_DATA_LEN)
        res[:, _O_INA] = int(wire.MsgType.RESULT)
        res[:, _OFF["flags"]] = np.where(overflow[mine] != 0, int(wire.Flags.OVERFLOW), 0)
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


def _one_by_one(pipeline: InaPipeline, ingress_port: int, frames: list[bytes]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    process = pipeline._process
    for frame in frames:
        out += process(ingress_port, frame)
    return out
