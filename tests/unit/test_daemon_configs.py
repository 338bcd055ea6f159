"""What the lab records of every daemon it starts (results.json's ``daemons``): the whole configuration, written as the
file the daemon reads, read back by the daemon's own command line into the same value, and loaded back from the
record with ``inaproto.config.load`` into an equal dataclass. No process is started: the command lines are parsed
by the daemons' own parsers in this process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mininet")

from controller import daemon
from controller.config import ControllerConfig
from host_agent import cli as agent_cli
from host_agent.options import AgentOptions, StreamOptions
from inaproto.config import as_dict, load
from simulator.calibration import Calibration
from simulator.config import SimConfig
from softswitch import cli as switch_cli
from softswitch.config import FaultSettings, LogLevel, SwitchConfig
from topologies.daemons import DaemonRecord, write_config
from topologies.experiments import testbed as lab
from topologies.experiments.multijob import TINY_TRACE, simulate_trace
from topologies.experiments.testbed import AgentJob
from topologies.nodes import P4Switch, fault_settings

TOPOLOGY = {"hosts": {"h1": {"ip": "10.0.1.1/24", "mac": "02:00:00:00:01:01"},
                      "h2": {"ip": "10.0.1.2/24", "mac": "02:00:00:00:01:02"}},
            "switches": {"s1": {"grpc": "127.0.0.1:9559", "device_id": 1}}, "links": [["h1", "s1-p1"], ["h2", "s1-p2"]]}


def switch_node(tmp_path: Path, **attrs) -> P4Switch:
    """A switch node as the testbed starts it, without Mininet: its attributes only."""
    sw = P4Switch.__new__(P4Switch)
    sw.__dict__.update({"command": ["ina-switch"], "device_id": 1, "grpc_port": 9559, "log_level": "warn", "pcap": False,
                        "pcap_dir": tmp_path, "kind": "ina-switch", "thrift_port": None,
                        "faults": fault_settings({"drop": 0.05, "seed": 3}), "link_delay_ms": {1: 2.0, 2: 2.0},
                        "extra_args": [], "program": None, "cpu_port": 255,
                        "config_path": tmp_path / "config" / "s1.toml", **attrs})
    sw.data_ports = lambda: [(1, "ina-s1-p1"), (2, "ina-s1-p2")]
    return sw


def as_results_json(record: DaemonRecord) -> dict:
    """The record as results.json holds it (written and read again)."""
    return json.loads(json.dumps(record.as_dict()))


def test_a_switch_reads_the_configuration_the_lab_records(tmp_path):
    sw = switch_node(tmp_path)
    config = sw.switch_config()
    assert config.faults == FaultSettings(drop=("0.05",), seed=3) and config.link_delay == ("1:2", "2:2")
    assert (config.log.console, config.log.level, config.program) == (True, LogLevel.WARN, "")
    write_config(config, sw.config_path, "switch s1")
    argv = sw.command_line()
    assert argv[:3] == ["ina-switch", "--config", str(sw.config_path)]
    assert argv[3:] == ["--device-id", "1", "-i", "1@ina-s1-p1", "-i", "2@ina-s1-p2", "--no-p4", "--",
                        "--grpc-server-addr", "127.0.0.1:9559", "--cpu-port", "255"]  # what names this switch only
    parsed = switch_cli.parse_args(argv[1:])
    assert isinstance(parsed, switch_cli.Invocation) and parsed.config == config
    record = DaemonRecord()
    record.add_switch("s1", config)
    assert load(SwitchConfig, None, as_results_json(record)["switches"]["s1"]) == config


def test_bmv2_gets_the_same_configuration_as_its_own_flags(tmp_path):
    sw = switch_node(tmp_path, kind="bmv2", faults=FaultSettings(), link_delay_ms={}, pcap=True, thrift_port=9091)
    argv = sw.command_line()
    assert "--config" not in argv and argv[1:6] == ["--log-console", "-L", "warn", f"--pcap={tmp_path}", "--thrift-port"]
    # ina-switch takes BMv2's command line too: the same configuration comes out of it
    assert switch_cli.parse_args([a for a in argv[1:] if a not in ("--thrift-port", "9091")]).config == sw.switch_config()


def test_fault_options_are_checked_before_a_switch_starts():
    assert fault_settings({"drop": [0.01, "2:0.5"], "port": 2}) == FaultSettings(drop=("0.01", "2:0.5"), ports=(2,))
    with pytest.raises(ValueError, match="unknown fault option 'lose'"):
        fault_settings({"lose": 0.1})
    with pytest.raises(ValueError, match="probability 2 is not within"):
        fault_settings({"drop": 2})


def make_testbed(tmp_path: Path, **kwargs) -> lab.Testbed:
    records: list[dict] = []
    bed = lab.Testbed(None, run_dir=tmp_path, on_daemons=records.append, **kwargs)
    (tmp_path / "topology.json").write_text(json.dumps(TOPOLOGY))
    bed.controller_port = 50123
    bed.records = records  # type: ignore[attr-defined]
    return bed


def test_the_controller_reads_the_configuration_the_lab_records(tmp_path):
    bed = make_testbed(tmp_path, policy="priority", heartbeat_timeout=5.0, controller_settings={"trees": True})
    argv = bed.controller_command(1, pool=64)
    config = daemon.config_from(daemon.build_parser().parse_args(argv[1:]))
    assert (config.policy, config.heartbeat_timeout, config.trees, config.listen) == ("priority", 5.0, True,
                                                                                      "127.0.0.1:50123")
    bed.controller_command(2, pool=64)  # a restart with the same configuration: recorded once, with both starts
    [entry] = bed.records[-1]["controller"]
    assert entry["starts"] == [1, 2] and load(ControllerConfig, None, entry["config"]) == config
    assert load(ControllerConfig, tmp_path / "config" / "controller-2.toml") == config


def test_a_wrong_controller_setting_is_refused_before_anything_starts(tmp_path):
    from topologies.errors import ExperimentError

    with pytest.raises(ExperimentError, match="controller settings"):
        lab.Testbed(None, run_dir=tmp_path, controller_settings={"tree": True})


def test_agents_read_their_jobs_configuration_and_identical_ones_are_recorded_once(tmp_path):
    bed = make_testbed(tmp_path, agent_timeout=30.0)
    ina = AgentJob("ar-ina", ("h1", "h2"), "allreduce", backend="ina", args=("--elements", "64"))
    ring = AgentJob("ar-ring", ("h1", "h2"), "allreduce", backend="ring")
    paced = AgentJob("paced", ("h1",), "allreduce", options=AgentOptions(stream=StreamOptions(link_bps=1e6)))
    argvs = {job.name: [bed.job_argv(job, wid) for wid in range(len(job.hosts))] for job in (ina, ring, paced)}
    assert "--timeout" not in argvs["ar-ina"][0]  # the timeouts are settings: in the file
    for job in (ina, ring, paced):
        for argv in argvs[job.name]:
            options = agent_cli.agent_options(agent_cli.build_parser().parse_args(argv[1:]))
            assert options == (job.options or AgentOptions(stream=StreamOptions(op_timeout=30.0), rendezvous_timeout=30.0))
    agents = as_results_json(bed.daemons)["agents"]
    assert [entry["workers"] for entry in agents] == [{"ar-ina": [0, 1], "ar-ring": [0, 1]}, {"paced": [0]}]
    assert load(AgentOptions, None, agents[1]["config"]) == paced.options
    assert bed.records[-1]["agents"] == bed.daemons.as_dict()["agents"]  # handed on as it grows


def test_a_simulated_trace_records_a_configuration_ina_sim_runs_again(tmp_path):
    recorded: list[SimConfig] = []
    simulate_trace(TINY_TRACE, requested=8, min_slots=1, pool=16, policy="priority", bw_mbps=2.0,
                   calibration=Calibration(), out=tmp_path, record=recorded.append)
    [config] = recorded
    assert config.policies == ("priority",) and config.cluster.slots_per_switch == 16 and config.trace.exists()
    assert load(SimConfig, tmp_path / "sim.toml") == config
    assert load(SimConfig, None, json.loads(json.dumps(as_dict(config)))) == config
