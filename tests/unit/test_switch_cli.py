"""The ina-switch command line (softswitch/cli.py): simple_switch_grpc's shape, the configuration file, one-line
errors, program checks."""
from __future__ import annotations

import json
import tomllib

import pytest

from softswitch import cli, p4program
from softswitch.config import LogLevel, SwitchConfig
from softswitch.faults import FaultSpec
from tests.integration import bmv2json

BASE = ["--device-id", "1", "-i", "1@veth1", "-i", "2@veth2"]


def _run(*argv: str) -> cli.Invocation:
    parsed = cli.parse_args(list(argv))
    assert isinstance(parsed, cli.Invocation)
    return parsed


def _config(*argv: str) -> SwitchConfig:
    return _run(*argv).config


def test_simple_switch_grpc_command_line_shape():
    c = _config(*BASE, "--log-console", "-L", "info", "--no-p4", "--", "--grpc-server-addr", "127.0.0.1:50001",
                "--cpu-port", "255")
    assert c.device_id == 1
    assert c.ports() == {1: "veth1", 2: "veth2"}
    assert c.program == ""
    assert c.grpc_server_addr == "127.0.0.1:50001" and c.cpu_port == 255
    assert c.log.console and c.log.level is LogLevel.INFO


def test_defaults_are_bmv2s_but_loopback():
    c = _config("--no-p4")
    assert c.device_id == 0  # as BMv2
    assert c.grpc_server_addr == "127.0.0.1:9559"  # BMv2 binds 0.0.0.0: never a wildcard here
    assert c.cpu_port == 0 and c.pcap_dir == "" and c.log.level is LogLevel.TRACE
    assert not c.faults.fault_config().active and not c.tls.ssl


def test_program_positional(tmp_path):
    assert _config(*BASE, str(tmp_path / "ina.json")).program == str(tmp_path / "ina.json")


def test_pcap_directory(tmp_path):
    assert _config("--no-p4", "--pcap", str(tmp_path)).pcap_dir == str(tmp_path)
    assert _config("--no-p4", "--pcap").pcap_dir == "."
    assert _config("--pcap", "prog.json").program == "prog.json"  # BMv2's --pcap takes its directory as --pcap=DIR
    with pytest.raises(cli.UsageError, match="does not exist"):
        cli.parse_args(["--no-p4", "--pcap", str(tmp_path / "nope")])


def test_faults_from_the_command_line():
    c = _config("--no-p4", "--fault-drop", "0.1", "--fault-dup", "2:0.5", "--fault-seed", "9", "--fault-port", "2",
                "--fault-direction", "in")
    f = c.faults.fault_config()
    assert f.default == FaultSpec(drop=0.1) and dict(f.per_port)[2] == FaultSpec(drop=0.1, dup=0.5)
    assert f.seed == 9 and f.ports == {2} and f.direction == "in"


def test_accepted_with_a_warning():
    run = _run("--no-p4", "--thrift-port", "9090", "--log-flush", "--", "--cpu-port", "64", "--disable-swap")
    assert any("thrift" in w for w in run.warnings)
    assert any("255" in w for w in run.warnings)


def test_the_configuration_file_and_the_flags_over_it(tmp_path):
    path = tmp_path / "switch.toml"
    path.write_text('device_id = 3\ninterfaces = ["1@a", "2@b"]\ncpu_port = 255\n[log]\nlevel = "warn"\n'
                    '[faults]\ndrop = ["0.25"]\n')
    c = _config("--config", str(path))
    assert (c.device_id, c.ports(), c.cpu_port, c.log.level) == (3, {1: "a", 2: "b"}, 255, LogLevel.WARN)
    assert c.program == "" and c.faults.fault_config().default.drop == 0.25
    c = _config("--config", str(path), "--device-id", "4", "-L", "info", "--set", "faults.seed=5")
    assert (c.device_id, c.log.level, c.faults.seed) == (4, LogLevel.INFO, 5)
    with pytest.raises(cli.UsageError, match="unknown key"):
        cli.parse_args(["--config", str(path), "--set", "nonsense=1"])


def test_print_config_is_a_file_config_reads_back(tmp_path, capsys):
    argv = [*BASE, "--no-p4", "--fault-drop", "3:0.5", "--link-delay", "5", "--", "--cpu-port", "255"]
    assert cli.main(["--print-config", *argv]) == 0
    text = capsys.readouterr().out
    assert tomllib.loads(text)["faults"]["drop"] == ["3:0.5"]
    (tmp_path / "c.toml").write_text(text)
    assert _config("--config", str(tmp_path / "c.toml")) == _config(*argv)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--no-p4", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--no-p4", "-i", "1"], "expected PORT@IFACE"),
        (["--no-p4", "-i", "x@eth0"], "not a number"),
        (["--no-p4", "-i", "511@eth0"], "0..510"),
        (["--no-p4", "-i", "1@"], "expected PORT@IFACE"),
        (["--no-p4", "-i", "1@a-name-longer-than-15"], "not a valid interface name"),
        (["--no-p4", "-i", "1@a", "-i", "1@b"], "port 1 is given twice"),
        (["--no-p4", "-i", "1@a", "-i", "2@a"], "interface a is given twice"),
        (["--no-p4", "-L", "loud"], "invalid choice"),
        (["--no-p4", "--log-console", "--log-file", "x"], "exclusive"),
        (["--no-p4", "--log-file-max-size", "0"], "file_max_size must be positive"),
        ([], "please specify an input JSON"),
        (["--no-p4", "--grpc-server-addr", "127.0.0.1:1"], "is a target option: put it after '--'"),
        (["--no-p4", "--", "--cpu-port", "511"], "not within 1..510"),
        (["--no-p4", "-i", "255@a", "--", "--cpu-port", "255"], "also an interface's port"),
        (["--no-p4", "--", "--grpc-server-addr", "nonsense"], "is not HOST:PORT"),
        (["--no-p4", "--", "--drop-port", "64"], "port 511 only"),
        (["--no-p4", "--", "--dp-grpc-server-addr", "0.0.0.0:50052"], "not supported"),
        (["--no-p4", "--", "--unknown-target-flag"], "unrecognized arguments"),
        (["--no-p4", "--nanolog", "ipc:///tmp/x"], "not supported"),
        (["--no-p4", "--use-files", "0"], "not supported"),
        (["--no-p4", "--fault-drop", "1.5"], "not within [0, 1]"),
        (["--no-p4", "--device-id", "-1"], "non-negative"),
        (["--no-p4", "--link-delay", "ten"], "expected MS or PORT:MS"),
        (["--no-p4", "--io", "rings"], "unrecognized arguments: --io"),
    ],
)
def test_mistakes_are_usage_errors(argv, needle):
    with pytest.raises(cli.UsageError) as e:
        cli.parse_args(argv)
    assert needle in str(e.value)


def test_main_prints_one_line_and_returns_non_zero(capsys):
    assert cli.main(["--no-p4", "--frobnicate"]) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("ina-switch: error: ") and "--frobnicate" in err
    assert "Traceback" not in err


def test_help_fits_one_screen_and_versions(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for opt in ("--device-id", "-i, --interface PORT@IFACE", "--pcap", "--log-file", "--fault-drop", "--config FILE",
                "--print-config", "--grpc-server-addr", "--cpu-port"):
        assert opt in out
    assert len(out.splitlines()) <= 40 and max(map(len, out.splitlines())) <= 120
    assert cli.main(["--version"]) == 0 and "ina-switch" in capsys.readouterr().out
    assert cli.main(["--json-version"]) == 0 and capsys.readouterr().out.strip().startswith("2.")


def test_model_json_is_accepted(tmp_path):
    path = bmv2json.write(bmv2json.model_json(), tmp_path / "ina.json")
    assert p4program.check_program(str(path)) == path.read_bytes()


def _refused(tmp_path, doc) -> str:
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    with pytest.raises(p4program.ProgramError) as e:
        p4program.check_program(str(path))
    return str(e.value)


def test_unknown_table_is_refused_with_its_name(tmp_path):
    assert "MyIngress.acl" in _refused(tmp_path, bmv2json.with_unknown_table(bmv2json.model_json()))


def test_missing_register_counter_or_action_is_refused(tmp_path):
    doc = bmv2json.model_json()
    doc["register_arrays"] = [r for r in doc["register_arrays"] if r["name"] != "MyIngress.ina_lanes"]
    assert "MyIngress.ina_lanes" in _refused(tmp_path, doc)
    doc = bmv2json.model_json()
    doc["counter_arrays"][0]["size"] = 7
    assert "MyIngress.ina_aggregated" in _refused(tmp_path, doc)
    doc = bmv2json.model_json()
    next(a for a in doc["actions"] if a["name"] == "MyIngress.ipv4_forward")["runtime_data"][1]["bitwidth"] = 16
    assert "MyIngress.ipv4_forward" in _refused(tmp_path, doc)


def test_wrong_widths_are_refused(tmp_path):
    doc = bmv2json.model_json()
    ina = next(t for t in doc["header_types"] if t["name"] == "ina_t")
    next(f for f in ina["fields"] if f[0] == "job_id")[1] = 8
    assert "hdr.ina.job_id is 8 bits wide" in _refused(tmp_path, doc)
    doc = bmv2json.model_json()
    next(r for r in doc["register_arrays"] if r["name"] == "MyIngress.ina_count")["bitwidth"] = 16
    assert "MyIngress.ina_count" in _refused(tmp_path, doc)


def test_not_json_or_wrong_version_is_refused(tmp_path):
    assert "not JSON" in _refused(tmp_path, "{nope")
    doc = bmv2json.model_json()
    doc["__meta__"]["version"] = [3, 0]
    assert "version 3.0" in _refused(tmp_path, doc)
    with pytest.raises(p4program.ProgramError, match="cannot read"):
        p4program.check_program(str(tmp_path / "missing.json"))


def test_main_refuses_a_program_in_one_line(tmp_path, capsys):
    path = bmv2json.write(bmv2json.with_unknown_table(bmv2json.model_json()), tmp_path / "other.json")
    assert cli.main(["--device-id", "1", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MyIngress.acl" in err


def test_link_delay_from_the_command_line():
    run = _run(*BASE, "--no-p4", "--link-delay", "5", "--link-delay", "2:1.5", "--link-delay", "7:1")
    delays = run.config.delays()
    assert delays.default == 0.005 and dict(delays.per_port) == {2: 0.0015, 7: 0.001}
    assert any("link delay on port 7" in w for w in run.warnings)
    assert not _config(*BASE, "--no-p4").delays().active


def test_grpc_server_tls_options_are_bmv2s(tmp_path):
    pems = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for path in pems.values():
        path.write_text("PEM")
    tls = _config("--no-p4", "--", "--grpc-server-ssl", "--grpc-server-cert", str(pems["cert"]),
                  "--grpc-server-key", str(pems["key"]), "--grpc-server-with-client-auth",
                  "--grpc-server-cacert", str(pems["ca"])).tls
    assert (tls.ssl, tls.cert, tls.key, tls.cacert, tls.client_auth) == (
        True, str(pems["cert"]), str(pems["key"]), str(pems["ca"]), True)
    server_only = _config("--no-p4", "--", "--grpc-server-ssl", "--grpc-server-cert", str(pems["cert"]),
                          "--grpc-server-key", str(pems["key"])).tls
    assert server_only.ssl and not server_only.client_auth and server_only.cacert == ""


@pytest.mark.parametrize("target, needle", [
    (["--grpc-server-ssl"], "ssl needs cert and key (--grpc-server-cert, --grpc-server-key)"),
    (["--grpc-server-ssl", "--grpc-server-cert", "c.pem"], "ssl needs cert and key"),
    (["--grpc-server-cert", "c.pem", "--grpc-server-key", "k.pem"], "cert needs ssl (--grpc-server-ssl)"),
    (["--grpc-server-with-client-auth"], "client_auth needs ssl (--grpc-server-ssl)"),
    (["--grpc-server-ssl", "--grpc-server-cert", "/nonexistent.pem", "--grpc-server-key", "/nonexistent.key"],
     "--grpc-server-cert /nonexistent.pem: cannot read the file"),
])
def test_grpc_server_tls_mistakes_are_usage_errors(target, needle):
    with pytest.raises(cli.UsageError) as e:
        cli.parse_args(["--no-p4", "--", *target])
    assert needle in str(e.value)


def test_tls_with_client_auth_needs_the_ca(tmp_path):
    (tmp_path / "c.pem").write_text("PEM")
    with pytest.raises(cli.UsageError, match="client_auth needs cacert"):
        cli.parse_args(["--no-p4", "--", "--grpc-server-ssl", "--grpc-server-cert", str(tmp_path / "c.pem"),
                        "--grpc-server-key", str(tmp_path / "c.pem"), "--grpc-server-with-client-auth"])
