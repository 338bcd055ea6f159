"""One testbed run: a topology in Mininet with P4 switches, its run directory, and a stop that leaves nothing.

    from topologies import InaNetwork, StarTopo

    with InaNetwork(StarTopo(3), target="ina-switch") as net:
        print(net.host("h1").cmd("ping -c1 10.0.1.2"))

The run directory (default ``/tmp/ina-testbed/runs/<time>-<pid>``) holds ``logs/<switch>.log``,
``config/<switch>.toml`` (each switch's whole configuration, ``P4Switch.switch_config``), ``pcaps/`` (with
``pcap=True``), ``plan.json``, ``topology.json`` and ``<switch>-runtime.json`` (p4lang tutorials' shapes, with
each switch's gRPC address and device id) for the controller.
"""
from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from mininet.net import Mininet
from mininet.util import specialClass

from topologies import state as run_state
from topologies.nodes import DEFAULT_P4INFO, P4Host, P4Switch, SwitchStartupError
from topologies.plan import NetworkPlan
from topologies.topos import InaTopo

__all__ = ["InaNetwork", "SwitchStartupError"]

log = logging.getLogger(__name__)


class InaNetwork:
    """Build, start and stop one topology with P4 switches.

    Args:
        topo: an :class:`~topologies.topos.InaTopo` (star, leaf-spine, topology.json).
        target: ``ina-switch``, ``bmv2`` or ``auto``.
        run_dir: where logs, pcaps and plan files go.
        install_routes: install every switch's ``ipv4_lpm`` routes over P4Runtime once it is up (leave
            True until a controller programs the switches).
        switch_opts: more :class:`~topologies.nodes.P4Switch` options for every switch (``log_level``,
            ``pcap``, ``program``, ``faults``, ``ready_timeout``...); ``per_switch`` overrides them by name.
    """

    def __init__(
        self,
        topo: InaTopo,
        *,
        target: str = "auto",
        run_dir: str | Path | None = None,
        install_routes: bool = True,
        switch_opts: Mapping[str, Any] | None = None,
        per_switch: Mapping[str, Mapping[str, Any]] | None = None,
        p4info: str | Path | None = None,
    ) -> None:
        if topo.plan is None:
            raise ValueError("the topology has no plan (build() did not run)")
        self.topo = topo
        self.plan: NetworkPlan = topo.plan
        self.target = target
        self.run_dir = Path(run_dir).resolve() if run_dir else run_state.RUNS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.install_routes = install_routes
        self.p4info = Path(p4info) if p4info else DEFAULT_P4INFO
        self.switch_opts = dict(switch_opts or {})
        self.per_switch = {k: dict(v) for k, v in (per_switch or {}).items()}
        self.net: Mininet | None = None
        self._started = False
        self._known_pids: set[int] = set()
        self._known_intfs: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> InaNetwork:
        """Create hosts, links and switches, start the switches, program routes, write the plan files.

        On any failure everything made so far is removed before the error propagates.
        """
        if self._started:
            return self
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        state = run_state.current_state()
        state.set_run_dir(self.run_dir)
        # Whatever nodes record from here on belongs to this network (stop() removes exactly that).
        processes, interfaces = state.snapshot()
        self._known_pids = {p.pid for p in processes}
        self._known_intfs = set(interfaces)
        for name, opts in self.per_switch.items():
            info = self.topo.nodeInfo(name)
            info.update(opts)
        defaults = {
            "target": self.target,
            "log_dir": self.run_dir / "logs",
            "config_dir": self.run_dir / "config",
            "pcap_dir": self.run_dir / "pcaps",
            "p4info": self.p4info,
            "install_routes": self.install_routes,  # by P4Switch.batchStartup, once every switch is up
            **self.switch_opts,
        }
        switch_cls = specialClass(P4Switch, defaults=defaults)
        try:
            self.net = Mininet(topo=self.topo, switch=switch_cls, host=P4Host, controller=None, build=False)
            self.net.build()
            self.net.start()
            self.write_plan()
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def stop(self) -> None:
        """Stop switches (SIGTERM, then SIGKILL), links and hosts; end whatever still runs in the hosts'
        namespaces; delete leftover switch ports. Safe to call twice and after a failed start."""
        net, self.net = self.net, None
        self._started = False
        if net is not None:
            for sw in net.switches:
                if isinstance(sw, P4Switch):
                    sw.stop_process()
            try:
                net.stop()
            except Exception as exc:  # a half-built network: fall back to the recorded state below  # noqa: BLE001
                log.warning("Mininet stop failed (%s); cleaning up from the run state", exc)
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Remove whatever this network's nodes recorded and is still there (processes left in host
        namespaces, ports of a half-built network), and drop those records."""
        from topologies import cleanup

        state = run_state.current_state()
        processes, interfaces = state.snapshot()
        mine = [p for p in processes if p.pid not in self._known_pids]
        intfs = [n for n in interfaces if n not in self._known_intfs]
        cleanup.remove(mine, intfs)
        for rec in mine:
            state.remove_process(rec.pid)
        state.remove_interfaces(intfs)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- access ------------------------------------------------------------------------------------------
    @property
    def switches(self) -> list[P4Switch]:
        assert self.net is not None, "the network is not started"
        return list(self.net.switches)

    @property
    def hosts(self) -> list[P4Host]:
        assert self.net is not None, "the network is not started"
        return list(self.net.hosts)

    def host(self, name: str) -> P4Host:
        assert self.net is not None, "the network is not started"
        return self.net.get(name)

    def switch(self, name: str) -> P4Switch:
        assert self.net is not None, "the network is not started"
        return self.net.get(name)

    def switch_runtime(self) -> dict[str, dict[str, Any]]:
        """Per switch: gRPC address, device id, log, target, PID (what the controller needs to connect)."""
        return {
            sw.name: {
                "grpc": sw.grpc_address, "device_id": sw.device_id, "log": str(sw.log_path), "target": sw.kind,
                "pid": sw.process.pid if sw.process else None, "cpu_port": sw.cpu_port,
            }
            for sw in self.switches
        }

    def write_plan(self) -> list[Path]:
        """Write plan.json, topology.json and <switch>-runtime.json into the run directory."""
        program = next((str(sw.program) for sw in self.switches if sw.program), None)
        return self.plan.write(self.run_dir, switch_extra=self.switch_runtime(), p4info=str(self.p4info), bmv2_json=program)

    def popen(self, host: str, *args: Any, **kwargs: Any) -> subprocess.Popen:
        """Start a process inside a host (ended at stop with everything else in its namespace)."""
        return self.host(host).popen(*args, **kwargs)
