"""The agent's controller calls ride out an unavailable controller: capped exponential backoff with jitter,
for a bounded time; other refusals are not retried; RegisterJob keeps one idempotency key across retries."""
from __future__ import annotations

import grpc
import pytest

from host_agent.control import AdmissionClient, Backoff
from host_agent.errors import AdmissionError
from host_agent.grant import JobSpec, Worker


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name.lower()


def flaky(failures: int, code=grpc.StatusCode.UNAVAILABLE, result="ok"):
    calls = []

    def call(*args, **kwargs):
        calls.append(args)
        if len(calls) <= failures:
            raise Refused(code)
        return result

    return call, calls


def test_backoff_is_capped_exponential_with_jitter():
    b = Backoff(first=0.1, cap=1.0)
    for attempt, top in ((0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (40, 1.0)):
        for _ in range(50):
            assert top / 2 <= b.delay(attempt) <= top


def test_unavailable_is_retried_until_it_answers():
    client = AdmissionClient("127.0.0.1:1", retry_for=30.0, backoff=Backoff(first=0.001, cap=0.002))
    call, calls = flaky(5)
    assert client._retrying("X", call) == "ok" and len(calls) == 6
    client.close()


def test_retries_stop_after_the_bound_and_other_codes_are_not_retried():
    client = AdmissionClient("127.0.0.1:1", retry_for=0.05, backoff=Backoff(first=0.001, cap=0.01))
    call, calls = flaky(10**9)
    with pytest.raises(AdmissionError) as info:
        client._retrying("X", call)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and len(calls) > 1
    call, calls = flaky(1, grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(AdmissionError) as info:
        client._retrying("X", call)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED and len(calls) == 1
    client.close()


def test_register_sends_one_idempotency_key_on_every_retry(monkeypatch):
    client = AdmissionClient("127.0.0.1:1", retry_for=30.0, backoff=Backoff(first=0.001, cap=0.002))
    requests = []

    class Stub:
        def RegisterJob(self, req, timeout):
            requests.append(req.idempotency_key)
            if len(requests) < 3:
                raise Refused(grpc.StatusCode.UNAVAILABLE)
            from inaproto import admission_pb2 as pb
            return pb.JobGrant(job_id=4, generation=1, backend="ring", scale=65536.0, ina_port=9000, lanes=32)

    client.stub = Stub()
    grant = client.register(JobSpec("j", (Worker(0, "10.0.0.1", 5000),), secret="s"))
    assert grant.job_id == 4 and len(requests) == 3 and len(set(requests)) == 1 and requests[0]
    client.close()


def test_the_secret_comes_from_the_argument_else_the_environment(monkeypatch):
    monkeypatch.setenv("INA_JOB_SECRET", "from-env")
    seen = []
    from host_agent import control

    monkeypatch.setattr(control, "admission_channel", lambda address, credential, tls: seen.append(credential) or grpc.insecure_channel(address))
    AdmissionClient("127.0.0.1:1").close()
    AdmissionClient("127.0.0.1:1", credential="given").close()
    monkeypatch.delenv("INA_JOB_SECRET")
    AdmissionClient("127.0.0.1:1").close()
    assert seen == ["from-env", "given", None]
