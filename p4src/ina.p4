/* -*- P4_16 -*- */
/*
 * In-network aggregation (INA) for v1model / BMv2 simple_switch_grpc.
 *
 * Workers send gradient chunks as UDP packets to INA_UDP_PORT. Each packet names a job, a slot within the
 * job's range of the aggregator pool, a shadow copy (SwitchML's two-version scheme) and the sender's worker id.
 * The switch sums the LANES int32 values of every worker into the slot; the last contribution turns the packet
 * into a result that is multicast to all the job's workers. A retransmission for a completed slot gets the
 * result back to its sender alone. Slot state is reset by the data plane when a slot changes owner (job or
 * generation), so the control plane never writes registers (BMv2 cannot over P4Runtime anyway). A job's member
 * (a worker) is accepted only from the switch port, source MAC, IPv4 address and UDP port the controller bound
 * to it (table ina_binding; a chain's switch member by its inter-switch link and UDP port, see bind_link);
 * anything else is dropped as DROP_SPOOFED.
 *
 * Everything that is not INA is plain IPv4 LPM forwarding, as in p4lang/tutorials' basic.p4.
 *
 * p4src/ina_model.py is an executable model of this program: same names, same order of steps.
 * Wire format: docs/protocol.md and inaproto/wire.py (a test checks those against the headers below).
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> TYPE_IPV4    = 0x0800;
const bit<8>  PROTO_UDP    = 17;
const bit<16> INA_UDP_PORT = 47000;
const bit<9>  CPU_PORT     = 255;

#define LANES            32
#define NUM_SLOTS        1024
#define NUM_CELLS        2048   /* NUM_SLOTS * 2 shadow copies; cell = slot * 2 + shadow */
#define NUM_LANE_CELLS   65536  /* NUM_CELLS * LANES; lane cell = cell * LANES + lane */
#define MAX_JOBS         256
#define NUM_DROP_REASONS 16
#define NUM_JOB_DROPS    4096   /* MAX_JOBS * NUM_DROP_REASONS */
#define NUM_CHAINS       4096   /* ina_chain entries: (job, partition of its slots) */
#define NUM_BINDINGS     8192   /* (job, member) bindings: MAX_JOBS * 32 workers */

const bit<16> INA_IPV4_LEN = 170;  /* 20 IPv4 + 8 UDP + 14 ina_t + 128 ina_data_t */
const bit<16> INA_UDP_LEN  = 150;
const bit<16> INA_QUERY_IPV4_LEN = 42;  /* 20 IPv4 + 8 UDP + 14 ina_t: a query or status has no ina_data_t */
const bit<16> INA_QUERY_UDP_LEN  = 22;

const bit<8> INA_GRADIENT  = 1;
const bit<8> INA_RESULT    = 2;
const bit<8> INA_BROADCAST = 3;
const bit<8> INA_QUERY     = 4;  /* worker -> switch, header only: is my contribution to chunk seq in the copy? */
const bit<8> INA_STATUS    = 5;  /* switch -> that worker, header only: INA_FLAG_HELD if it is (the copy waits) */

const bit<8> INA_FLAG_RETRANSMIT = 0x01;
const bit<8> INA_FLAG_OVERFLOW   = 0x02;
const bit<8> INA_FLAG_HELD       = 0x04;  /* in a status: the sender's contribution is in the incomplete copy */
/* Loss signals (docs/protocol.md, "Loss signals"), for jobs not on chains: */
const bit<8> INA_FLAG_TX_COUNTED = 0x08;  /* in a gradient: reserved = the sender's transmission counter mod 128 */
const bit<8> INA_FLAG_GAP        = 0x10;  /* in a status (gap report): slot = frames lost before reserved's;
                                            * in a result to the revealing frame's sender: slot = lost << 7 | its
                                            * counter */
const bit<8> INA_FLAG_PREV_DONE  = 0x20;  /* in a multicast result: reserved = seq[6:0] of the previous one */
/* A counted frame (reserved - expected) mod 128 = 1 .. INA_TX_LATE_HALF - 1 ahead of the counter expected next
 * reveals a gap; INA_TX_LATE_HALF or more ahead is behind it: a late frame (reordered or duplicated), no gap. */
const bit<7> INA_TX_LATE_HALF = 64;

/* Index of the ina_drops / ina_job_drops counters. */
const bit<8> DROP_MALFORMED         = 1;
const bit<8> DROP_UNKNOWN_JOB       = 2;
const bit<8> DROP_SLOT_OUT_OF_RANGE = 3;
const bit<8> DROP_FOREIGN_WORKER    = 4;
const bit<8> DROP_STALE_GENERATION  = 5;
const bit<8> DROP_BAD_MSG_TYPE      = 6;
const bit<8> DROP_NO_ROUTE          = 7;
const bit<8> DROP_SPOOFED           = 8;  /* not from the port and addresses bound to (job, member): ina_binding */
/* Chains: a result from a chain that is addressed to another member. */
const bit<8> DROP_NOT_RECIPIENT     = 9;

typedef bit<9>  egressSpec_t;
typedef bit<48> macAddr_t;
typedef bit<32> ip4Addr_t;

/*************************************************************************
*********************** H E A D E R S  ***********************************
*************************************************************************/

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> _pad;
}

@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<7> _pad;
}

header ethernet_t {
    macAddr_t dstAddr;
    macAddr_t srcAddr;
    bit<16>   etherType;
}

header ipv4_t {
    bit<4>    version;
    bit<4>    ihl;
    bit<8>    diffserv;
    bit<16>   totalLen;
    bit<16>   identification;
    bit<3>    flags;
    bit<13>   fragOffset;
    bit<8>    ttl;
    bit<8>    protocol;
    bit<16>   hdrChecksum;
    ip4Addr_t srcAddr;
    ip4Addr_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

header ina_t {
    bit<8>  msg_type;    /* INA_GRADIENT, INA_RESULT, INA_BROADCAST */
    bit<8>  flags;       /* INA_FLAG_*: 0x01 retransmission (from workers), 0x02 overflow (in results) ... */
    bit<16> job_id;
    bit<16> generation;  /* must equal the job table's generation */
    bit<16> slot;        /* index within the job's slot range */
    bit<32> seq;         /* chunk sequence number, carried unchanged into the result */
    bit<8>  worker_id;   /* bit position in the job's worker mask; in a result: the recipient */
    bit<7>  reserved;    /* loss signals: a transmission counter (TX_COUNTED, GAP), a seq's low bits (PREV_DONE) */
    bit<1>  shadow;      /* which of the slot's two copies */
}

header ina_data_t {
    bit<32> lane00; bit<32> lane01; bit<32> lane02; bit<32> lane03;
    bit<32> lane04; bit<32> lane05; bit<32> lane06; bit<32> lane07;
    bit<32> lane08; bit<32> lane09; bit<32> lane10; bit<32> lane11;
    bit<32> lane12; bit<32> lane13; bit<32> lane14; bit<32> lane15;
    bit<32> lane16; bit<32> lane17; bit<32> lane18; bit<32> lane19;
    bit<32> lane20; bit<32> lane21; bit<32> lane22; bit<32> lane23;
    bit<32> lane24; bit<32> lane25; bit<32> lane26; bit<32> lane27;
    bit<32> lane28; bit<32> lane29; bit<32> lane30; bit<32> lane31;
}

struct headers_t {
    packet_in_t  packet_in;
    packet_out_t packet_out;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    ina_t        ina;
    ina_data_t   ina_data;
}

struct metadata_t {
    /* from the ina_job table */
    bit<16> base_slot;
    bit<16> num_slots;
    bit<32> worker_mask;
    bit<8>  num_workers;
    bit<16> mcast_grp;
    bit<16> generation;
    bit<32> owner_epoch;   /* how often the controller's 16-bit generation counter wrapped (set_job) */
    /* ingress binding (ina_binding): where (job, member) may send from */
    bit<8>  member_id;     /* ina_binding's key, hdr.ina.worker_id: a worker's id, a chain switch's member id */
    bit<1>  bound_by_link; /* bind_link: only the ingress port and UDP port are checked */
    bit<9>  bound_next_port;
    bit<16> bound_next_udp_port;
    bit<1>  bound;         /* 1: the packet comes from the member's bound port, MAC, IPv4 and UDP port */
    bit<9>  bound_port;
    bit<48> bound_mac;
    bit<32> bound_ip;
    bit<16> bound_udp_port;
    /* aggregation */
    bit<8>  drop_reason;
    bit<32> slot_abs;      /* absolute slot in the pool */
    bit<32> cell;          /* slot_abs * 2 + shadow */
    bit<32> other_cell;    /* slot_abs * 2 + (1 - shadow) */
    bit<32> lane_base;     /* cell * LANES */
    bit<64> owner;         /* owner_epoch ++ job_id ++ generation: never repeats for one job */
    bit<64> prev_owner;
    bit<32> wbit;
    bit<32> bitmap;
    bit<32> other_bitmap;
    bit<32> stored_seq;    /* seq of the chunk this copy holds */
    bit<32> age;           /* hdr.ina.seq - stored_seq: 0 same chunk, bit 31 clear newer, set older */
    bit<8>  count;
    bit<8>  overflow;
    bit<32> lane_ovf;      /* bit 31 set if any lane overflowed */
    bit<32> cur;
    bit<32> sum;
    bit<1>  accept;        /* add this packet to the copy */
    bit<1>  first;
    bit<1>  complete;
    /* egress */
    bit<1>  ina_mcast;     /* replicate with per-worker address rewrite */
    bit<1>  ina_out;       /* a packet the switch turned into a result or a broadcast */
    /* chains (Rina, trees): from the ina_chain table */
    bit<1>  chain;         /* this (job, slot) is a copy of a chain */
    bit<8>  own_member_id; /* this switch's id in the job's worker-id space */
    bit<1>  chain_end;     /* the copy's completion is the final sum */
    bit<16> next_grp;      /* group with one replica towards the next hop (rid = own_member_id) */
    bit<8>  final;         /* ina_final of the copy: it holds the final sum */
    bit<1>  transit;       /* a job this switch only carries (ina_transit) */
    /* loss signals (docs/protocol.md, "Loss signals") */
    bit<1>  tx_counted;    /* a gradient with INA_FLAG_TX_COUNTED of a job not on a chain */
    bit<1>  tx_gap;        /* its transmission counter is not the one expected next */
    bit<32> tx_idx;        /* job_id * 32 + worker_id */
    bit<32> tx_next;       /* ina_tx_next[tx_idx] as the frame found it */
    bit<7>  tx_ahead;      /* (hdr.ina.reserved - tx_next[6:0]) mod 128: 0 in sequence, 1..63 a gap, 64.. late */
    bit<16> gap_slot;      /* a gap a delivered frame revealed: tx_ahead << 7 | reserved, for its sender's copy */
    bit<8>  gap_worker;    /* that frame's sender: the recipient whose copy carries INA_FLAG_GAP */
    bit<32> last_done;     /* ina_last_done[job_id] as the completion found it */
}

/*************************************************************************
*********************** P A R S E R  *************************************
*************************************************************************/

parser MyParser(packet_in packet,
                out headers_t hdr,
                inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {

    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            TYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4w5, PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            INA_UDP_PORT: parse_ina;
            default: accept;
        }
    }

    state parse_ina {
        packet.extract(hdr.ina);
        transition select(hdr.ina.msg_type) {
            INA_QUERY: accept;  /* a query is header only */
            default: parse_ina_data;
        }
    }

    state parse_ina_data {
        packet.extract(hdr.ina_data);
        transition accept;
    }
}

/*************************************************************************
************   C H E C K S U M    V E R I F I C A T I O N   *************
*************************************************************************/

control MyVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        verify_checksum(
            hdr.ipv4.isValid(),
            { hdr.ipv4.version,
              hdr.ipv4.ihl,
              hdr.ipv4.diffserv,
              hdr.ipv4.totalLen,
              hdr.ipv4.identification,
              hdr.ipv4.flags,
              hdr.ipv4.fragOffset,
              hdr.ipv4.ttl,
              hdr.ipv4.protocol,
              hdr.ipv4.srcAddr,
              hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum,
            HashAlgorithm.csum16);
    }
}

/*************************************************************************
**************  I N G R E S S   P R O C E S S I N G   *******************
*************************************************************************/

/* One lane of a new contribution: add into the slot copy (or start it), remember overflow, write back. */
#define AGGREGATE_LANE(I, F)                                                        \
    ina_lanes.read(meta.cur, meta.lane_base + I);                                   \
    if (meta.first == 1) { meta.cur = 0; }                                          \
    meta.sum = meta.cur + hdr.ina_data.F;                                           \
    meta.lane_ovf = meta.lane_ovf | ((meta.cur ^ meta.sum) & (hdr.ina_data.F ^ meta.sum)); \
    ina_lanes.write(meta.lane_base + I, meta.sum);                                  \
    hdr.ina_data.F = meta.sum;

/* Chains: one lane of a final sum that reached this switch, kept in the copy. */
#define STORE_LANE(I, F) \
    ina_lanes.write(meta.lane_base + I, hdr.ina_data.F);

/* One lane of a completed slot copy, read back into the packet for a retransmitted request. */
#define READ_LANE(I, F) \
    ina_lanes.read(hdr.ina_data.F, meta.lane_base + I);

control MyIngress(inout headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {

    counter(MAX_JOBS, CounterType.packets) ina_aggregated;    /* contributions added to a slot */
    counter(MAX_JOBS, CounterType.packets) ina_duplicates;    /* contributions seen before */
    counter(NUM_DROP_REASONS, CounterType.packets) ina_drops; /* every drop, by reason */
    counter(NUM_JOB_DROPS, CounterType.packets) ina_job_drops; /* job_id * NUM_DROP_REASONS + reason */

    register<bit<64>>(NUM_SLOTS) ina_owner;        /* owner_epoch ++ job_id ++ generation of the slot's last user */
    register<bit<32>>(NUM_CELLS) ina_bitmap;       /* workers that contributed to this copy */
    register<bit<8>>(NUM_CELLS) ina_count;         /* contributions so far; 0 = empty or complete */
    register<bit<8>>(NUM_CELLS) ina_overflow;      /* 1 if any lane overflowed in this copy */
    register<bit<32>>(NUM_CELLS) ina_seq;          /* seq of the chunk this copy holds */
    register<bit<32>>(NUM_LANE_CELLS) ina_lanes;   /* the sums */

    /* ---- Chains (Rina, trees): a switch's completed partial goes onward as one contribution ---- */
    counter(MAX_JOBS, CounterType.packets) ina_partials;  /* partial sums sent onward (resends included) */
    register<bit<8>>(NUM_CELLS) ina_final;               /* chain copies: 1 once the copy holds the final sum */

    action set_chain(bit<8> member_id, bit<32> upstream_mask, bit<8> num_upstream, bit<1> chain_end,
                     bit<16> next_grp, bit<16> final_grp) {
        meta.chain = 1;
        meta.own_member_id = member_id;
        meta.worker_mask = meta.worker_mask | upstream_mask;
        meta.num_workers = meta.num_workers + num_upstream;
        meta.chain_end = chain_end;
        meta.next_grp = next_grp;
        meta.mcast_grp = final_grp;
    }

    /* (job, partition of its slots) -> this switch's place in the partition's chain. */
    table ina_chain {
        key = {
            hdr.ina.job_id: exact;
            hdr.ina.slot: lpm;
        }
        actions = {
            set_chain;
            @defaultonly NoAction;
        }
        size = NUM_CHAINS;
        const default_action = NoAction();
    }

    action transit() {
        meta.transit = 1;
    }

    /* Jobs whose INA packets this switch only carries between two members of a chain. */
    table ina_transit {
        key = {
            hdr.ina.job_id: exact;
        }
        actions = {
            transit;
            @defaultonly NoAction;
        }
        size = MAX_JOBS;
        const default_action = NoAction();
    }

    /* The copy's sum (in the packet) to the next hop, as one contribution under this switch's member id. */
    action send_onward() {
        hdr.ina.msg_type = INA_GRADIENT;
        hdr.ina.worker_id = meta.own_member_id;
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.udp.srcPort = INA_UDP_PORT;
        standard_metadata.mcast_grp = meta.next_grp;
        meta.ina_mcast = 1;
        meta.ina_out = 1;
        ina_partials.count((bit<32>)hdr.ina.job_id);
    }
    /* ---- end of chains' declarations ---- */

    /* ---- Loss signals (docs/protocol.md, "Loss signals"): jobs not on chains, counted gradients only ---- */
    /* Both hold generation << 8 | 0x80 | a 7-bit value, so that a value of an earlier generation of the job, or of an
     * earlier job with the same id (the controller never reuses a generation), reads as none. */
    register<bit<32>>(NUM_BINDINGS) ina_tx_next;  /* job_id * 32 + worker_id: the counter expected next */
    register<bit<32>>(MAX_JOBS) ina_last_done;    /* job_id: seq[6:0] of its latest counted completion */

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action ipv4_forward(macAddr_t dstAddr, egressSpec_t port) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = dstAddr;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    action send_to_cpu() {
        standard_metadata.egress_spec = CPU_PORT;
    }

    table ipv4_lpm {
        key = {
            hdr.ipv4.dstAddr: lpm;
        }
        actions = {
            ipv4_forward;
            send_to_cpu;
            drop;
            NoAction;
        }
        size = 1024;
        default_action = drop();
    }

    action set_job(bit<16> base_slot, bit<16> num_slots, bit<32> worker_mask,
                   bit<8> num_workers, bit<16> mcast_grp, bit<16> generation, bit<32> owner_epoch) {
        meta.base_slot = base_slot;
        meta.num_slots = num_slots;
        meta.worker_mask = worker_mask;
        meta.num_workers = num_workers;
        meta.mcast_grp = mcast_grp;
        meta.generation = generation;
        meta.owner_epoch = owner_epoch;
    }

    table ina_job {
        key = {
            hdr.ina.job_id: exact;
        }
        actions = {
            set_job;
            @defaultonly NoAction;
        }
        size = MAX_JOBS;
        const default_action = NoAction();
    }

    /* ---- Ingress binding (docs/security.md, "Data plane"): a member of a job - a worker, or later a switch
     * contributing for its subtree - may send only from the switch port, source MAC, IPv4 address and UDP
     * port the controller bound to (job, member) when it admitted the job. */
    action bind_member(egressSpec_t port, macAddr_t mac, ip4Addr_t ip, bit<16> udp_port) {
        meta.bound_port = port;
        meta.bound_mac = mac;
        meta.bound_ip = ip;
        meta.bound_udp_port = udp_port;
        meta.bound_by_link = 0;
    }

    /* A chain's switch member (docs/security.md, "Data plane: ingress binding"): its partials, and the final
     * sums passed on to a switch under that switch's own member id, carry as source the address the packet
     * that triggered them was sent to (and a transit switch rewrites the MAC), so only the inter-switch link
     * they come in on and the UDP port the sending switch uses (INA_UDP_PORT for a P4 switch) are fixed; a host
     * cannot send on an inter-switch link. Under its own member id a switch also takes its next hop's answer to
     * a resent partial: next_port / next_udp_port (the same as port / udp_port for an upstream member). */
    action bind_link(egressSpec_t port, bit<16> udp_port, egressSpec_t next_port, bit<16> next_udp_port) {
        meta.bound_port = port;
        meta.bound_udp_port = udp_port;
        meta.bound_next_port = next_port;
        meta.bound_next_udp_port = next_udp_port;
        meta.bound_by_link = 1;
    }

    table ina_binding {
        key = {
            hdr.ina.job_id: exact;
            meta.member_id: exact;
        }
        actions = {
            bind_member;
            bind_link;
            @defaultonly NoAction;
        }
        size = NUM_BINDINGS;
        const default_action = NoAction();
    }
    /* ---- end of ingress binding */

    /* Results and broadcasts leave from the address the worker sent to. */
    action multicast_to_job() {
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.udp.srcPort = INA_UDP_PORT;
        standard_metadata.mcast_grp = meta.mcast_grp;
        meta.ina_mcast = 1;
        meta.ina_out = 1;
    }

    action reply_to_sender() {
        macAddr_t mac = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = mac;
        ip4Addr_t ip = hdr.ipv4.srcAddr;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = ip;
        hdr.udp.dstPort = hdr.udp.srcPort;
        hdr.udp.srcPort = INA_UDP_PORT;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
        meta.ina_out = 1;
    }

    /* Loss signals: a counted completion's result names the job's previous completion (reserved = its seq's low
     * 7 bits and INA_FLAG_PREV_DONE, or reserved 0 if there was none); then it becomes the previous one. */
    action stamp_prev_done() {
        ina_last_done.read(meta.last_done, (bit<32>)hdr.ina.job_id);
        hdr.ina.reserved = 0;
        if (meta.last_done[7:7] == 1 && meta.last_done[23:8] == hdr.ina.generation) {
            hdr.ina.reserved = meta.last_done[6:0];
            hdr.ina.flags = hdr.ina.flags | INA_FLAG_PREV_DONE;
        }
        ina_last_done.write((bit<32>)hdr.ina.job_id,
                            ((bit<32>)hdr.ina.generation << 8) | 32w0x80 | (bit<32>)hdr.ina.seq[6:0]);
    }

    /* Loss signals: a counted frame that revealed a gap and would be dropped becomes the gap report to its sender,
     * header only: INA_STATUS with INA_FLAG_GAP, slot = frames lost (tx_ahead: reserved - expected, mod 128),
     * reserved its own counter. (A delivered one carries the gap in its sender's copy: meta.gap_slot.) */
    action gap_report() {
        hdr.ina_data.setInvalid();
        hdr.ina.msg_type = INA_STATUS;
        hdr.ina.flags = INA_FLAG_GAP;
        hdr.ina.slot = (bit<16>)meta.tx_ahead;
        hdr.ipv4.totalLen = INA_QUERY_IPV4_LEN;
        hdr.udp.length = INA_QUERY_UDP_LEN;
        reply_to_sender();
    }

    apply {
        meta.tx_gap = 0;  /* MyEgress reads it on every multicast, also those that leave before step 6t */
        /* 1. Packet-out from the controller: send as told. */
        if (hdr.packet_out.isValid()) {
            standard_metadata.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            exit;
        }

        /* 2. Malformed frames never reach any state. */
        if (standard_metadata.parser_error != error.NoError || standard_metadata.checksum_error == 1) {
            ina_drops.count((bit<32>)DROP_MALFORMED);
            drop();
            exit;
        }
        if (!hdr.ipv4.isValid()) {
            drop();
            exit;
        }

        /* 3. Everything that is not INA (and, chains, INA of a job this switch only carries): IPv4 LPM forwarding. */
        if (hdr.ina.isValid()) {
            ina_transit.apply();
        }
        if (!hdr.ina.isValid() || meta.transit == 1) {
            if (!ipv4_lpm.apply().hit) {
                ina_drops.count((bit<32>)DROP_NO_ROUTE);
            }
            exit;
        }

        /* 4. INA: validate lengths, job, message type, generation, worker, binding, slot. */
        if (hdr.ina.msg_type == INA_QUERY) {
            if (hdr.ipv4.totalLen != INA_QUERY_IPV4_LEN || hdr.udp.length != INA_QUERY_UDP_LEN) {
                ina_drops.count((bit<32>)DROP_MALFORMED);
                drop();
                exit;
            }
        } else if (hdr.ipv4.totalLen != INA_IPV4_LEN || hdr.udp.length != INA_UDP_LEN) {
            ina_drops.count((bit<32>)DROP_MALFORMED);
            drop();
            exit;
        }
        if (hdr.ina.job_id >= MAX_JOBS) {  /* job ids index the per-job counters: none beyond them */
            ina_drops.count((bit<32>)DROP_UNKNOWN_JOB);
            drop();
            exit;
        }
        if (!ina_job.apply().hit) {
            ina_drops.count((bit<32>)DROP_UNKNOWN_JOB);
            drop();
            exit;
        }
        ina_chain.apply();  /* chains: upstream members join the mask, final_grp replaces mcast_grp */
        /* 4b. Ingress binding: the sender must be where (job, member) was bound. A member bound by link
         * (bind_link: a switch's partials and passed-on final sums) is checked by port and UDP port only. */
        meta.member_id = hdr.ina.worker_id;
        meta.bound = 0;
        if (ina_binding.apply().hit) {
            if (meta.bound_by_link == 1) {
                if ((standard_metadata.ingress_port == meta.bound_port && hdr.udp.srcPort == meta.bound_udp_port) ||
                    (standard_metadata.ingress_port == meta.bound_next_port &&
                     hdr.udp.srcPort == meta.bound_next_udp_port)) {
                    meta.bound = 1;
                }
            } else if (standard_metadata.ingress_port == meta.bound_port && hdr.ethernet.srcAddr == meta.bound_mac &&
                       hdr.ipv4.srcAddr == meta.bound_ip && hdr.udp.srcPort == meta.bound_udp_port) {
                meta.bound = 1;
            }
        }
        meta.drop_reason = 0;
        meta.wbit = (bit<32>)1 << hdr.ina.worker_id;
        meta.slot_abs = (bit<32>)meta.base_slot + (bit<32>)hdr.ina.slot;
        if (hdr.ina.msg_type != INA_GRADIENT && hdr.ina.msg_type != INA_BROADCAST &&
            !(hdr.ina.msg_type == INA_RESULT && meta.chain == 1) &&
            !(hdr.ina.msg_type == INA_QUERY && meta.chain == 0)) {
            meta.drop_reason = DROP_BAD_MSG_TYPE;
        } else if (hdr.ina.generation != meta.generation) {
            meta.drop_reason = DROP_STALE_GENERATION;
        } else if (hdr.ina.msg_type == INA_RESULT) {
            if (hdr.ina.worker_id != meta.own_member_id) {
                meta.drop_reason = DROP_NOT_RECIPIENT;
            } else if (meta.bound == 0) {
                meta.drop_reason = DROP_SPOOFED;  /* bound under the recipient's own id: where final sums come from */
            } else if (hdr.ina.slot >= meta.num_slots || meta.slot_abs >= NUM_SLOTS) {
                meta.drop_reason = DROP_SLOT_OUT_OF_RANGE;
            }
        } else if ((meta.worker_mask & meta.wbit) == 0) {
            meta.drop_reason = DROP_FOREIGN_WORKER;
        } else if (meta.bound == 0) {
            meta.drop_reason = DROP_SPOOFED;
        } else if ((hdr.ina.msg_type == INA_GRADIENT || hdr.ina.msg_type == INA_QUERY) &&
                   (hdr.ina.slot >= meta.num_slots || meta.slot_abs >= NUM_SLOTS)) {
            meta.drop_reason = DROP_SLOT_OUT_OF_RANGE;
        }
        if (meta.drop_reason != 0) {
            ina_drops.count((bit<32>)meta.drop_reason);
            ina_job_drops.count((bit<32>)hdr.ina.job_id * NUM_DROP_REASONS + (bit<32>)meta.drop_reason);
            drop();
            exit;
        }

        /* 5. Broadcast: to every worker of the job, payload as it is. */
        if (hdr.ina.msg_type == INA_BROADCAST) {
            multicast_to_job();
            exit;
        }

        /* 6. Gradient. A slot whose owner changed (another job, or a new generation) is reset first. The
         * owner epoch makes the tag unique past 65,535 generations of one job (the wire generation wraps). */
        meta.cell = (meta.slot_abs << 1) + (bit<32>)hdr.ina.shadow;
        meta.other_cell = (meta.slot_abs << 1) + (bit<32>)(~hdr.ina.shadow);
        meta.lane_base = meta.cell * LANES;
        meta.owner = meta.owner_epoch ++ hdr.ina.job_id ++ hdr.ina.generation;
        ina_owner.read(meta.prev_owner, meta.slot_abs);

        /* 6q. Query (docs/protocol.md, "Queries"): a worker whose chunk has no result asks before it resends the
         * payload. Its contribution in a complete copy: the stored sum, as to a resent gradient; in an
         * incomplete one: a status with INA_FLAG_HELD (the copy waits for a peer; the payload need not be
         * resent); anything else: a status without it (resend). Only to the sender; no state changes. */
        if (hdr.ina.msg_type == INA_QUERY) {
            ina_bitmap.read(meta.bitmap, meta.cell);
            ina_count.read(meta.count, meta.cell);
            ina_overflow.read(meta.overflow, meta.cell);
            ina_seq.read(meta.stored_seq, meta.cell);
            hdr.ina.msg_type = INA_STATUS;
            hdr.ina.flags = 0;
            if (meta.prev_owner == meta.owner && hdr.ina.seq == meta.stored_seq && (meta.bitmap & meta.wbit) != 0) {
                if (meta.count == 0) {
                    hdr.ina_data.setValid();
                    READ_LANE(0, lane00)  READ_LANE(1, lane01)  READ_LANE(2, lane02)  READ_LANE(3, lane03)
                    READ_LANE(4, lane04)  READ_LANE(5, lane05)  READ_LANE(6, lane06)  READ_LANE(7, lane07)
                    READ_LANE(8, lane08)  READ_LANE(9, lane09)  READ_LANE(10, lane10) READ_LANE(11, lane11)
                    READ_LANE(12, lane12) READ_LANE(13, lane13) READ_LANE(14, lane14) READ_LANE(15, lane15)
                    READ_LANE(16, lane16) READ_LANE(17, lane17) READ_LANE(18, lane18) READ_LANE(19, lane19)
                    READ_LANE(20, lane20) READ_LANE(21, lane21) READ_LANE(22, lane22) READ_LANE(23, lane23)
                    READ_LANE(24, lane24) READ_LANE(25, lane25) READ_LANE(26, lane26) READ_LANE(27, lane27)
                    READ_LANE(28, lane28) READ_LANE(29, lane29) READ_LANE(30, lane30) READ_LANE(31, lane31)
                    hdr.ina.msg_type = INA_RESULT;
                    if (meta.overflow != 0) {
                        hdr.ina.flags = INA_FLAG_OVERFLOW;
                    }
                    hdr.ipv4.totalLen = INA_IPV4_LEN;
                    hdr.udp.length = INA_UDP_LEN;
                } else {
                    hdr.ina.flags = INA_FLAG_HELD;
                }
            }
            reply_to_sender();
            exit;
        }

        /* 6c. Chains: the final sum reaching this switch. Kept in a complete copy of the same chunk that holds
         * the partial this switch sent onward, then sent to final_grp; anything else is a duplicate. */
        if (hdr.ina.msg_type == INA_RESULT) {
            ina_bitmap.read(meta.bitmap, meta.cell);
            ina_count.read(meta.count, meta.cell);
            ina_seq.read(meta.stored_seq, meta.cell);
            ina_final.read(meta.final, meta.cell);
            if (meta.prev_owner == meta.owner && meta.bitmap != 0 && meta.count == 0 &&
                meta.stored_seq == hdr.ina.seq && meta.final == 0) {
                STORE_LANE(0, lane00)  STORE_LANE(1, lane01)  STORE_LANE(2, lane02)  STORE_LANE(3, lane03)
                STORE_LANE(4, lane04)  STORE_LANE(5, lane05)  STORE_LANE(6, lane06)  STORE_LANE(7, lane07)
                STORE_LANE(8, lane08)  STORE_LANE(9, lane09)  STORE_LANE(10, lane10) STORE_LANE(11, lane11)
                STORE_LANE(12, lane12) STORE_LANE(13, lane13) STORE_LANE(14, lane14) STORE_LANE(15, lane15)
                STORE_LANE(16, lane16) STORE_LANE(17, lane17) STORE_LANE(18, lane18) STORE_LANE(19, lane19)
                STORE_LANE(20, lane20) STORE_LANE(21, lane21) STORE_LANE(22, lane22) STORE_LANE(23, lane23)
                STORE_LANE(24, lane24) STORE_LANE(25, lane25) STORE_LANE(26, lane26) STORE_LANE(27, lane27)
                STORE_LANE(28, lane28) STORE_LANE(29, lane29) STORE_LANE(30, lane30) STORE_LANE(31, lane31)
                ina_final.write(meta.cell, 1);
                meta.overflow = 0;
                hdr.ina.flags = hdr.ina.flags & INA_FLAG_OVERFLOW;
                if (hdr.ina.flags != 0) {
                    meta.overflow = 1;
                }
                ina_overflow.write(meta.cell, meta.overflow);
                multicast_to_job();
            } else {
                ina_duplicates.count((bit<32>)hdr.ina.job_id);
                drop();
            }
            exit;
        }

        /* 6t. Loss signals (docs/protocol.md, "Loss signals"): a counted gradient of a job not on a chain checks its
         * sender's transmission counter against the one expected next (none: not yet, or of another generation);
         * in sequence, or a gap (1 .. INA_TX_LATE_HALF - 1 ahead), the next one is written now, whatever the
         * frame's fate, and the frame's fate says how the gap is reported: a dropped frame becomes the gap report,
         * a delivered one carries it to its sender (the sender's copy of a completion, or the answer to a resend);
         * a late frame (INA_TX_LATE_HALF or more ahead, i.e. behind: reordered or duplicated) neither reports nor
         * writes, and is otherwise as in sequence. */
        meta.tx_counted = 0;
        meta.tx_gap = 0;
        if (meta.chain == 0 && (hdr.ina.flags & INA_FLAG_TX_COUNTED) != 0) {
            meta.tx_counted = 1;
            meta.tx_idx = (bit<32>)hdr.ina.job_id * 32 + (bit<32>)hdr.ina.worker_id;
            ina_tx_next.read(meta.tx_next, meta.tx_idx);
            meta.tx_ahead = hdr.ina.reserved - meta.tx_next[6:0];
            if (meta.tx_next[7:7] == 0 || meta.tx_next[23:8] != hdr.ina.generation) {
                meta.tx_ahead = 0;  /* none expected: in sequence */
            }
            if (meta.tx_ahead < INA_TX_LATE_HALF) {
                if (meta.tx_ahead != 0) {
                    meta.tx_gap = 1;
                    meta.gap_slot = ((bit<16>)meta.tx_ahead << 7) | (bit<16>)hdr.ina.reserved;
                    meta.gap_worker = hdr.ina.worker_id;
                }
                ina_tx_next.write(meta.tx_idx, ((bit<32>)hdr.ina.generation << 8) | 32w0x80
                                               | (bit<32>)(hdr.ina.reserved + 1));
            }
        }

        if (meta.prev_owner != meta.owner) {
            ina_owner.write(meta.slot_abs, meta.owner);
            ina_bitmap.write(meta.slot_abs << 1, 0);
            ina_bitmap.write((meta.slot_abs << 1) + 1, 0);
            ina_count.write(meta.slot_abs << 1, 0);
            ina_count.write((meta.slot_abs << 1) + 1, 0);
            ina_overflow.write(meta.slot_abs << 1, 0);
            ina_overflow.write((meta.slot_abs << 1) + 1, 0);
            ina_seq.write(meta.slot_abs << 1, hdr.ina.seq - 1);
            ina_seq.write((meta.slot_abs << 1) + 1, hdr.ina.seq - 1);
        }

        ina_bitmap.read(meta.bitmap, meta.cell);
        ina_count.read(meta.count, meta.cell);
        ina_overflow.read(meta.overflow, meta.cell);
        ina_seq.read(meta.stored_seq, meta.cell);

        /* A worker's bit not in the copy: its contribution to the round in progress (same seq), or the start
         * of the copy's next round (newer seq, copy empty or complete). Anything else is a late packet of a
         * round the copy already finished, which the network delayed or reordered: never added. */
        meta.age = hdr.ina.seq - meta.stored_seq;
        meta.accept = 0;
        if ((meta.bitmap & meta.wbit) == 0) {
            if (meta.count == 0) {
                if (meta.age != 0 && meta.age[31:31] == 0) {
                    meta.accept = 1;
                }
            } else if (meta.age == 0) {
                meta.accept = 1;
            }
        }

        if (meta.accept == 1) {
            /* 6a. A new contribution: mark it in this copy, clear it in the other (SwitchML's shadow sets). */
            ina_bitmap.write(meta.cell, meta.bitmap | meta.wbit);
            ina_bitmap.read(meta.other_bitmap, meta.other_cell);
            ina_bitmap.write(meta.other_cell, meta.other_bitmap & ~meta.wbit);
            meta.first = 0;
            if (meta.count == 0) {
                meta.first = 1;
                meta.overflow = 0;
                ina_seq.write(meta.cell, hdr.ina.seq);
                if (meta.chain == 1) {
                    ina_final.write(meta.cell, 0);
                }
            }
            if (meta.chain == 1 && (hdr.ina.flags & INA_FLAG_OVERFLOW) != 0) {
                meta.overflow = 1;  /* an upstream partial that overflowed */
            }
            meta.count = meta.count + 1;
            meta.complete = 0;
            if (meta.count == meta.num_workers) {
                meta.count = 0;
                meta.complete = 1;
            }
            ina_count.write(meta.cell, meta.count);

            meta.lane_ovf = 0;
            AGGREGATE_LANE(0, lane00)  AGGREGATE_LANE(1, lane01)  AGGREGATE_LANE(2, lane02)  AGGREGATE_LANE(3, lane03)
            AGGREGATE_LANE(4, lane04)  AGGREGATE_LANE(5, lane05)  AGGREGATE_LANE(6, lane06)  AGGREGATE_LANE(7, lane07)
            AGGREGATE_LANE(8, lane08)  AGGREGATE_LANE(9, lane09)  AGGREGATE_LANE(10, lane10) AGGREGATE_LANE(11, lane11)
            AGGREGATE_LANE(12, lane12) AGGREGATE_LANE(13, lane13) AGGREGATE_LANE(14, lane14) AGGREGATE_LANE(15, lane15)
            AGGREGATE_LANE(16, lane16) AGGREGATE_LANE(17, lane17) AGGREGATE_LANE(18, lane18) AGGREGATE_LANE(19, lane19)
            AGGREGATE_LANE(20, lane20) AGGREGATE_LANE(21, lane21) AGGREGATE_LANE(22, lane22) AGGREGATE_LANE(23, lane23)
            AGGREGATE_LANE(24, lane24) AGGREGATE_LANE(25, lane25) AGGREGATE_LANE(26, lane26) AGGREGATE_LANE(27, lane27)
            AGGREGATE_LANE(28, lane28) AGGREGATE_LANE(29, lane29) AGGREGATE_LANE(30, lane30) AGGREGATE_LANE(31, lane31)
            if (meta.lane_ovf[31:31] == 1) {
                meta.overflow = 1;
            }
            ina_overflow.write(meta.cell, meta.overflow);
            ina_aggregated.count((bit<32>)hdr.ina.job_id);

            if (meta.complete == 1) {
                hdr.ina.msg_type = INA_RESULT;
                hdr.ina.flags = 0;
                if (meta.overflow != 0) {
                    hdr.ina.flags = INA_FLAG_OVERFLOW;
                }
                if (meta.chain == 1 && meta.chain_end == 0) {
                    send_onward();  /* chains: the partial goes on; the copy waits for the final sum */
                } else {
                    if (meta.chain == 1) {
                        ina_final.write(meta.cell, 1);
                    }
                    if (meta.tx_counted == 1) {
                        stamp_prev_done();
                    }
                    multicast_to_job();
                }
            } else if (meta.tx_gap == 1) {
                gap_report();
            } else {
                drop();
            }
        } else {
            /* 6b. Seen before: a completed copy answers its sender alone; anything else is dropped. */
            ina_duplicates.count((bit<32>)hdr.ina.job_id);
            meta.final = 1;
            if (meta.chain == 1) {
                ina_final.read(meta.final, meta.cell);
            }
            if (meta.count == 0 && meta.age == 0 && (meta.bitmap & meta.wbit) != 0) {
                READ_LANE(0, lane00)  READ_LANE(1, lane01)  READ_LANE(2, lane02)  READ_LANE(3, lane03)
                READ_LANE(4, lane04)  READ_LANE(5, lane05)  READ_LANE(6, lane06)  READ_LANE(7, lane07)
                READ_LANE(8, lane08)  READ_LANE(9, lane09)  READ_LANE(10, lane10) READ_LANE(11, lane11)
                READ_LANE(12, lane12) READ_LANE(13, lane13) READ_LANE(14, lane14) READ_LANE(15, lane15)
                READ_LANE(16, lane16) READ_LANE(17, lane17) READ_LANE(18, lane18) READ_LANE(19, lane19)
                READ_LANE(20, lane20) READ_LANE(21, lane21) READ_LANE(22, lane22) READ_LANE(23, lane23)
                READ_LANE(24, lane24) READ_LANE(25, lane25) READ_LANE(26, lane26) READ_LANE(27, lane27)
                READ_LANE(28, lane28) READ_LANE(29, lane29) READ_LANE(30, lane30) READ_LANE(31, lane31)
                hdr.ina.msg_type = INA_RESULT;
                hdr.ina.flags = 0;
                if (meta.overflow != 0) {
                    hdr.ina.flags = INA_FLAG_OVERFLOW;
                }
                if (meta.final == 1) {
                    if (meta.tx_counted == 1) {
                        hdr.ina.reserved = 0;  /* an answer to a resend carries no PREV_DONE */
                        if (meta.tx_gap == 1) {
                            hdr.ina.flags = hdr.ina.flags | INA_FLAG_GAP;
                            hdr.ina.slot = meta.gap_slot;
                        }
                    }
                    reply_to_sender();
                } else {
                    /* chains: a copy still waiting for the final sum sends its partial onward again */
                    hdr.ina.flags = hdr.ina.flags | INA_FLAG_RETRANSMIT;
                    send_onward();
                }
            } else if (meta.tx_gap == 1) {
                gap_report();
            } else {
                drop();
            }
        }
    }
}

/*************************************************************************
****************  E G R E S S   P R O C E S S I N G   *******************
*************************************************************************/

control MyEgress(inout headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {

    counter(MAX_JOBS, CounterType.packets) ina_results;  /* result packets sent, one per recipient */

    action drop() {
        mark_to_drop(standard_metadata);
    }

    /* Per-replica rewrite: the replica id (egress_rid) is the recipient's worker id. */
    action set_worker_addr(macAddr_t mac, ip4Addr_t ip, bit<16> udp_port) {
        hdr.ethernet.dstAddr = mac;
        hdr.ipv4.dstAddr = ip;
        hdr.udp.dstPort = udp_port;
        hdr.ina.worker_id = (bit<8>)standard_metadata.egress_rid;
    }

    table ina_worker {
        key = {
            hdr.ina.job_id: exact;
            standard_metadata.egress_rid: exact;
        }
        actions = {
            set_worker_addr;
            @defaultonly drop;
        }
        size = 8192;
        const default_action = drop();
    }

    apply {
        if (meta.ina_mcast == 1) {
            if (!ina_worker.apply().hit) {
                exit;
            }
            /* Loss signals: the completing frame revealed a gap: its sender's copy of the result carries it. */
            if (meta.tx_gap == 1 && hdr.ina.worker_id == meta.gap_worker) {
                hdr.ina.flags = hdr.ina.flags | INA_FLAG_GAP;
                hdr.ina.slot = meta.gap_slot;
            }
        }
        if (meta.ina_out == 1) {
            hdr.udp.checksum = 0;  /* the payload changed; 0 means "no checksum" for UDP over IPv4 */
            if (hdr.ina.msg_type == INA_RESULT) {
                ina_results.count((bit<32>)hdr.ina.job_id);
            }
        }
        if (standard_metadata.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = standard_metadata.ingress_port;
            hdr.packet_in._pad = 0;
        }
    }
}

/*************************************************************************
*************   C H E C K S U M    C O M P U T A T I O N   **************
*************************************************************************/

control MyComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid(),
            { hdr.ipv4.version,
              hdr.ipv4.ihl,
              hdr.ipv4.diffserv,
              hdr.ipv4.totalLen,
              hdr.ipv4.identification,
              hdr.ipv4.flags,
              hdr.ipv4.fragOffset,
              hdr.ipv4.ttl,
              hdr.ipv4.protocol,
              hdr.ipv4.srcAddr,
              hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum,
            HashAlgorithm.csum16);
    }
}

/*************************************************************************
***********************  D E P A R S E R  *******************************
*************************************************************************/

control MyDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.ina);
        packet.emit(hdr.ina_data);
    }
}

/*************************************************************************
***********************  S W I T C H  ***********************************
*************************************************************************/

V1Switch(
    MyParser(),
    MyVerifyChecksum(),
    MyIngress(),
    MyEgress(),
    MyComputeChecksum(),
    MyDeparser()
) main;
