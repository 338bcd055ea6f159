"""The job admission gRPC service (inaproto/admission.proto) in front of a :class:`~controller.core.Controller`.

Each RPC maps to one controller method; a :class:`~controller.core.Refusal` becomes its gRPC status
code and message. Every call is made by a :class:`~controller.auth.Caller`, the credential in its metadata:
job calls check it against the job (controller/core.py), operator calls need the admin credential.
``serve()`` starts a grpc server on 127.0.0.1 (port 0 picks a free one), with TLS if given.
"""
from __future__ import annotations

import logging
import queue
from concurrent import futures

import grpc

from controller.auth import Caller, ServerTls, caller_credential
from controller.core import Controller, Refusal
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc

__all__ = ["AdmissionService", "serve"]

log = logging.getLogger(__name__)


def _guard(context: grpc.ServicerContext, exc: Refusal):
    log.info("refused: %s: %s", exc.code.name, exc.message)
    context.abort(exc.code, exc.message)


class AdmissionService(pb_grpc.AdmissionServicer):
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    def _caller(self, context: grpc.ServicerContext) -> Caller:
        return self.ctl.caller(caller_credential(context))

    # --- agents -------------------------------------------------------------------------------------
    def RegisterJob(self, request, context):
        try:
            return self.ctl.register(request, self._caller(context))
        except Refusal as exc:
            _guard(context, exc)

    def Heartbeat(self, request, context):
        try:
            return pb.HeartbeatResponse(generation=self.ctl.heartbeat(request.job_id, request.worker_id, self._caller(context)))
        except Refusal as exc:
            _guard(context, exc)

    def ReleaseJob(self, request, context):
        try:
            self.ctl.release(request.job_id, caller=self._caller(context))
            return pb.ReleaseJobResponse()
        except Refusal as exc:
            _guard(context, exc)

    def WatchJob(self, request, context):
        try:
            sub = self.ctl.watch(request.job_id, request.worker_id, self._caller(context))
        except Refusal as exc:
            _guard(context, exc)
            return
        context.add_callback(sub.close)
        try:
            while context.is_active():
                try:
                    event = sub.get(timeout=0.5)
                except queue.Empty:
                    continue
                if event is None:
                    return
                yield event
                if event.released:
                    return
        finally:
            self.ctl.unwatch(sub)

    def SyncGeneration(self, request, context):
        remaining = context.time_remaining()
        try:
            resume = self.ctl.sync_generation(
                request.job_id, request.worker_id, request.generation, request.first_missing_chunk,
                timeout=remaining if remaining is not None else None, caller=self._caller(context),
            )
            return pb.SyncGenerationResponse(generation=request.generation, resume_chunk=resume)
        except Refusal as exc:
            _guard(context, exc)

    # --- operators ----------------------------------------------------------------------------------
    def ListJobs(self, request, context):
        try:
            return pb.ListJobsResponse(jobs=self.ctl.list_jobs(self._caller(context)))
        except Refusal as exc:
            _guard(context, exc)

    def GetJob(self, request, context):
        try:
            return self.ctl.job_info(request.job_id, self._caller(context))
        except Refusal as exc:
            _guard(context, exc)

    def GetMemory(self, request, context):
        try:
            self._caller(context).require_admin("the memory map")
            return self.ctl.memory()
        except Refusal as exc:
            _guard(context, exc)

    def GetStats(self, request, context):
        try:
            return self.ctl.stats(0 if request.all else request.job_id, self._caller(context))
        except Refusal as exc:
            _guard(context, exc)

    def GetPolicy(self, request, context):
        try:
            self._caller(context).require_admin("the policy")
            return self.ctl.policy_info()
        except Refusal as exc:
            _guard(context, exc)

    def SetPolicy(self, request, context):
        try:
            self._caller(context).require_admin("setting the policy")
            return self.ctl.set_policy(request.policy)
        except Refusal as exc:
            _guard(context, exc)


def serve(controller: Controller, address: str = "127.0.0.1:50060", max_workers: int = 128,
          tls: ServerTls | None = None) -> tuple[grpc.Server, int]:
    """Start the admission service (over TLS if ``tls``); returns the server and its bound port.

    Every WatchJob stream and every waiting SyncGeneration holds a thread: `max_workers` bounds how many
    agents one controller serves at once (128: e.g. 32 jobs of 2 workers with a watch and a sync each).
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="admission"))
    pb_grpc.add_AdmissionServicer_to_server(AdmissionService(controller), server)
    try:
        if tls is not None:
            port = server.add_secure_port(address, tls.server_credentials())
        else:
            port = server.add_insecure_port(address)
    except OSError as exc:
        raise RuntimeError(f"cannot read the TLS files: {exc}") from None
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    server.start()
    return server, port
