"""``ina-switch`` as a process: its own namespace, veth pairs to worker namespaces, P4Runtime control.

Frames are sent from the workers' namespaces on raw sockets and checked with PTF-style helpers; every
switch is started, as a user would, by its command line, and stopped by SIGTERM.
"""
from __future__ import annotations

import json
import re
import subprocess
import time

import numpy as np
import pytest
from p4.v1.p4runtime_pb2 import SetForwardingPipelineConfigRequest as SetConfig
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from controller.switch import SwitchError
from inaproto import wire
from inaproto.scapy_layer import INA
from softswitch.faults import FaultInjector, build_config
from tests.integration import bmv2json
from tests.integration.ptfutil import (
    HostPorts,
    Mask,
    send_packet,
    verify_no_other_packets,
    verify_packet,
    verify_packets,
)
from tests.p4rt_client import P4RuntimeTestClient
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, SWITCH_MAC, Worker, dissect, gradient, make_workers
from topologies.netns import Network, sweep_stale
from topologies.switch_process import GRPC_PORT, SwitchNetwork, SwitchProcess, switch_command

K = 3
JOB = 5


@pytest.fixture(scope="module")
def net():
    """Switch namespace with ports 1..K, one worker namespace per port (host end eth0, TX offload off)."""
    sweep_stale()
    with Network("sw") as network:
        yield SwitchNetwork(network, range(1, K + 1), separate_hosts=True)


@pytest.fixture
def hosts(net):
    ports = HostPorts(net.hosts)
    yield ports
    ports.close()


@pytest.fixture
def start(net, tmp_path):
    """``start(*core_args, program=None, **kw)``: an ina-switch for this test, stopped at teardown if the test
    did not stop it (a failed test must not leave its switch on the shared ports)."""
    started: list[SwitchProcess] = []

    def _start(*core_args, program=None, **kw) -> SwitchProcess:
        sw = SwitchProcess(net, tmp_path, core_args=core_args, program=program, **kw)
        started.append(sw)
        return sw

    yield _start
    for sw in started:
        sw.stop()


def connect(sw: SwitchProcess, device_config=b"") -> P4RuntimeTestClient:
    return P4RuntimeTestClient(sw.address, sw.device_id, 1, device_config=device_config)


def expected_result(w: Worker, lanes, *, seq: int, slot: int, shadow: int = 0) -> Mask:
    """The result frame worker ``w`` must get, IPv4 id and checksum aside (they follow the sender's packet)."""
    pkt = (Ether(src=SWITCH_MAC, dst=w.mac) / IP(src=SWITCH_IP, dst=w.ip, ttl=64, flags=0)
           / UDP(sport=wire.INA_UDP_PORT, dport=w.udp_port, chksum=0)
           / INA(msg_type=wire.MsgType.RESULT, job_id=JOB, slot=slot, seq=seq, worker_id=w.wid, shadow=shadow,
                      lanes=[int(v) for v in lanes]))
    mask = Mask(pkt)
    mask.set_do_not_care_scapy(IP, "id")
    mask.set_do_not_care_scapy(IP, "chksum")
    return mask


def test_workers_get_the_exact_sum_pcaps_hold_the_frames_and_sigterm_is_quick(net, hosts, tmp_path, start):
    pcap_dir = tmp_path / "pcap"
    pcap_dir.mkdir()
    sw = start("--pcap", str(pcap_dir))
    workers = make_workers(K)
    rng = np.random.default_rng(1)
    data = rng.integers(-(2**24), 2**24, size=(4, K, wire.LANES)).astype(np.int32)
    with connect(sw) as client:
        install_job(client, JOB, workers, base=0, num_slots=4)
        for chunk in range(4):
            for w in workers:
                send_packet(hosts, w.port, gradient(w, JOB, chunk, data[chunk, w.wid], seq=100 + chunk))
            total = data[chunk].astype(np.int64).sum(axis=0)
            for w in workers:
                verify_packet(hosts, expected_result(w, total, seq=100 + chunk, slot=chunk), w.port)
        verify_no_other_packets(hosts)
        assert client.read_counter("MyIngress.ina_aggregated", JOB) == 4 * K
        assert client.read_counter("MyEgress.ina_results", JOB) == 4 * K
    code = sw.stop()
    assert code == 0, sw.process.describe()
    assert sw.process.stop_seconds < 1.0, f"SIGTERM took {sw.process.stop_seconds:.2f} s"
    for w in workers:
        iface = net.switch_ifaces[w.port]
        frames_in = rdpcap(str(pcap_dir / f"{iface}_in.pcap"))
        frames_out = rdpcap(str(pcap_dir / f"{iface}_out.pcap"))
        assert [p[INA].seq for p in frames_in] == [100, 101, 102, 103]
        assert all(p[INA].msg_type == wire.MsgType.GRADIENT and p[INA].worker_id == w.wid for p in frames_in)
        assert [p[INA].seq for p in frames_out] == [100, 101, 102, 103]
        assert all(p[INA].msg_type == wire.MsgType.RESULT and p[IP].dst == w.ip for p in frames_out)
        assert list(frames_out[3][INA].lanes) == [int(v) for v in data[3].astype(np.int64).sum(axis=0)]


def _frames_before_the_config_were_processed(sw, hosts, device_config: bytes) -> int:
    """Send an unroutable frame, then push the pipeline without resetting state (RECONCILE_AND_COMMIT): the
    NO_ROUTE count says whether the data plane processed the frame before P4Runtime had a config."""
    send_packet(hosts, 1, Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="192.0.2.9") / UDP(sport=1, dport=2))
    verify_no_other_packets(hosts, timeout=0.2)
    with connect(sw, device_config=None) as client:
        with pytest.raises(SwitchError) as e:  # as BMv2: no P4Info before SetForwardingPipelineConfig
            client.read_counter("MyIngress.ina_drops", wire.DropReason.NO_ROUTE)
        assert e.value.code.name == "FAILED_PRECONDITION"
        client.set_forwarding_pipeline(device_config, action=SetConfig.RECONCILE_AND_COMMIT)
        return client.read_counter("MyIngress.ina_drops", wire.DropReason.NO_ROUTE)


def test_no_p4_drops_everything_until_a_pipeline_is_pushed(net, hosts, tmp_path, start):
    sw = start()
    assert _frames_before_the_config_were_processed(sw, hosts, b"") == 0
    frame = Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2") / UDP(sport=1, dport=2)
    with connect(sw) as client:  # SetForwardingPipelineConfig with the committed P4Info
        client.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x020000000002, 2))
        send_packet(hosts, 1, frame)
        exp = Mask(Ether(dst="02:00:00:00:00:02", src=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2", ttl=63) / UDP(sport=1, dport=2))
        exp.set_do_not_care_scapy(IP, "chksum")
        verify_packet(hosts, exp, 2)
    assert sw.stop() == 0


def test_a_json_makes_the_pipeline_live_at_start(net, hosts, tmp_path, start):
    program = bmv2json.write(bmv2json.model_json(), tmp_path / "ina.json")
    sw = start(program=str(program))
    assert _frames_before_the_config_were_processed(sw, hosts, program.read_bytes()) == 1
    with connect(sw, device_config=None) as client:
        client.insert_entry("MyIngress.ipv4_lpm", ((0x0A000000, 8),), "MyIngress.ipv4_forward", (0x020000000003, 3))
        send_packet(hosts, 1, Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.9.9.9") / UDP(sport=1, dport=2))
        verify_packets(hosts, Mask(b"", ignore_extra_bytes=True), [3])
    assert sw.stop() == 0


def test_packet_in_and_packet_out_through_the_cpu_port(net, hosts, tmp_path, start):
    sw = start()
    with connect(sw) as client:
        client.insert_entry("MyIngress.ipv4_lpm", ((0xC0A80000, 16),), "MyIngress.send_to_cpu", ())
        frame = bytes(Ether(dst=SWITCH_MAC, src="02:00:00:00:00:01") / IP(src="10.0.1.1", dst="192.168.7.7") / UDP(sport=5, dport=6))
        send_packet(hosts, 2, frame)
        got = client.receive_packet_in(timeout=5)
        assert got is not None, sw.process.describe()
        metadata, payload = got
        assert metadata["ingress_port"] == 2
        assert dissect(payload)[IP].dst == "192.168.7.7"
        out = bytes(Ether(dst="02:00:00:00:00:03", src=SWITCH_MAC) / IP(src="10.0.0.254", dst="10.0.1.3") / UDP(sport=7, dport=8))
        client.send_packet_out(out, egress_port=3)
        verify_packet(hosts, out, 3)
    assert sw.stop() == 0


def test_log_file_is_x_txt_with_bmv2_style_lines(net, hosts, tmp_path, start):
    log = tmp_path / "s1"
    sw = start("--log-file", str(log), "-L", "debug", log_console=False)
    with connect(sw) as client:
        client.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x020000000002, 2))
        send_packet(hosts, 1, Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2") / UDP(sport=1, dport=2))
        verify_packet(hosts, Mask(b"", ignore_extra_bytes=True), 2)
    assert sw.stop() == 0
    text = (tmp_path / "s1.txt").read_text()
    line = r"\[\d\d:\d\d:\d\d\.\d{3}\] \[ina-switch\] \[D\] \[thread \d+\] \[\d+\.0\] \[cxt 0\] "
    assert re.search(line + "Processing packet received on port 1", text), text[-2000:]
    assert re.search(line + "Transmitting packet of size 42 out of port 2", text), text[-2000:]
    assert "Adding interface sw-p1 as port 1" in text


def _all_reduce(hosts: HostPorts, workers, data, slots: int, deadline: float) -> tuple[dict, int]:
    """SwitchML's protocol from the workers' side: a window of ``slots`` chunks, resend on silence."""
    chunks = data.shape[1]
    got = [{} for _ in workers]
    in_flight = [{s: s for s in range(slots)} for _ in workers]
    frames = {}

    def send(i, c, retransmit=False):
        key = (i, c, retransmit)
        if key not in frames:
            w = workers[i]
            frames[key] = gradient(w, JOB, c % slots, data[i, c], seq=c, shadow=(c // slots) % 2,
                                   flags=wire.Flags.RETRANSMIT if retransmit else 0)
        hosts.send(workers[i].port, frames[key])

    for i in range(len(workers)):
        for c in range(slots):
            send(i, c)
    resent = 0
    while any(len(g) < chunks for g in got):
        assert time.monotonic() < deadline, f"all-reduce incomplete: {[len(g) for g in got]} of {chunks} chunks"
        arrived = hosts.poll(0.05)
        for port, frame in arrived:
            i = port - 1
            ina = dissect(frame)[INA]
            if ina.msg_type != wire.MsgType.RESULT or in_flight[i].get(ina.slot) != ina.seq:
                continue  # a duplicate or a late copy
            got[i][ina.seq] = list(ina.lanes)
            nxt = ina.seq + slots
            if nxt < chunks:
                in_flight[i][ina.slot] = nxt
                send(i, nxt)
            else:
                del in_flight[i][ina.slot]
        if not arrived:
            for i in range(len(workers)):
                for c in in_flight[i].values():
                    send(i, c, retransmit=True)
                    resent += 1
    return got, resent


def test_fault_injection_loses_and_duplicates_yet_retransmission_gives_the_exact_sum(net, hosts, tmp_path, start):
    # No reordering here: a retransmitted gradient overtaken by the worker's next chunk for the same slot would
    # count in the slot's next round (SwitchML's protocol assumes no reordering within a slot).
    sw = start("--fault-drop", "0.15", "--fault-dup", "0.15", "--fault-seed", "7")
    workers = make_workers(K)
    chunks, slots = 60, 4
    data = np.random.default_rng(2).integers(-1000, 1000, size=(K, chunks, wire.LANES)).astype(np.int32)
    with connect(sw) as client:
        install_job(client, JOB, workers, base=0, num_slots=slots)
        got, resent = _all_reduce(hosts, workers, data, slots, time.monotonic() + 30)
        duplicates = client.read_counter("MyIngress.ina_duplicates", JOB)
    expected = data.astype(np.int64).sum(axis=0)
    for i in range(K):
        assert sorted(got[i]) == list(range(chunks))
        for c in range(chunks):
            assert got[i][c] == [int(v) for v in expected[c]], (i, c)
    assert resent > 0, "no packet was lost: faults not applied?"
    assert duplicates > 0, "the switch saw no duplicate contribution"
    assert sw.stop() == 0
    log = sw.process.log_path.read_text()
    m = re.search(r"faults in: (\d+) INA packets, (\d+) dropped, (\d+) duplicated, (\d+) reordered", log)
    assert m, log[-2000:]
    seen, dropped, duplicated, _reordered = map(int, m.groups())
    assert dropped > 0 and duplicated > 0
    assert 0.05 < dropped / seen < 0.3, m.group(0)


def test_reordering_follows_the_seed(net, hosts, tmp_path, start):
    """The order the switch processes a link's packets in is the one FaultInjector predicts for the seed."""
    sw = start("--fault-reorder", "0.5", "--fault-seed", "11", "--fault-direction", "in", "--fault-reorder-delay", "30")
    w = Worker(wid=0, port=1)
    frames = [gradient(w, JOB, seq % 8, [seq] * wire.LANES, seq=seq, shadow=(seq // 8) % 2) for seq in range(24)]
    injector = FaultInjector(build_config(reorder=["0.5"], direction="in", seed=11, reorder_delay=30))
    predicted = [wire.unpack_header(f, wire.INA_OFFSET).seq for frame in frames for f in injector.ingress(1, frame, 0.0)]
    assert predicted != sorted(predicted)  # the seed does reorder
    with connect(sw) as client:
        install_job(client, JOB, [w], base=0, num_slots=8)  # one worker: every gradient is a result at once
        for frame in frames:
            send_packet(hosts, 1, frame)
        got = []
        while len(got) < len(predicted):
            arrived = hosts.poll(3.0)
            assert arrived, f"{len(got)} of {len(predicted)} results: {sw.process.describe()}"
            got += [dissect(f)[INA].seq for _, f in arrived]
    assert got == predicted


def test_faults_only_on_the_named_port(net, hosts, tmp_path, start):
    sw = start("--fault-drop", "1", "--fault-port", "2")
    pair = [Worker(wid=0, port=1), Worker(wid=1, port=3)]  # job JOB on ports 1 and 3
    alone = Worker(wid=0, port=2)  # job JOB + 1, one worker: its own contribution completes the slot
    with connect(sw) as client:
        install_job(client, JOB, pair, base=0, num_slots=1)
        install_job(client, JOB + 1, [alone], base=1, num_slots=1)
        for w in pair:
            send_packet(hosts, w.port, gradient(w, JOB, 0, [1] * wire.LANES))
        send_packet(hosts, 2, gradient(alone, JOB + 1, 0, [1] * wire.LANES))
        verify_packets(hosts, Mask(b"", ignore_extra_bytes=True), [1, 3])
        verify_no_other_packets(hosts, timeout=0.2)  # port 2 loses every INA packet
        assert client.read_counter("MyIngress.ina_aggregated", JOB) == 2
        assert client.read_counter("MyIngress.ina_aggregated", JOB + 1) == 0
        # Not INA: never faulted, even on port 2.
        client.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x020000000002, 1))
        send_packet(hosts, 2, Ether(dst=SWITCH_MAC) / IP(src="10.0.1.2", dst="10.0.2.9") / UDP(sport=1, dport=2))
        verify_packet(hosts, Mask(b"", ignore_extra_bytes=True), 1)
    assert sw.stop() == 0


def _run_cli(net, *args: str) -> subprocess.CompletedProcess:
    return net.switch_ns.run(switch_command("ina-switch") + list(args), check=False, timeout=30)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--no-p4", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--no-p4", "-i", "one@sw-p1"], "port 'one'"),
        (["--no-p4", "-i", "1-sw-p1"], "expected PORT@IFACE"),
        (["--no-p4", "-i", "1@does-not-exist"], "does-not-exist"),
        (["UNKNOWN_TABLE_JSON"], "MyIngress.acl"),
    ],
)
def test_cli_errors_are_one_line_and_non_zero(net, tmp_path, args, needle):
    bad = bmv2json.write(bmv2json.with_unknown_table(bmv2json.model_json()), tmp_path / "other.json")
    args = [str(bad) if a == "UNKNOWN_TABLE_JSON" else a for a in args]
    t0 = time.monotonic()
    proc = _run_cli(net, "--device-id", "1", *args, "--", "--grpc-server-addr", f"127.0.0.1:{GRPC_PORT}")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ina-switch: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 15
    json.dumps(args)  # the parameters stay printable in reports
