"""Mininet topologies with P4 switch nodes: traffic through ina-switch, the switch node's start, stop and
failure paths, and cleanup that leaves no process, namespace or interface behind (also after a crash).

Needs root (the integration tier). Tests that pass traffic run ``ina-switch``; ``INA_SWITCH_COMMAND``
(a command line) runs them against another build of the switch instead. The switch node's own paths run
against a stand-in process, so they need no switch at all.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mininet")

from inaproto.config import load
from softswitch.config import SwitchConfig
from tests.support.ports import free_port
from topologies import state as run_state
from topologies.cleanup import cleanup_all, root_interfaces
from topologies.network import InaNetwork
from topologies.nodes import P4Switch, SwitchStartupError
from topologies.runtime import RouteInstaller
from topologies.topos import LeafSpineTopo, StarTopo, TopologyJson

SWITCH_COMMAND = os.environ.get("INA_SWITCH_COMMAND")
HAVE_INA_SWITCH = SWITCH_COMMAND is not None or importlib.util.find_spec("softswitch.cli") is not None
needs_switch = pytest.mark.skipif(
    not HAVE_INA_SWITCH, reason="ina-switch is not there yet (softswitch/cli.py missing); set INA_SWITCH_COMMAND to use another switch")

# A stand-in for a switch process: listens where --grpc-server-addr says, exits on SIGTERM; a flag makes
# it fail like a bad command line, another makes it ignore SIGTERM, another never listen.
STAND_IN = textwrap.dedent("""
    import signal, socket, sys, time
    argv = sys.argv[1:]
    print("stand-in switch", " ".join(argv), flush=True)
    if "--bogus" in argv:
        print("error: unrecognized arguments: --bogus", file=sys.stderr)
        sys.exit(2)
    if "--stubborn" in argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    if "--mute" not in argv:
        host, port = argv[argv.index("--grpc-server-addr") + 1].rsplit(":", 1)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen()
    while True:
        time.sleep(0.5)
""")


@pytest.fixture
def stand_in(tmp_path: Path) -> list[str]:
    path = tmp_path / "stand_in_switch.py"
    path.write_text(STAND_IN)
    return [sys.executable, str(path)]


def switch_opts() -> dict:
    return {"executable": shlex.split(SWITCH_COMMAND)} if SWITCH_COMMAND else {}


def wait_until(condition, timeout: float = 5.0, message: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or "condition not met in time")
        time.sleep(0.02)



def ping(host, ip: str) -> bool:
    out = host.cmd(f"ping -c1 -W2 {ip}")
    return " 0% packet loss" in out


def udp_roundtrip(sender, receiver, dst_ip: str, payload: str = "hello-ina") -> str:
    """One UDP datagram from ``sender`` to ``receiver`` (port 5001); returns what arrived."""
    recv_code = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"s.bind(('{dst_ip}', 5001)); s.settimeout(5); print('bound', flush=True); "
        "print(s.recvfrom(2048)[0].decode(), flush=True)"
    )
    proc = receiver.popen([sys.executable, "-c", recv_code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline().strip() == "bound"
        send_code = (
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.sendto(b'{payload}', ('{dst_ip}', 5001))"
        )
        sender.cmd(f"{shlex.quote(sys.executable)} -c {shlex.quote(send_code)}")
        out, _ = proc.communicate(timeout=8)
        return out.strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_nothing_left(records: list[run_state.ProcessRecord], interfaces: list[str]) -> None:
    """No recorded process alive; every recorded host namespace gone (no process in it, not kept as a named
    ``ip netns``); no recorded switch port, nor any interface named like one, in the root namespace."""
    alive = [r for r in records if run_state.process_alive(r.pid, r.start_time)]
    assert not alive, f"processes left: {alive}"
    named = {p.stat().st_ino for p in Path("/var/run/netns").glob("*")} if Path("/var/run/netns").is_dir() else set()
    for rec in records:
        if rec.netns:
            assert not run_state.pids_in_netns(rec.netns), f"namespace of {rec.name} still has processes"
            assert rec.netns not in named, f"namespace of {rec.name} is kept under /var/run/netns"
    present = set(root_interfaces())
    assert not [n for n in interfaces if n in present], "switch ports left in the root namespace"
    assert not [n for n in present if re.match(r"^ina-.+-p\d+$", n)], "interfaces named like ours left"


def snapshot(plan) -> tuple[list[run_state.ProcessRecord], list[str]]:
    state = run_state.current_state()
    return list(state.processes), plan.switch_interfaces()


# --- traffic through ina-switch ----------------------------------------------------------------------------


@needs_switch
def test_star_passes_ping_udp_and_shapes_bandwidth(tmp_path: Path) -> None:
    topo = StarTopo(3, bw=[10, None, None])
    net = InaNetwork(topo, target="ina-switch", run_dir=tmp_path / "run", switch_opts=switch_opts())
    with net:
        records, interfaces = snapshot(topo.plan)
        h1, h2, h3 = net.host("h1"), net.host("h2"), net.host("h3")
        assert ping(h1, "10.0.1.2") and ping(h3, "10.0.1.1")
        assert udp_roundtrip(h1, h3, "10.0.1.3") == "hello-ina"

        # The routes are in the switch, and the run directory tells the controller where the switch is.
        sw = net.switch("s1")
        with RouteInstaller(sw.grpc_address, sw.device_id) as installer:
            installer.ensure_pipeline()
            assert set(installer.read_routes()) == set(topo.plan.switch("s1").routes)
        doc = json.loads((tmp_path / "run" / "topology.json").read_text())
        assert doc["switches"]["s1"]["grpc"] == sw.grpc_address and doc["switches"]["s1"]["device_id"] == 1
        assert (tmp_path / "run" / "s1-runtime.json").exists() and sw.log_path.exists()

        # h1's link is shaped (htb, both ends), and a TCP transfer over it stays near 10 Mbit/s.
        assert "htb" in h1.cmd("tc qdisc show dev eth0")
        assert "rate 10Mbit" in subprocess.run(["tc", "class", "show", "dev", "ina-s1-p1"], capture_output=True, text=True, check=False).stdout
        server = h2.popen(["iperf3", "-s", "-1", "-B", "10.0.1.2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: ":5201" in h2.cmd("ss -ltn"), message="iperf3 server did not listen")
        report = json.loads(h1.cmd("iperf3 -c 10.0.1.2 -t 2 -J"))
        server.wait(timeout=10)
        mbits = report["end"]["sum_received"]["bits_per_second"] / 1e6
        assert 3 < mbits < 13, f"{mbits:.1f} Mbit/s over a 10 Mbit/s link"
    assert_nothing_left(records, interfaces)


@needs_switch
def test_leaf_spine_passes_traffic_across_racks_with_a_rack_without_ina(tmp_path: Path) -> None:
    topo = LeafSpineTopo(2, 2, ina_racks=[1], uplink_bw=100)
    plan = topo.plan
    assert [(s.name, s.ina) for s in plan.switches] == [("spine1", False), ("s1", True), ("s2", False)]
    with InaNetwork(topo, target="ina-switch", run_dir=tmp_path / "run", switch_opts=switch_opts()) as net:
        records, interfaces = snapshot(plan)
        h1, _h2, h3, h4 = (net.host(f"h{i}") for i in range(1, 5))
        assert ping(h1, "10.0.2.1") and ping(h4, "10.0.1.2")  # across racks, both ways
        assert ping(h3, "10.0.2.2")  # inside the rack without INA
        assert udp_roundtrip(h4, h1, "10.0.1.1", "ring-chunk") == "ring-chunk"
        doc = json.loads((tmp_path / "run" / "topology.json").read_text())
        assert doc["switches"]["s2"]["ina"] is False and doc["hosts"]["h3"]["switch_ip"] == "10.0.2.254"
    assert_nothing_left(records, interfaces)


@needs_switch
def test_topology_json_builds_and_forwards(tmp_path: Path) -> None:
    (tmp_path / "s1-runtime.json").write_text(json.dumps({
        "target": "bmv2", "p4info": "build/basic.p4info.txt", "bmv2_json": "build/basic.json",
        "table_entries": [
            {"table": "MyIngress.ipv4_lpm", "default_action": True, "action_name": "MyIngress.drop", "action_params": {}},
            {"table": "MyIngress.ipv4_lpm", "match": {"hdr.ipv4.dstAddr": ["10.0.1.1", 32]},
             "action_name": "MyIngress.ipv4_forward", "action_params": {"dstAddr": "08:00:00:00:01:11", "port": 1}},
            {"table": "MyIngress.ipv4_lpm", "match": {"hdr.ipv4.dstAddr": ["10.0.2.2", 32]},
             "action_name": "MyIngress.ipv4_forward", "action_params": {"dstAddr": "08:00:00:00:02:00", "port": 2}},
        ],
    }))
    (tmp_path / "topology.json").write_text(json.dumps({
        "hosts": {
            "h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11",
                   "commands": ["route add default gw 10.0.1.10 dev eth0", "arp -i eth0 -s 10.0.1.10 08:00:00:00:01:00"]},
            "h2": {"ip": "10.0.2.2/24", "mac": "08:00:00:00:02:22"},
        },
        "switches": {"s1": {"runtime_json": "s1-runtime.json"}, "s2": {}},
        "links": [["h1", "s1-p1"], ["s1-p2", "s2-p2", "0ms", 50], ["h2", "s2-p1", "1ms"]],
    }))
    topo = TopologyJson(str(tmp_path / "topology.json"))
    plan = topo.plan
    assert plan.switch("s1").routes[1].mac == "08:00:00:00:02:00"  # from s1-runtime.json
    assert plan.host("h2").gateway == "10.0.2.254"  # no commands: this project's defaults
    assert any("latency 1ms ignored" in n for n in plan.notes)
    with InaNetwork(topo, target="ina-switch", run_dir=tmp_path / "run", switch_opts=switch_opts()) as net:
        assert ping(net.host("h1"), "10.0.2.2")
        assert ping(net.host("h2"), "10.0.1.1")


CUSTOM = Path(__file__).resolve().parents[2] / "topologies" / "custom.py"


def test_custom_file_registers_topologies_and_switches() -> None:
    names: dict = {}
    exec(compile(CUSTOM.read_text(), str(CUSTOM), "exec"), names, names)  # noqa: S102  # what `mn --custom` does
    assert set(names["topos"]) == {"star", "leafspine", "json"}
    assert set(names["switches"]) == {"inaswitch", "bmv2", "p4"}
    assert names["topos"]["leafspine"](3, 1, ina_racks="1:3").plan.switch("s2").ina is False


@needs_switch
def test_mn_custom_pingall(tmp_path: Path) -> None:
    switch = "inaswitch" + (f",executable={SWITCH_COMMAND}" if SWITCH_COMMAND else "")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mn"), "--custom", str(CUSTOM), "--topo", "star,2", "--switch", switch, "--controller", "none", "--test", "pingall"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "INA_RUN_DIR": str(tmp_path / "run")},
        check=False,
    )
    assert "Results: 0% dropped (2/2 received)" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (tmp_path / "run" / "logs" / "s1.log").exists()
    assert not [n for n in root_interfaces() if n.startswith("ina-s1-")]


# --- the switch node on its own (a stand-in process, no switch needed) --------------------------------------


def test_switch_node_starts_waits_and_stops(stand_in: list[str], tmp_path: Path) -> None:
    sw = P4Switch("s7", target="ina-switch", executable=stand_in, grpc_port=free_port(), log_dir=tmp_path, log_level=None)
    try:
        sw.start([])
        assert sw.running
        socket.create_connection(("127.0.0.1", sw.grpc_port), timeout=1).close()
        argv = sw.command_line()
        assert argv[len(stand_in):] == ["--config", str(tmp_path / "s7.toml"), "--device-id", "7", "--no-p4", "--",
                                        "--grpc-server-addr", f"127.0.0.1:{sw.grpc_port}", "--cpu-port", "255"]
        assert load(SwitchConfig, tmp_path / "s7.toml") == sw.switch_config()  # the switch's whole configuration
        pid, started = sw.process.pid, run_state.process_start_time(sw.process.pid)
        assert any(r.pid == pid for r in run_state.current_state().processes)
    finally:
        sw.stop()
        sw.terminate()
    assert not run_state.process_alive(pid, started)
    assert not any(r.pid in (pid, sw.pid) for r in run_state.current_state().processes)


def test_switch_node_kills_a_switch_that_ignores_sigterm(stand_in: list[str], tmp_path: Path) -> None:
    sw = P4Switch("s8", target="ina-switch", executable=stand_in, extra_args=["--stubborn"], grpc_port=free_port(), log_dir=tmp_path)
    try:
        sw.start([])
        pid, started = sw.process.pid, run_state.process_start_time(sw.process.pid)
        t0 = time.monotonic()
        sw.stop_process(timeout=0.5)
        assert time.monotonic() - t0 < 5
        assert not run_state.process_alive(pid, started)
    finally:
        sw.terminate()


def test_switch_node_failure_names_the_log(stand_in: list[str], tmp_path: Path) -> None:
    # A bad flag: the real switch when there is one (its own usage error), else the stand-in.
    exe = shlex.split(SWITCH_COMMAND) if SWITCH_COMMAND else (None if HAVE_INA_SWITCH else stand_in)
    sw = P4Switch("s9", target="ina-switch", executable=exe, extra_args=["--bogus"], grpc_port=free_port(), log_dir=tmp_path)
    try:
        with pytest.raises(SwitchStartupError) as err:
            sw.start([])
        text = str(err.value)
        assert str(tmp_path / "s9.log") in text and "exited with code" in text
        assert "unrecognized arguments: --bogus" in text  # the switch's own words, from its log
        assert not sw.running
    finally:
        sw.terminate()


def test_switch_node_refuses_a_port_in_use(stand_in: list[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sw = P4Switch("s10", target="ina-switch", executable=stand_in, grpc_port=port, log_dir=tmp_path)
        try:
            with pytest.raises(SwitchStartupError) as err:
                sw.start([])
            assert "already in use" in str(err.value) and str(tmp_path / "s10.log") in str(err.value)
            assert sw.process is None
        finally:
            sw.terminate()


def test_switch_node_times_out_and_kills_a_silent_switch(stand_in: list[str], tmp_path: Path) -> None:
    sw = P4Switch("s11", target="ina-switch", executable=stand_in, extra_args=["--mute"], grpc_port=free_port(),
                  log_dir=tmp_path, ready_timeout=0.5)
    try:
        with pytest.raises(SwitchStartupError) as err:
            sw.start([])
        assert "did not answer" in str(err.value) and "s11.log" in str(err.value)
        assert not sw.running
    finally:
        sw.terminate()


# --- cleanup ---------------------------------------------------------------------------------------------


CRASHING_RUN = textwrap.dedent("""
    import os, sys, time
    from topologies.network import InaNetwork
    from topologies.topos import LeafSpineTopo
    net = InaNetwork(LeafSpineTopo(2, 1), target="ina-switch", install_routes=False,
                     switch_opts={"executable": sys.argv[1:]}, run_dir=os.environ["RUN_DIR"])
    net.start()
    net.host("h1").popen(["sleep", "600"])  # something running inside a host, as an agent would
    print("READY", flush=True)
    time.sleep(600)
""")


def test_cleanup_after_a_crash_removes_everything(stand_in: list[str], tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_RUN)
    env = {**os.environ, "RUN_DIR": str(tmp_path / "run"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script), *stand_in], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read() if proc.poll() is not None else line
        state_path = run_state.STATE_DIR / f"run-{proc.pid}.json"
        state = run_state.RunState.load(state_path)
        assert {r.role for r in state.processes} == {"host-shell", "switch-shell", "switch"}
        assert len(state.interfaces) == 6  # two ports on each leaf and on the spine
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the crash: nothing of the run is stopped
        proc.wait()
    state = run_state.RunState.load(state_path)
    assert any(run_state.process_alive(r.pid, r.start_time) for r in state.processes)  # orphans, as after any crash
    report = cleanup_all(stop_live=False, sweep=True)
    assert str(state_path) in report.state_files and not state_path.exists()
    # h2's shell died with the pty of its crashed parent, taking its namespace along; h1's namespace
    # outlived it because of the process inside, which only the recorded namespace inode can find.
    h1 = next(r for r in state.processes if r.name == "h1")
    assert h1.netns in report.namespaces
    assert_nothing_left(state.processes, state.interfaces)
