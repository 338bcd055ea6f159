"""Tenants at the admission service: job secrets, the admin credential, idempotent registration, TLS.

A job's calls without a credential get UNAUTHENTICATED, with another job's PERMISSION_DENIED, and
neither changes anything (jobs, database, switch entries); the controller stores only salted hashes."""
from __future__ import annotations

import io
import os
import shutil
import sqlite3
import stat
import subprocess
import sys

import grpc
import pytest

from controller import cli
from controller.auth import ServerTls, hash_secret, secret_matches
from controller.service import serve
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.commands import REPO
from inaproto.credentials import TlsFiles, admission_channel
from topologies.loopback import LocalControlPlane, worker

TABLES = ("MyIngress.ina_job", "MyEgress.ina_worker")
ALICE, BOB = "alice-secret-" + "a" * 32, "bob-secret-" + "b" * 32


@pytest.fixture
def h(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as harness:
        yield harness


def request(name: str, hosts: list[str], key: str = "") -> pb.RegisterJobRequest:
    return pb.RegisterJobRequest(name=name, workers=[worker(i, x) for i, x in enumerate(hosts)], tensor_elements=256,
                                 requested_slots=4, idempotency_key=key)


def snapshot(h) -> tuple:
    """Everything a refused call must leave alone: jobs and grants, database rows, switch entries."""
    jobs = [j.SerializeToString(deterministic=True) for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs]
    db = sqlite3.connect(str(h.options.db_path))
    try:
        rows = db.execute("SELECT * FROM jobs ORDER BY job_id").fetchall(), db.execute("SELECT * FROM meta ORDER BY key").fetchall()
    finally:
        db.close()
    sw = h.switches["s1"]
    return jobs, rows, {t: sw.entries(t) for t in TABLES}, dict(sw.pipeline.multicast_groups)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if hasattr(result, "__next__"):
            next(result)
    return info.value.code()


def job_calls(stub, job_id: int) -> dict:
    return {
        "heartbeat": lambda: stub.Heartbeat(pb.HeartbeatRequest(job_id=job_id, worker_id=0), timeout=5),
        "release": lambda: stub.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=5),
        "watch": lambda: stub.WatchJob(pb.WatchJobRequest(job_id=job_id, worker_id=0), timeout=5),
        "sync": lambda: stub.SyncGeneration(pb.SyncGenerationRequest(job_id=job_id, worker_id=0, generation=1), timeout=5),
        "get": lambda: stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5),
        "stats": lambda: stub.GetStats(pb.GetStatsRequest(job_id=job_id), timeout=5),
    }


def test_admin_credential_is_written_once_with_mode_600(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as h:
        path = h.controller.authority.path
        assert path == tmp_path / "ctl.db.admin"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        first = path.read_text()
        h.restart_controller()
        assert path.read_text() == first, "a restart keeps the admin credential"
        assert list(h.stub.ListJobs(pb.ListJobsRequest()).jobs) == []


def test_a_job_without_credential_or_with_another_s_is_refused_and_nothing_changes(h):
    alice, bob, anonymous = h.job_stub(ALICE), h.job_stub(BOB), h.job_stub(None)
    assert code_of(lambda: anonymous.RegisterJob(request("a", ["h11", "h12"]), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert list(h.stub.ListJobs(pb.ListJobsRequest()).jobs) == []
    job_id = alice.RegisterJob(request("a", ["h11", "h12"]), timeout=5).job_id
    before = snapshot(h)
    for name, call in job_calls(anonymous, job_id).items():
        assert code_of(call) == grpc.StatusCode.UNAUTHENTICATED, name
    for name, call in job_calls(bob, job_id).items():
        assert code_of(call) == grpc.StatusCode.PERMISSION_DENIED, name
    assert code_of(lambda: anonymous.ListJobs(pb.ListJobsRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert snapshot(h) == before
    # the owner and the admin may; bob's retry of alice's key is not a way in either
    assert alice.Heartbeat(pb.HeartbeatRequest(job_id=job_id, worker_id=1), timeout=5).generation >= 1
    assert alice.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5).name == "a"
    h.stub.GetStats(pb.GetStatsRequest(job_id=job_id), timeout=5)
    alice.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=5)
    assert list(h.stub.ListJobs(pb.ListJobsRequest()).jobs) == []


def test_tenants_see_their_own_jobs_and_operator_calls_need_the_admin(h):
    alice, bob = h.job_stub(ALICE), h.job_stub(BOB)
    a = alice.RegisterJob(request("a", ["h11"]), timeout=5).job_id
    b = bob.RegisterJob(request("b", ["h12"]), timeout=5).job_id
    assert [j.job_id for j in alice.ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == [a]
    assert [j.job_id for j in bob.ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == [b]
    assert [j.job_id for j in h.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == [a, b]
    before = snapshot(h)
    for call in (lambda: alice.SetPolicy(pb.SetPolicyRequest(policy="equal"), timeout=5),
                 lambda: alice.GetPolicy(pb.GetPolicyRequest(), timeout=5),
                 lambda: alice.GetMemory(pb.GetMemoryRequest(), timeout=5),
                 lambda: alice.GetStats(pb.GetStatsRequest(all=True), timeout=5)):
        assert code_of(call) == grpc.StatusCode.PERMISSION_DENIED
    assert snapshot(h) == before
    h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=b), timeout=5)  # the admin may release anyone's job
    assert [j.job_id for j in h.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == [a]


def test_only_a_salted_hash_of_the_secret_is_stored(h):
    h.job_stub(ALICE).RegisterJob(request("a", ["h11"]), timeout=5)
    h.stop_controller()
    data = b"".join(p.read_bytes() for p in h.options.db_path.parent.glob("ctl.db*") if not p.name.endswith(".admin"))
    assert ALICE.encode() not in data
    (stored,) = sqlite3.connect(str(h.options.db_path)).execute("SELECT secret_hash FROM jobs").fetchone()
    assert secret_matches(stored, ALICE) and not secret_matches(stored, BOB) and not secret_matches(stored, "")
    assert hash_secret(ALICE) != hash_secret(ALICE), "salted"
    h.start_controller()
    assert [j.name for j in h.job_stub(ALICE).ListJobs(pb.ListJobsRequest(), timeout=5).jobs] == ["a"]


def test_a_retried_registration_gets_its_job_not_already_exists(h):
    alice = h.job_stub(ALICE)
    first = alice.RegisterJob(request("a", ["h11", "h12"], key="k1"), timeout=5)
    again = alice.RegisterJob(request("a", ["h11", "h12"], key="k1"), timeout=5)
    assert again == first
    h.restart_controller()  # the key is part of the stored request
    after = h.job_stub(ALICE).RegisterJob(request("a", ["h11", "h12"], key="k1"), timeout=5)
    assert after.job_id == first.job_id
    assert len(h.stub.ListJobs(pb.ListJobsRequest()).jobs) == 1
    # another key (or none) is another registration: the name is taken
    assert code_of(lambda: h.job_stub(ALICE).RegisterJob(request("a", ["h11", "h12"], key="k2"), timeout=5)) \
        == grpc.StatusCode.ALREADY_EXISTS
    # someone else's retry with a stolen key does not get the grant
    before = snapshot(h)
    assert code_of(lambda: h.job_stub(BOB).RegisterJob(request("a", ["h11", "h12"], key="k1"), timeout=5)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert snapshot(h) == before


def test_a_version_1_database_is_upgraded(tmp_path):
    db_path = tmp_path / "ctl.db"
    with LocalControlPlane(db_path, pool=16) as h:
        h.stub.RegisterJob(request("old", ["h11"]), timeout=5)
        h.stop_controller()
        db = sqlite3.connect(str(db_path))
        db.execute("ALTER TABLE jobs DROP COLUMN secret_hash")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        db.commit()
        db.close()
        h.start_controller()
        assert [j.name for j in h.stub.ListJobs(pb.ListJobsRequest()).jobs] == ["old"], "admin-only after the upgrade"
        assert list(h.job_stub(ALICE).ListJobs(pb.ListJobsRequest()).jobs) == []


def _inactl(argv, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "controller.cli", *argv], capture_output=True, text=True, timeout=30,
                          cwd=cwd, env={**os.environ, **(env or {})}, check=False)


def test_inactl_reads_the_admin_credential_by_default_and_a_tenant_s_file(tmp_path):
    with LocalControlPlane(tmp_path / "ina-controller.db", pool=16) as h:
        h.job_stub(ALICE).RegisterJob(request("a", ["h11"]), timeout=5)
        h.job_stub(BOB).RegisterJob(request("b", ["h12"]), timeout=5)
        clean = {k: v for k, v in os.environ.items() if k != "INA_ADMIN_CREDENTIAL_FILE"}
        clean["PYTHONPATH"] = str(REPO)  # run from another folder
        proc = subprocess.run([sys.executable, "-m", "controller.cli", "--controller", h.address, "jobs", "--json"],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path, env=clean, check=False)
        assert proc.returncode == 0 and '"name": "a"' in proc.stdout and '"name": "b"' in proc.stdout
        bob_file = tmp_path / "bob"
        bob_file.write_text(BOB + "\n")
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--controller", h.address, "--credential-file", str(bob_file), "release", "1"], out=out, err=err)
        assert code == cli.EXIT_REFUSED and err.getvalue() == "inactl: permission denied: job 1: the credential is not this job's\n"
        out = io.StringIO()
        assert cli.main(["--controller", h.address, "--credential-file", str(bob_file), "jobs", "--json"], out=out) == 0
        assert '"name": "b"' in out.getvalue() and '"name": "a"' not in out.getvalue()
        proc = subprocess.run([sys.executable, "-m", "controller.cli", "--controller", h.address, "jobs"],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path / "..", env=clean, check=False)
        assert proc.returncode == cli.EXIT_REFUSED and proc.stderr.startswith("inactl: unauthenticated: no credential")
        missing = cli.main(["--controller", h.address, "--credential-file", str(tmp_path / "nope"), "jobs"],
                           out=io.StringIO(), err=(err := io.StringIO()))
        assert missing == cli.EXIT_USAGE and err.getvalue().startswith("inactl: cannot read the credential file")


# --- TLS -------------------------------------------------------------------------------------------------
def make_certificates(folder) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate: docs/security.md's recipe."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    subprocess.run(["sh", str(REPO / "scripts" / "make-test-certs.sh"), str(folder)], check=True, capture_output=True)
    return {f"{label}_{kind}": str(folder / f"{label}.{'pem' if kind == 'cert' else 'key'}")
            for label in ("ca", "server", "client") for kind in ("cert", "key")}


def test_admission_service_over_tls_with_client_certificates(tmp_path):
    pems = make_certificates(tmp_path)
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as h:
        server, port = serve(h.controller, "127.0.0.1:0", tls=ServerTls(pems["server_cert"], pems["server_key"], pems["ca_cert"]))
        try:
            addr = f"127.0.0.1:{port}"
            tls = TlsFiles(pems["ca_cert"], pems["client_cert"], pems["client_key"])
            with admission_channel(addr, ALICE, tls) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                assert stub.RegisterJob(request("t", ["h11"]), timeout=10).job_id == 1
            with admission_channel(addr, ALICE, TlsFiles(pems["ca_cert"])) as channel:  # no client certificate
                assert code_of(lambda: pb_grpc.AdmissionStub(channel).ListJobs(pb.ListJobsRequest(), timeout=5)) \
                    == grpc.StatusCode.UNAVAILABLE
            with admission_channel(addr, ALICE) as channel:  # plaintext
                assert code_of(lambda: pb_grpc.AdmissionStub(channel).ListJobs(pb.ListJobsRequest(), timeout=5)) \
                    == grpc.StatusCode.UNAVAILABLE
            env = {"INA_TLS_CA": pems["ca_cert"], "INA_TLS_CERT": pems["client_cert"], "INA_TLS_KEY": pems["client_key"],
                   "INA_ADMIN_CREDENTIAL_FILE": str(h.controller.authority.path)}
            proc = _inactl(["--controller", addr, "jobs", "--json"], env=env)
            assert proc.returncode == 0 and '"name": "t"' in proc.stdout
        finally:
            server.stop(0).wait()


def test_p4runtime_over_tls_with_a_client_certificate(tmp_path):
    from controller.auth import SwitchTls
    from controller.config import ControllerConfig
    from controller.core import Controller
    from controller.switch import SwitchError
    from controller.topology import Topology
    from topologies.loopback import LocalSwitch, star_topology

    pems = make_certificates(tmp_path)
    creds = ServerTls(pems["server_cert"], pems["server_key"], pems["ca_cert"]).server_credentials()
    sw = LocalSwitch(device_id=1, server_credentials=creds)
    topo = Topology.from_dict(star_topology({"s1": sw}, 2, 16))
    try:
        tls = SwitchTls(pems["ca_cert"], pems["client_cert"], pems["client_key"])
        ctl = Controller(topo, ControllerConfig(db_path=tmp_path / "tls.db", switch_tls=tls, connect_timeout=5))
        ctl.start()
        try:
            grant = ctl.register(request("t", ["h11", "h12"]))
            assert grant.switches[0].num_slots == 4
            assert sw.entries("MyIngress.ina_job"), "the job's entries were written over TLS"
        finally:
            ctl.stop()
        for options in (ControllerConfig(db_path=tmp_path / "plain.db", connect_timeout=2),  # plaintext
                        ControllerConfig(db_path=tmp_path / "nocert.db", connect_timeout=2,
                                          switch_tls=SwitchTls(pems["ca_cert"]))):  # no client certificate
            with pytest.raises(SwitchError):
                Controller(topo, options).start()
    finally:
        sw.stop()


@pytest.mark.parametrize("argv, words", [
    (["--set", 'tls={cert = "x.pem"}'], "needs both cert and key"),
    (["--set", 'tls={client_ca = "ca.pem"}'], "needs both cert and key"),
    (["--set", 'switch_tls={cert = "c.pem", key = "k.pem"}'], "needs the switches' CA certificate"),
    (["--set", 'tls={cert = "/nonexistent.pem", key = "/nonexistent.key"}'], "/nonexistent.pem: no such file"),
])
def test_controller_tls_options_are_checked(argv, words, capsys):
    from controller import daemon

    assert daemon.main(["--switch", "name=s1,addr=127.0.0.1:1,device_id=1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ina-controller: error: ") and words in err
