"""ina-controller's command line: runtime JSON export, startup errors as one line and exit 1."""
from __future__ import annotations

import io
import json
import sqlite3
from contextlib import redirect_stderr, redirect_stdout

import pytest

from controller import daemon
from controller.config import ControllerConfig
from controller.core import Controller, Refusal
from controller.p4entity import Schema
from controller.topology import Topology, read_runtime_json
from inaproto.commands import REPO
from topologies.loopback import LocalControlPlane, worker

TOPO = {
    "hosts": {"h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11"}, "h2": {"ip": "10.0.2.2/24", "mac": "08:00:00:00:02:22"}},
    "switches": {"s1": {}, "s2": {}},
    "links": [["h1", "s1-p1"], ["h2", "s2-p1"], ["s1-p2", "s2-p2"]],
}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = daemon.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_write_runtime_exports_tutorials_runtime_json(tmp_path):
    (tmp_path / "topology.json").write_text(json.dumps(TOPO))
    code, out, _ = run(["--topology", str(tmp_path / "topology.json"), "--write-runtime", str(tmp_path / "rt")])
    assert code == 0 and out.split() == [str(tmp_path / "rt" / "s1-runtime.json"), str(tmp_path / "rt" / "s2-runtime.json")]
    doc = json.loads((tmp_path / "rt" / "s2-runtime.json").read_text())
    assert doc["target"] == "bmv2" and doc["bmv2_json"] == str(REPO / "build" / "ina.json")  # absolute: the checkout's
    assert {"table": "MyIngress.ipv4_lpm", "match": {"hdr.ipv4.dstAddr": ["10.0.1.1", 32]},
            "action_name": "MyIngress.ipv4_forward", "action_params": {"dstAddr": "08:00:00:00:01:11", "port": 2}} in doc["table_entries"]
    entries, _ = read_runtime_json(tmp_path / "rt" / "s2-runtime.json", Schema.from_file("p4src/ina.p4info.txt"))
    assert entries == Topology.from_dict(TOPO).forwarding("s2", Schema.from_file("p4src/ina.p4info.txt"))[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--switch", "name=s1,addr=127.0.0.1:1", "--set", "connect_timeout=0.3"], "ina-controller: switch s1: connect to 127.0.0.1:1"),
        (["--switch", "name=s1"], "addr= is required"),
        ([], "no switch"),
        (["--topology", "/nonexistent/topology.json"], "No such file"),
    ],
)
def test_startup_errors_are_one_line_and_exit_1(tmp_path, argv, words):
    code, out, err = run([*argv, "--db", str(tmp_path / "x.db")])
    assert code == 1 and out == "" and err.count("\n") == 1 and words in err


def test_topology_and_switch_together_are_refused(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(TOPO))
    code, _, err = run(["--topology", str(tmp_path / "t.json"), "--switch", "name=s1,addr=x", "--db", str(tmp_path / "x.db")])
    assert code == 2 and "not both" in err


@pytest.mark.parametrize("argv, words", [
    (["--set", "election_id=[0, 0]"], "election_id (0, 0): non-negative values, not 0,0"),
    (["--set", "heartbeat_timeout=-1"], "heartbeat_timeout must be >= 0"),
    (["--set", "hearbeat_timeout=1"], "unknown key hearbeat_timeout"),
    (["--set", "connect_timeout=soon"], "connect_timeout: expected a number"),
    (["--set", "policy=fastest"], "policy 'fastest' is not one of"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, argv, words):
    err = io.StringIO()
    with redirect_stderr(err):
        assert daemon.main(["--switch", "name=s1,addr=x", "--db", str(tmp_path / "x.db"), *argv]) == 2
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("ina-controller: error: ") and words in err.getvalue()


def test_bad_flag_values_exit_2(tmp_path):
    with pytest.raises(SystemExit) as exc, redirect_stderr(io.StringIO()):
        daemon.main(["--switch", "name=s1,addr=x", "--db", str(tmp_path / "x.db"), "--policy", "fastest"])
    assert exc.value.code == 2


def test_print_config_reads_back_as_the_same_configuration(tmp_path, capsys):
    assert daemon.main(["--switch", "name=s1,addr=x", "--set", "heartbeat_timeout=0", "--trees", "--print-config"]) == 0
    (tmp_path / "c.toml").write_text(capsys.readouterr().out)
    args = daemon.build_parser().parse_args(["--config", str(tmp_path / "c.toml")])
    config = daemon.config_from(args)
    assert config.heartbeat_timeout == 0 and config.trees and config.switches == ("name=s1,addr=x",)


def test_database_of_another_topology_is_refused(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", n_switches=2) as h:
        h.stub.RegisterJob(daemon_request())
        one = Topology.from_dict({  # the same network without s2
            "switches": {"s1": h.doc["switches"]["s1"]},
            "hosts": {n: v for n, v in h.doc["hosts"].items() if n.startswith("h1")},
            "links": [link for link in h.doc["links"] if link[0].startswith("h1")],
        })
        h.stop_controller()
        ctl = Controller(one, ControllerConfig(db_path=tmp_path / "ctl.db", connect_timeout=2))
        with pytest.raises(Refusal, match="under switch s2"):
            ctl.start()
    db = sqlite3.connect(tmp_path / "ctl.db")
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1  # nothing was lost either
    db.close()


def daemon_request():
    from inaproto import admission_pb2 as pb

    return pb.RegisterJobRequest(name="x", workers=[worker(0, "h11"), worker(1, "h21")], tensor_elements=64)
