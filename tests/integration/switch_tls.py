"""P4Runtime over mutual TLS against a switch process started from the command line: the same flags for
``ina-switch`` and BMv2's ``simple_switch_grpc`` (``--grpc-server-ssl`` and friends). ``ina-controller``
connects with ``--switch-tls-*`` and installs a job; a plaintext client and a TLS client without a
certificate are refused. Used by tests/integration/test_switch_tls.py and tests/bmv2/test_bmv2_tls.py."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import grpc
import pytest

from controller.auth import SwitchTls
from controller.p4entity import Schema
from controller.switch import Switch, SwitchError, SwitchOptions
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.commands import Command, command_argv
from inaproto.credentials import admission_channel
from tests.support.ports import free_port
from topologies.loopback import write_admin_credential
from topologies.netns import Process
from topologies.switch_process import switch_command

REPO = Path(__file__).resolve().parents[2]
SCHEMA = Schema.from_file(REPO / "p4src" / "ina.p4info.txt")


def make_certificates(folder: Path) -> dict[str, str]:
    """docs/security.md's recipe: ca.pem, server.pem/.key (127.0.0.1, localhost), client.pem/.key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    subprocess.run(["sh", str(REPO / "scripts" / "make-test-certs.sh"), str(folder)], check=True, capture_output=True)
    return {name: str(folder / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def tls_target_args(pems: dict[str, str]) -> list[str]:
    """The target options (after '--') of a switch serving P4Runtime over mutual TLS: BMv2's names."""
    return ["--grpc-server-ssl", "--grpc-server-cert", pems["server.pem"], "--grpc-server-key", pems["server.key"],
            "--grpc-server-with-client-auth", "--grpc-server-cacert", pems["ca.pem"]]



def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _switch(address: str, tls: SwitchTls | None) -> Switch:
    """A backup client (reads only) of device 1."""
    return Switch(SwitchOptions("s1", address, 1, election_id=(0, 1), connect_timeout=5, tls=tls), SCHEMA)


def run_tls_scenario(kind: str, tmp: Path, device_config: Path | None = None) -> None:
    """Start ``kind`` with TLS flags, a controller over TLS, install a job and check it; refuse plaintext."""
    pems = make_certificates(tmp / "certs")
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs: list[Process] = []
    try:
        argv = [*switch_command(kind), "--device-id", "1", "--log-console", "-L", "warn", "--no-p4", "--",
                "--grpc-server-addr", address, *tls_target_args(pems)]
        switch = Process(argv, tmp / f"{kind}.log")
        procs.append(switch)
        switch.wait_until(lambda: _port_open(port), 30, f"{kind} listening on {address}")

        topology = {"hosts": {f"h1{i}": {"ip": f"10.0.1.{i}/24", "mac": f"02:00:00:00:01:{i:02x}"} for i in (1, 2)},
                    "switches": {"s1": {"grpc": address, "device_id": 1, "pool": 16}},
                    "links": [["h11", "s1-p1"], ["h12", "s1-p2"]]}
        (tmp / "topology.json").write_text(json.dumps(topology))
        admin = write_admin_credential(tmp / "admin.credential")
        listen = f"127.0.0.1:{free_port()}"
        ctl_argv = [*command_argv(Command.CONTROLLER), "--topology", str(tmp / "topology.json"), "--db", str(tmp / "ctl.db"),
                    "--listen", listen, "--set", "heartbeat_timeout=0", "--set", f"admin_credential={admin}",
                    "--set", f'switch_tls={{ca = "{pems["ca.pem"]}", cert = "{pems["client.pem"]}", key = "{pems["client.key"]}"}}',
                    "--set", "connect_timeout=20"]
        if device_config is not None:
            ctl_argv += ["--device-config", str(device_config)]
        ctl_log = tmp / "controller.log"
        controller = Process(ctl_argv, ctl_log)
        procs.append(controller)
        controller.wait_until(lambda: "listening on" in ctl_log.read_text(errors="replace"), 60, "ina-controller serving")

        with admission_channel(listen, admin.read_text().strip()) as channel:
            workers = [pb.Worker(worker_id=i, host=h, udp_port=40000 + i) for i, h in enumerate(("h11", "h12"))]
            grant = pb_grpc.AdmissionStub(channel).RegisterJob(
                pb.RegisterJobRequest(name="tls", workers=workers, tensor_elements=4096, requested_slots=8), timeout=20)
        s = grant.switches[0]
        with _switch(address, SwitchTls(pems["ca.pem"], pems["client.pem"], pems["client.key"])) as sw:
            jobs = {e.match[0]: e.params for e in sw.read_table("MyIngress.ina_job")}
        assert jobs == {grant.job_id: (s.base_slot, s.num_slots, 0b11, 2, s.mcast_grp, grant.generation, 0)}  # owner epoch 0

        for refused in (None, SwitchTls(pems["ca.pem"])):  # plaintext; TLS without a client certificate
            client = _switch(address, refused)
            with pytest.raises(SwitchError) as e:
                client.connect()
            client.close()
            assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e.value
        assert switch.popen.poll() is None, f"{kind} died"
    finally:
        for p in reversed(procs):
            p.stop()
