"""The controller's P4Runtime client, entities and topology against ina-switch's in-process P4Runtime server."""
from __future__ import annotations

import ipaddress
import json

import grpc
import pytest

from controller.p4entity import MulticastGroup, Schema, SchemaError, TableEntry
from controller.switch import DELETE, INSERT, MODIFY, Switch, SwitchError, SwitchOptions, SwitchState, plan_writes
from controller.topology import Topology, TopologyError, parse_switch_spec, read_runtime_json, write_runtime_json
from inaproto import wire
from topologies.loopback import LocalSwitch

SCHEMA = Schema.from_file("p4src/ina.p4info.txt")


@pytest.fixture
def local():
    sw = LocalSwitch(device_id=1)
    yield sw
    sw.stop()


@pytest.fixture
def primary(local):
    with Switch(SwitchOptions("s1", local.address, 1, election_id=(0, 10), connect_timeout=5), SCHEMA) as sw:
        assert sw.connect() is True
        sw.ensure_pipeline(SCHEMA.p4info)
        yield sw


def job_entry(job_id=3, base=0, size=8, gen=1) -> TableEntry:
    return SCHEMA.entry("MyIngress.ina_job", (job_id,), "MyIngress.set_job", (base, size, 0b11, 2, job_id + 1, gen, 0))


# --- entities ------------------------------------------------------------------------------------------
def test_entry_round_trips_through_protobuf_with_canonical_bytes():
    e = job_entry(job_id=0, gen=0)
    msg = SCHEMA.to_proto(e)
    assert msg.match[0].exact.value == b"\x00"  # canonical: one byte for 0
    assert msg.action.action.params[1].value == b"\x08"
    assert SCHEMA.from_proto(msg) == e


def test_entry_by_names_and_lpm():
    e = SCHEMA.entry("ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000100, 24)}, "ipv4_forward", {"dstAddr": 0x080000000111, "port": 1})
    assert e.table == "MyIngress.ipv4_lpm" and e.action == "MyIngress.ipv4_forward" and e.params == (0x080000000111, 1)
    assert SCHEMA.from_proto(SCHEMA.to_proto(e)) == e


@pytest.mark.parametrize(
    "table, match, action, params, words",
    [
        ("MyIngress.nope", (1,), "NoAction", (), "no table"),
        ("MyIngress.ina_job", (1,), "MyIngress.ipv4_forward", (1, 1), "not one of its actions"),
        ("MyIngress.ina_job", (1 << 16,), "NoAction", (), "does not fit in 16 bits"),
        ("MyIngress.ina_job", (1,), "MyIngress.set_job", (0, 8), "expected 7 parameters"),
        ("MyIngress.ipv4_lpm", ((0x0A000101, 24),), "MyIngress.drop", (), "beyond /24"),
    ],
)
def test_bad_entries_are_refused_before_any_write(table, match, action, params, words):
    with pytest.raises(SchemaError, match=words):
        SCHEMA.entry(table, match, action, params)


def test_runtime_json_read_and_write_in_the_tutorials_shape(tmp_path):
    doc = {
        "target": "bmv2",
        "p4info": "build/basic.p4.p4info.txt",
        "bmv2_json": "build/basic.json",
        "table_entries": [
            {"table": "MyIngress.ipv4_lpm", "default_action": True, "action_name": "MyIngress.drop", "action_params": {}},
            {"table": "MyIngress.ipv4_lpm", "match": {"hdr.ipv4.dstAddr": ["10.0.1.1", 32]},
             "action_name": "MyIngress.ipv4_forward", "action_params": {"dstAddr": "08:00:00:00:01:11", "port": 1}},
        ],
        "multicast_group_entries": [{"multicast_group_id": 300, "replicas": [{"egress_port": 2, "instance": 1}, {"egress_port": 1, "instance": 1}]}],
    }
    path = tmp_path / "s1-runtime.json"
    path.write_text(json.dumps(doc))
    entries, groups = read_runtime_json(path, SCHEMA)
    assert entries[0].is_default and entries[0].action == "MyIngress.drop"
    assert entries[1].match == ((int(ipaddress.IPv4Address("10.0.1.1")), 32),) and entries[1].params == (0x080000000111, 1)
    assert groups == [MulticastGroup(300, ((1, 1), (2, 1)))]
    out = tmp_path / "out.json"
    write_runtime_json(out, entries, groups, SCHEMA, p4info="build/basic.p4.p4info.txt", bmv2_json="build/basic.json")
    written = json.loads(out.read_text())
    assert written["table_entries"] == doc["table_entries"]
    assert written["target"] == "bmv2" and written["bmv2_json"] == "build/basic.json"
    assert read_runtime_json(out, SCHEMA) == (entries, groups)


# --- writes, reads, arbitration --------------------------------------------------------------------------
def test_writes_land_in_the_pipeline_and_read_back(local, primary):
    e = job_entry()
    g = MulticastGroup(4, ((2, 1), (1, 0)))
    primary.insert(g)
    primary.insert(e)
    assert local.entries("MyIngress.ina_job") == {(3,): ("MyIngress.set_job", (0, 8, 3, 2, 4, 1, 0))}
    assert {g: sorted(r) for g, r in local.pipeline.multicast_groups.items()} == {4: [(1, 0), (2, 1)]}
    assert primary.read_table("MyIngress.ina_job") == [e]
    assert primary.read_groups() == [g]
    primary.modify(job_entry(gen=2))
    assert primary.read_table("MyIngress.ina_job") == [job_entry(gen=2)]
    primary.delete(e)
    assert primary.read_table("MyIngress.ina_job") == []


def test_write_error_carries_status_and_per_update_details(primary):
    primary.insert(job_entry())
    with pytest.raises(SwitchError) as err:
        primary.insert(job_entry())
    assert err.value.code == grpc.StatusCode.UNKNOWN
    assert err.value.errors and err.value.errors[0][:2] == (0, "ALREADY_EXISTS")
    assert "s1" in str(err.value) and "ALREADY_EXISTS" in str(err.value)


def test_counters_read_whole_arrays_and_single_indices(local, primary):
    local.pipeline.counters["MyIngress.ina_aggregated"][5] = 42
    assert primary.read_counter("MyIngress.ina_aggregated")[5] == 42
    assert primary.read_counter("MyIngress.ina_aggregated", 5) == {5: 42}
    assert len(primary.read_counter("MyIngress.ina_job_drops")) == 256 * wire.NUM_DROP_REASONS


def test_pipeline_is_pushed_once(local, primary):
    primary.insert(job_entry())
    assert primary.ensure_pipeline(SCHEMA.p4info) is False  # already running: entries survive
    assert local.entries("MyIngress.ina_job")
    assert primary.ensure_pipeline(SCHEMA.p4info, force=True) is True  # a push resets the switch
    assert not local.entries("MyIngress.ina_job")


def test_lower_election_id_is_backup_and_cannot_write(local, primary):
    primary.insert(job_entry())
    with Switch(SwitchOptions("s1", local.address, 1, election_id=(0, 5), connect_timeout=5), SCHEMA) as backup:
        assert backup.connect() is False
        assert backup.primary_election_id == (0, 10)
        with pytest.raises(SwitchError) as err:
            backup.modify(job_entry(gen=9))
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(SwitchError) as err:
            backup.push_pipeline(SCHEMA.p4info)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert backup.read_table("MyIngress.ina_job") == [job_entry()]  # reads are allowed
    assert local.entries("MyIngress.ina_job") == {(3,): ("MyIngress.set_job", (0, 8, 3, 2, 4, 1, 0))}


def test_higher_election_id_takes_over(local, primary):
    with Switch(SwitchOptions("s1", local.address, 1, election_id=(1, 0), connect_timeout=5), SCHEMA) as other:
        assert other.connect() is True
        other.insert(job_entry())
        with pytest.raises(SwitchError) as err:
            primary.delete(job_entry())
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert not primary.is_primary


def test_unreachable_switch_fails_within_the_timeout():
    with Switch(SwitchOptions("s9", "127.0.0.1:1", 1, connect_timeout=0.5), SCHEMA) as sw, pytest.raises(SwitchError) as err:
        sw.connect()
    assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_wrong_device_id_is_refused(local):
    with Switch(SwitchOptions("s1", local.address, 7, connect_timeout=0.5), SCHEMA) as sw, pytest.raises(SwitchError) as err:
        sw.connect()
    assert err.value.code == grpc.StatusCode.NOT_FOUND


# --- reconcile -------------------------------------------------------------------------------------------
ORDER = ["MyEgress.ina_worker", "MyIngress.ina_job"]


def test_plan_writes_orders_dependencies():
    worker = SCHEMA.entry("MyEgress.ina_worker", (3, 0), "MyEgress.set_worker_addr", (1, 2, 3))
    target = SwitchState.of([job_entry(), worker], [MulticastGroup(4, ((1, 0),))])
    phases = plan_writes(SwitchState(), target, ORDER)
    assert [[(k, type(e).__name__, getattr(e, "table", None)) for k, e in p] for p in phases] == [
        [(INSERT, "MulticastGroup", None)],
        [(INSERT, "TableEntry", "MyEgress.ina_worker")],
        [(INSERT, "TableEntry", "MyIngress.ina_job")],
    ]
    back = plan_writes(target, SwitchState(), ORDER)  # deletes: job first, group last
    assert [[(k, getattr(e, "table", "group")) for k, e in p] for p in back] == [
        [(DELETE, "MyIngress.ina_job")], [(DELETE, "MyEgress.ina_worker")], [(DELETE, "group")],
    ]
    assert plan_writes(target, target, ORDER) == []
    changed = SwitchState.of([job_entry(gen=2), worker], [MulticastGroup(4, ((1, 0),))])
    assert plan_writes(target, changed, ORDER) == [[(MODIFY, job_entry(gen=2))]]


def test_reconcile_repairs_missing_altered_and_extra_entries(local, primary):
    worker = SCHEMA.entry("MyEgress.ina_worker", (3, 0), "MyEgress.set_worker_addr", (1, 2, 3))
    target = SwitchState.of([job_entry(), worker], [MulticastGroup(4, ((1, 0),))])
    assert primary.reconcile(target, ORDER).inserted
    local.pipeline.modify_entry("MyIngress.ina_job", (3,), "MyIngress.set_job", (0, 99, 3, 2, 4, 1, 0))
    local.pipeline.insert_entry("MyIngress.ina_job", (9,), "MyIngress.set_job", (0, 1, 1, 1, 10, 1, 0))
    local.pipeline.delete_entry("MyEgress.ina_worker", (3, 0))
    local.pipeline.set_multicast_group(4, [(7, 7)])
    report = primary.reconcile(target, ORDER)
    assert (len(report.inserted), len(report.modified), len(report.deleted)) == (1, 2, 1)
    assert local.entries("MyIngress.ina_job") == {(3,): ("MyIngress.set_job", (0, 8, 3, 2, 4, 1, 0))}
    assert local.entries("MyEgress.ina_worker") == {(3, 0): ("MyEgress.set_worker_addr", (1, 2, 3))}
    assert local.pipeline.multicast_groups == {4: ((1, 0),)}
    assert not primary.reconcile(target, ORDER).changed


# --- topology --------------------------------------------------------------------------------------------
TOPO = {
    "hosts": {
        "h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11", "commands": ["route add default gw 10.0.1.10 dev eth0"]},
        "h2": {"ip": "10.0.2.2/24", "mac": "08:00:00:00:02:22"},
        "h3": {"ip": "10.0.3.3/24", "mac": "08:00:00:00:03:33"},
    },
    "switches": {"s1": {}, "s2": {"grpc": "127.0.0.1:9559", "device_id": 4, "rack": "rackB", "pool": 32}, "s3": {"ina": False}},
    "links": [["h1", "s1-p1"], ["h2", "s2-p1"], ["h3", "s3-p1"], ["s1-p2", "s2-p2", "0", 0.5], ["s2-p3", "s3-p2"]],
}


def test_topology_json_locates_hosts_and_applies_defaults():
    t = Topology.from_dict(TOPO)
    assert t.locate("h2") == ("s2", 1)
    assert t.locate("s3-p7") == ("s3", 7)
    s1, s2, s3 = t.switches["s1"], t.switches["s2"], t.switches["s3"]
    assert (s1.address, s1.device_id, s1.rack, s1.pool_size, s1.ina) == ("127.0.0.1:50051", 0, "s1", 1024, True)
    assert (s2.address, s2.device_id, s2.rack, s2.pool_size) == ("127.0.0.1:9559", 4, "rackB", 32)
    assert s3.ina is False
    with pytest.raises(TopologyError, match="unknown host 'h9'"):
        t.locate("h9")


def test_forwarding_routes_every_host_along_shortest_paths():
    t = Topology.from_dict(TOPO)
    routes = {ipaddress.IPv4Address(e.match[0][0]).exploded: e.params for e in t.forwarding("s1", SCHEMA)[0]}
    assert routes == {"10.0.1.1": (0x080000000111, 1), "10.0.2.2": (0x080000000222, 2), "10.0.3.3": (0x080000000333, 2)}
    routes = {ipaddress.IPv4Address(e.match[0][0]).exploded: e.params[1] for e in t.forwarding("s2", SCHEMA)[0]}
    assert routes == {"10.0.1.1": 2, "10.0.2.2": 1, "10.0.3.3": 3}


def test_runtime_json_of_a_switch_wins_over_derived_routes(tmp_path):
    (tmp_path / "s1-runtime.json").write_text(json.dumps({"table_entries": [], "multicast_group_entries": []}))
    doc = json.loads(json.dumps(TOPO))
    doc["switches"]["s1"]["runtime_json"] = "s1-runtime.json"
    (tmp_path / "topology.json").write_text(json.dumps(doc))
    t = Topology.load(tmp_path / "topology.json")
    assert t.forwarding("s1", SCHEMA) == ([], [])


@pytest.mark.parametrize(
    "doc, words",
    [
        ({"hosts": {}}, "'switches'"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11"}}, "links": []}, "no link"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "nope", "mac": "08:00:00:00:01:11"}}, "links": [["h1", "s1-p1"]]}, "not an IPv4"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1", "mac": "08:00"}}, "links": [["h1", "s1-p1"]]}, "not a MAC"),
        ({"switches": {"s1": {"pool": 4096}}}, "pool 4096"),
        ({"switches": {"s1": {}}, "links": [["x", "y"]]}, "bad link|expected host-switch"),
    ],
)
def test_bad_topologies_say_what_is_wrong(doc, words):
    with pytest.raises(TopologyError, match=words):
        Topology.from_dict(doc)


def test_switch_specs_without_topology():
    info = parse_switch_spec("name=s1,addr=127.0.0.1:9559,device_id=3,ip=10.9.0.254,pool=128,rack=r7")
    assert (info.name, info.address, info.device_id, info.switch_ip, info.pool_size, info.rack) == (
        "s1", "127.0.0.1:9559", 3, "10.9.0.254", 128, "r7")
    t = Topology.from_specs(["name=s1,addr=127.0.0.1:9559"])
    assert t.locate("s1-p4") == ("s1", 4) and t.forwarding("s1", SCHEMA) == ([], [])
    for bad in ("addr=1.2.3.4:1", "name=s1,addr=x,colour=red", "name=s1,addr=x,pool=lots"):
        with pytest.raises(TopologyError):
            parse_switch_spec(bad)
