/*
 * common/settings.c — the key table of peercached and its loading order.
 *
 * Owns: the table rows (names as in the original PeerCache, DESIGN §11), the
 * list of settings whose feature has not landed yet, and the cross-key rules.
 * The original's other key names are aliases (compat.c): staged by the
 * table's alias hook while the sources are read, applied after all three.
 * Thread: main, before reactors start.
 *
 * Defaults and why:
 *  - ports 31997..32000 and the socket path follow DESIGN §11; port 0 picks a
 *    free port (logged), so tests run many nodes on one host.
 *  - bind 127.0.0.1: a node is reachable from loopback only until the
 *    operator opts in (and, once cluster authentication lands, sets a secret).
 *  - pool_size 4gb: the original's global_segment_size; memory is mapped
 *    lazily, so an idle node does not hold it.
 *  - slot_max_page_bytes 8mb with slot_ways 4: real pages are 256 KiB (MLA)
 *    up to 4-8 MiB (MHA); a class must hold the largest or those pages can
 *    never be cached.
 *  - slot classes (slotmap's region, pool_size bytes), derived in this order:
 *    slot_num_buckets > 0: one class of slot_max_page_bytes x slot_ways x
 *    slot_num_buckets, the original's geometry (slot_classes must then be
 *    auto); else slot_classes = auto: 16kb x slot_ways on 10 % of the
 *    region (sidecar pools' and layer-split pages of a few KiB), 256kb x
 *    slot_ways on 35 % and slot_max_page_bytes x slot_ways on 55 % when
 *    slot_max_page_bytes is above 256kb (so 256 KiB MLA pages do not each
 *    take an 8 MiB slot); 16kb on 10 % and slot_max_page_bytes on 90 % when
 *    it is above 16kb; else one class of slot_max_page_bytes on 100 %;
 *    else the list SIZE:WAYS:SHARE,... as given (at most 8 classes of
 *    distinct sizes within 4kb..1gb, ways 1..64, SHARE a percent of the
 *    region "40%" or a bucket count "1000", percents summing to <= 100).
 *  - slotmap refuses the disk tier: its pages live only in the slot region
 *    (as in the original), and the tier works on p2p's pool and records.
 *  - reactor sizes: 1024 SQ entries (x8 CQ) and 512 x 16 KiB receive buffers
 *    per thread (8 MiB) carry thousands of connections; 16384 op slots bound
 *    the in-flight work of one thread.
 */
#include "settings.h"
#include "secret.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "util.h"

static const char *const mode_choices[] = {"p2p", "slotmap", NULL};
static const char *const protocol_choices[] = {"auto", "tcp", "rdma", NULL};
static const char *const disc_backend_choices[] = {"embedded", "etcd",
						  NULL};
static const char *const level_choices[] = {"error", "warn", "info", "debug",
					    "trace", NULL};

#define OFF(f) offsetof(struct pc_settings, f)
#define KB 1024ll
#define MB (1024ll * KB)
#define GB (1024ll * MB)
#define TB (1024ll * GB)
#define SEC 1000ll
#define MIN (60 * SEC)

/* name, type, default, min, max, choices, offset, flags, help */
static const struct pc_cfg_key keys[] = {
	{"node_id", PC_CFG_STRING, "", 0, 64, NULL, OFF(node_id), 0,
	 "stable node name; empty = <hostname>-<rpc_port>"},
	{"mode", PC_CFG_ENUM, "p2p", 0, 0, mode_choices, OFF(mode), 0,
	 "placement mode: p2p (directory) or slotmap (directory-free)"},
	{"threads", PC_CFG_INT, "0", 0, 256, NULL, OFF(threads), 0,
	 "reactor threads; 0 = one per online CPU"},
	{"bind", PC_CFG_STRING, "127.0.0.1", 0, 255, NULL, OFF(bind), 0,
	 "listen address for rpc, data and meta ports"},
	{"advertise_host", PC_CFG_STRING, "", 0, 255, NULL, OFF(advertise_host),
	 0, "host other nodes use to reach this one; empty = bind (which "
	 "must then be a specific address)"},
	{"rpc_port", PC_CFG_INT, "31999", 0, 65535, NULL, OFF(rpc_port), 0,
	 "control-plane MessagePack-RPC TCP port; 0 = pick a free port"},
	{"data_port", PC_CFG_INT, "32000", 0, 65535, NULL, OFF(data_port), 0,
	 "TCP data-plane port (fallback transport); 0 = pick a free port"},
	{"meta_port", PC_CFG_INT, "31998", 0, 65535, NULL, OFF(meta_port), 0,
	 "discovery service port; 0 = pick a free port"},
	{"socket", PC_CFG_STRING, "/run/peercache/peercached.sock", 0, 107, NULL,
	 OFF(socket), 0, "Unix socket for local clients; empty = none"},
	{"cluster_secret", PC_CFG_STRING, "", 0, 256, NULL, OFF(cluster_secret),
	 PC_CFG_SECRET, "shared secret nodes prove to each other (prefer "
	 "cluster_secret_file or the environment: command lines are visible "
	 "to every local user)"},
	{"cluster_secret_file", PC_CFG_STRING, "", 0, 4095, NULL,
	 OFF(cluster_secret_file), 0,
	 "file holding cluster_secret (mode 600 or 640; trailing newline "
	 "ignored)"},
	{"peers", PC_CFG_STRING, "", 0, 4096, NULL, OFF(peers), 0,
	 "static membership: host:rpc_port,... of the other nodes (re-read on "
	 "SIGHUP; cluster.set_peers changes it at run time)"},
	{"discovery_addr", PC_CFG_STRING, "", 0, 1024, NULL,
	 OFF(discovery_addr), 0,
	 "discovery seeds host:meta_port[,seed...] (the first is the head; a "
	 "node listed first is itself the head); empty = no discovery: "
	 "membership is the static `peers` (both at once are refused)"},
	{"protocol", PC_CFG_ENUM, "auto", 0, 0, protocol_choices, OFF(protocol),
	 0, "data transport: auto (RDMA if a device is up, else TCP), tcp, "
	 "rdma (refused at start without a usable device); RDMA needs "
	 "cluster_secret"},
	{"device_name", PC_CFG_STRING, "", 0, 63, NULL, OFF(device_name), 0,
	 "RDMA device (as ibv_devices names it); empty = the first one with "
	 "ib_port active"},
	{"device_names", PC_CFG_STRING, "", 0, 255, NULL, OFF(device_names), 0,
	 "RDMA devices, comma-separated, one rail each (at most 8; each "
	 "device's network address is where peers reach its rail); a batch "
	 "is striped over the rails both nodes have; overrides device_name; "
	 "empty = one rail (device_name)"},
	{"ib_port", PC_CFG_INT, "1", 1, 255, NULL, OFF(ib_port), 0,
	 "RDMA device port"},
	{"gid_index", PC_CFG_INT, "-1", -1, 255, NULL, OFF(gid_index), 0,
	 "RDMA GID index the device must have (rdma_cm picks the GID of the "
	 "address it connects from); -1 = no check"},
	{"rdma_op_timeout_ms", PC_CFG_INT, "5000", 0, 10 * MIN, NULL,
	 OFF(rdma_op_timeout_ms), 0,
	 "milliseconds an RDMA operation may stay posted without completing "
	 "before its queue pair counts as stuck: closed, its operations sent "
	 "once more on another (the batch's own deadline still bounds the "
	 "call); 0 = off"},
	{"vnodes", PC_CFG_INT, "160", 1, 4096, NULL, OFF(vnodes), 0,
	 "virtual nodes per node on the consistent-hash ring"},
	{"directory_replicas", PC_CFG_INT, "2", 1, 8, NULL,
	 OFF(directory_replicas), 0,
	 "directory records are written to this many ring owners"},
	{"max_channels_per_peer", PC_CFG_INT, "16", 1, 1024, NULL,
	 OFF(max_channels_per_peer), 0,
	 "data channels (RC QPs or TCP sockets) pooled per peer"},
	{"max_masters", PC_CFG_INT, "3", 1, 16, NULL, OFF(max_masters), 0,
	 "discovery masters (the head is pinned first)"},
	{"heartbeat_interval", PC_CFG_DURATION, "500ms", 100, 1 * MIN, NULL,
	 OFF(heartbeat_interval_ms), 0, "discovery heartbeat period (sent "
	 "from the discovery thread, never delayed by a busy reactor)"},
	{"member_ttl", PC_CFG_DURATION, "2s", 500, 10 * MIN, NULL,
	 OFF(member_ttl_ms), 0, "a member silent this long is dropped (suspect "
	 "from half of it); with 500ms heartbeats a failure is seen "
	 "everywhere within about 2.6 s"},
	{"discovery_backend", PC_CFG_ENUM, "embedded", 0, 0,
	 disc_backend_choices, OFF(discovery_backend), 0,
	 "where membership is kept: embedded (masters on the meta port, "
	 "discovery_addr) or etcd (keys with a lease under etcd_prefix)"},
	{"etcd_endpoints", PC_CFG_STRING, "", 0, 1024, NULL,
	 OFF(etcd_endpoints), 0,
	 "etcd v3 HTTP/JSON endpoints host:port[,host:port...], tried in "
	 "order (discovery_backend = etcd)"},
	{"etcd_prefix", PC_CFG_STRING, "/peercache/", 1, 255, NULL,
	 OFF(etcd_prefix), 0,
	 "etcd key prefix of this cluster's members (<prefix>members/<id>, "
	 "each with a lease of member_ttl rounded up to seconds)"},
	{"pool_size", PC_CFG_SIZE, "4gb", 1 * MB, 16 * TB, NULL, OFF(pool_size),
	 0, "publish pool (p2p) or slot region (slotmap) bytes"},
	{"pool_prefault", PC_CFG_BOOL, "true", 0, 0, NULL, OFF(pool_prefault),
	 0, "fault the whole pool in from a background thread once the node "
	 "is ready (never delays start-up; memory committed in the first "
	 "seconds; no page-fault stalls on first writes)"},
	{"page_checksums", PC_CFG_BOOL, "true", 0, 0, NULL,
	 OFF(page_checksums), 0,
	 "checksum every published page (XXH3) and verify it on remote reads"},
	{"slot_max_page_bytes", PC_CFG_SIZE, "8mb", 4 * KB, 1 * GB, NULL,
	 OFF(slot_max_page_bytes), 0, "slotmap: largest page a slot holds"},
	{"slot_ways", PC_CFG_INT, "4", 1, 64, NULL, OFF(slot_ways), 0,
	 "slotmap: ways per bucket"},
	{"slot_num_buckets", PC_CFG_INT, "0", 0, 1ll << 32, NULL,
	 OFF(slot_num_buckets), 0, "slotmap: buckets of one class of "
	 "slot_max_page_bytes x slot_ways (the original's geometry; "
	 "slot_classes must be auto); 0 = size classes from slot_classes"},
	{"slot_classes", PC_CFG_STRING, "auto", 1, 1024, NULL,
	 OFF(slot_classes), 0, "slotmap: the slot region's size classes, "
	 "SIZE:WAYS:SHARE,... (at most 8; SIZE 4kb..1gb, WAYS 1..64, SHARE a "
	 "percent of pool_size like 40% or a bucket count), or auto: "
	 "16kb:slot_ways:10%, 256kb:slot_ways:35% and "
	 "slot_max_page_bytes:slot_ways:55% when slot_max_page_bytes > 256kb "
	 "(the 256kb class left out when it is at most 256kb, the largest "
	 "then on 90%; one class on 100% at 16kb or less)"},
	{"metrics_enabled", PC_CFG_BOOL, "true", 0, 0, NULL,
	 OFF(metrics_enabled), 0, "serve /metrics and /healthz over HTTP"},
	{"metrics_dashboard", PC_CFG_BOOL, "true", 0, 0, NULL,
	 OFF(metrics_dashboard), 0, "serve the HTML dashboard at /"},
	{"metrics_port", PC_CFG_INT, "31997", 0, 65535, NULL, OFF(metrics_port),
	 0, "metrics HTTP port; 0 = pick a free port"},
	{"metrics_bind", PC_CFG_STRING, "", 0, 255, NULL, OFF(metrics_bind), 0,
	 "metrics listen address; empty = same as bind"},
	/* The disk tier (modules/disk.c, docs/disk.md). Off by default: a
	 * newcomer's disk is never filled silently; on, disk_path and
	 * disk_size must be given (no guessed location or size). 64 MiB
	 * regions keep writes sequential and eviction coarse; the write-through
	 * queue bound keeps a disk slower than the sets from growing memory. */
	{"disk_enabled", PC_CFG_BOOL, "false", 0, 0, NULL, OFF(disk_enabled), 0,
	 "L4 disk tier (write-through, promote on read, warm restart)"},
	{"disk_path", PC_CFG_STRING, "", 0, 4000, NULL, OFF(disk_path), 0,
	 "directory of the disk tier (created; holds the store file and its "
	 "identity); required when disk_enabled"},
	{"disk_size", PC_CFG_SIZE, "0", 0, 1024 * TB, NULL, OFF(disk_size), 0,
	 "disk tier capacity (one preallocated store file); at least two "
	 "disk_region_size when disk_enabled"},
	{"disk_region_size", PC_CFG_SIZE, "64mb", 1 * MB, 1 * GB, NULL,
	 OFF(disk_region_size), 0, "disk tier region: the unit of sequential "
	 "writes and of eviction (a multiple of 4kb; a page larger than a "
	 "region is not stored)"},
	{"disk_queue_max", PC_CFG_SIZE, "256mb", 1 * MB, 1 * TB, NULL,
	 OFF(disk_queue_max), 0, "page bytes waiting for their write-through; "
	 "beyond it pages are not written (counted, logged), sets never wait"},
	{"log_level", PC_CFG_ENUM, "info", 0, 0, level_choices, OFF(log_level),
	 0, "log threshold"},
	{"stats_log_interval", PC_CFG_DURATION, "60s", 0, 24 * 60 * MIN, NULL,
	 OFF(stats_log_interval_ms), 0,
	 "log a one-line activity summary this often; 0 = never"},
	{"rpc_max_message_bytes", PC_CFG_SIZE, "64mb", 4 * KB, 1 * GB, NULL,
	 OFF(rpc_max_message_bytes), 0,
	 "largest MessagePack-RPC message accepted"},
	{"rpc_max_elements", PC_CFG_INT, "1048576", 16, 1ll << 28, NULL,
	 OFF(rpc_max_elements), 0,
	 "largest array (entries) or map (pairs) in a message"},
	{"rpc_max_depth", PC_CFG_INT, "32", 2, 64, NULL, OFF(rpc_max_depth), 0,
	 "deepest nesting of arrays and maps in a message"},
	{"rpc_max_connections", PC_CFG_INT, "4096", 1, 1 << 20, NULL,
	 OFF(rpc_max_connections), 0,
	 "authenticated TCP connections served at once (the Unix socket and "
	 "pre-auth TCP have their own caps)"},
	{"rpc_max_inflight", PC_CFG_INT, "1024", 1, 65536, NULL,
	 OFF(rpc_max_inflight), 0,
	 "calls awaiting a reply per connection before reading pauses"},
	{"rpc_timeout", PC_CFG_DURATION, "5s", 10, 10 * MIN, NULL,
	 OFF(rpc_timeout_ms), 0, "timeout of calls this node makes"},
	/* RPC connection classes, deadlines and memory budget (issue 10). */
	{"rpc_max_preauth_connections", PC_CFG_INT, "256", 1, 1 << 20, NULL,
	 OFF(rpc_max_preauth_connections), 0,
	 "TCP connections still authenticating; when full, the oldest one is "
	 "dropped for a new one"},
	{"rpc_max_local_connections", PC_CFG_INT, "1024", 1, 1 << 20, NULL,
	 OFF(rpc_max_local_connections), 0,
	 "Unix-socket connections served at once"},
	{"rpc_max_connections_per_host", PC_CFG_INT, "512", 1, 1 << 20, NULL,
	 OFF(rpc_max_connections_per_host), 0,
	 "TCP connections from one source address (loopback included)"},
	{"rpc_preauth_max_bytes", PC_CFG_SIZE, "4kb", 512, 1 * MB, NULL,
	 OFF(rpc_preauth_max_bytes), 0,
	 "largest message a TCP client may send before it authenticated"},
	{"rpc_max_buffered_bytes", PC_CFG_SIZE, "256mb", 1 * MB, 1024 * GB, NULL,
	 OFF(rpc_max_buffered_bytes), 0,
	 "input held for incomplete messages, all connections together"},
	{"rpc_max_reply_bytes", PC_CFG_SIZE, "256mb", 1 * MB, 1024 * GB, NULL,
	 OFF(rpc_max_reply_bytes), 0,
	 "reply bytes queued or reserved, all connections together"},
	{"rpc_handshake_timeout", PC_CFG_DURATION, "5s", 100, 10 * MIN, NULL,
	 OFF(rpc_handshake_timeout_ms), 0,
	 "a TCP client must authenticate (or, without a secret, send its "
	 "first request) within this time"},
	{"rpc_message_timeout", PC_CFG_DURATION, "30s", 100, 60 * MIN, NULL,
	 OFF(rpc_message_timeout_ms), 0,
	 "a message must arrive whole within this time of its first byte"},
	{"rpc_idle_timeout", PC_CFG_DURATION, "5m", 0, 24 * 60 * MIN, NULL,
	 OFF(rpc_idle_timeout_ms), 0,
	 "close a TCP connection without traffic or calls this long; 0 = never"},
	{"rpc_write_stall_timeout", PC_CFG_DURATION, "30s", 0, 60 * MIN, NULL,
	 OFF(rpc_write_stall_timeout_ms), 0,
	 "close a connection (Unix socket too) whose queued replies took no "
	 "byte from the node this long; 0 = never"},
	{"metrics_max_connections", PC_CFG_INT, "64", 2, 65536, NULL,
	 OFF(metrics_max_connections), 0,
	 "metrics HTTP connections; when full, the oldest idle one is dropped"},
	{"metrics_max_connections_per_host", PC_CFG_INT, "16", 1, 65536, NULL,
	 OFF(metrics_max_connections_per_host), 0,
	 "metrics HTTP connections from one source address"},
	/* frozen peers (issue 10, finding 7) */
	{"request_deadline", PC_CFG_DURATION, "1s", 10, 10 * MIN, NULL,
	 OFF(request_deadline_ms), 0,
	 "budget of one page call (kv.get/set/exists, session.get/set): its "
	 "directory round trips and data reads share it"},
	{"peer_probe_interval", PC_CFG_DURATION, "250ms", 10, 1 * MIN, NULL,
	 OFF(peer_probe_interval_ms), 0,
	 "how often a suspect peer (one that did not answer) is probed with "
	 "node.health"},
	/* data-port connections (issue 10: the data port's guards) */
	{"data_max_connections", PC_CFG_INT, "8192", 2, 1 << 20, NULL,
	 OFF(data_max_connections), 0,
	 "data-port connections at once, unproven ones included (32 peers x "
	 "16 threads x 16 channels fit)"},
	{"data_max_preauth_connections", PC_CFG_INT, "256", 1, 1 << 20, NULL,
	 OFF(data_max_preauth_connections), 0,
	 "data-port connections not yet authenticated (or, without a secret, "
	 "without a first request); when full, the oldest one is dropped"},
	{"data_max_buffered_bytes", PC_CFG_SIZE, "64mb", 1 * MB, 1024 * GB,
	 NULL, OFF(data_max_buffered_bytes), 0,
	 "input and copied reply bytes held by all data-port connections "
	 "(page payloads are sent from the pool and not counted)"},
	{"socket_group", PC_CFG_STRING, "", 0, 64, NULL, OFF(socket_group), 0,
	 "group (name or gid) whose members may use the Unix socket, besides "
	 "the node's user and root"},
	{"reactor_sq_entries", PC_CFG_INT, "1024", 64, 32768, NULL,
	 OFF(reactor_sq_entries), 0,
	 "io_uring submission queue size per thread (power of two)"},
	{"reactor_ops_max", PC_CFG_INT, "16384", 256, 1 << 22, NULL,
	 OFF(reactor_ops_max), 0, "in-flight I/O operations per thread"},
	{"reactor_buf_count", PC_CFG_INT, "512", 16, 32768, NULL,
	 OFF(reactor_buf_count), 0,
	 "receive buffers per thread (power of two)"},
	{"reactor_buf_bytes", PC_CFG_SIZE, "16kb", 1 * KB, 1 * MB, NULL,
	 OFF(reactor_buf_bytes), 0, "bytes per receive buffer"},
	{"conn_out_max", PC_CFG_SIZE, "64mb", 64 * KB, 4 * GB, NULL,
	 OFF(conn_out_max), 0,
	 "output queued for a client that does not read before it is dropped"},
	{"shutdown_grace", PC_CFG_DURATION, "5s", 0, 10 * MIN, NULL,
	 OFF(shutdown_grace_ms), 0,
	 "time in-flight work gets to finish on shutdown"},
	/* local clients on every core (issue 11) */
	{"reactor_stall_threshold_us", PC_CFG_INT, "1000", 0, 60000000, NULL,
	 OFF(reactor_stall_threshold_us), 0,
	 "a reactor callback running longer than this many microseconds is "
	 "a stall: counted and logged (rate-limited); 0 turns reports off"},
	{"reactor_stall_cpu_clock", PC_CFG_BOOL, "false", 0, 0, NULL,
	 OFF(reactor_stall_cpu_clock), 0,
	 "also time reactor callbacks in thread CPU time (two system calls per "
	 "callback), so a stall report tells work from waits in the kernel "
	 "and from preemption"},
	{"reactor_nice", PC_CFG_INT, "0", -20, 19, NULL,
	 OFF(reactor_nice), 0,
	 "nice value of the reactor threads (0: the process's own); a negative "
	 "value keeps busy clients in the same scheduling group (cpu cgroup, "
	 "autogroup) from preempting the reactors; needs CAP_SYS_NICE "
	 "(refused: logged, left as is)"},
	{"reactor_idle_poll_us", PC_CFG_INT, "50", 0, 10000, NULL,
	 OFF(reactor_idle_poll_us), 0,
	 "after handling completions a reactor keeps polling for more this "
	 "many microseconds before it sleeps, so a request that follows a "
	 "reply is taken without the wake-up of an idle CPU; it yields to "
	 "anything else runnable meanwhile, and sleeps at once when another "
	 "thread wants its CPU; 0: sleep at once"},
	{"session_slice_bytes", PC_CFG_SIZE, "2mb", 64 * KB, 1 * GB, NULL,
	 OFF(session_slice_bytes), 0,
	 "bytes of pages one step of a session.set/get copies or checks on "
	 "the reactor before it lets other work run (at least one page)"},
	{"session_prefault", PC_CFG_BOOL, "true", 0, 0, NULL,
	 OFF(session_prefault), 0,
	 "fault a client region's pages in on the offload thread, 1 MiB "
	 "chunk by chunk, before the first session.set/get touches them, so "
	 "no reactor pays those page faults (only chunks that moves use)"},
	{"copy_slice_bytes", PC_CFG_SIZE, "512kb", 16 * KB, 64 * MB, NULL,
	 OFF(copy_slice_bytes), 0,
	 "bytes of client pages a reactor copies and checksums in one loop "
	 "pass; a larger page is copied over several passes"},
	{"slice_pass_max_us", PC_CFG_INT, "300", 0, 100000, NULL,
	 OFF(slice_pass_max_us), 0,
	 "a loop pass's sliced work for large calls — page copies (with what "
	 "each page's caller does as it is copied) and walks over a batch's "
	 "keys — also stops after this many microseconds, before "
	 "copy_slice_bytes or 512 keys when each page or key costs more than "
	 "usual; 0: bytes and keys alone"},
	/* request memory (kv): a kv.get's reply is also capped per call by
	 * the smallest of rpc_max_message_bytes, conn_out_max and this */
	{"kv_staging_max", PC_CFG_SIZE, "256mb", 1 * MB, 1 * TB, NULL,
	 OFF(kv_staging_max), 0,
	 "bytes all kv.* calls in flight may hold (kv.get's pages for its "
	 "reply, every call's per-key state); over it a call gets 'busy'"},
	/* directory shard: a record costs ~100 bytes plus its key and its
	 * producer's two endpoint strings (~200 bytes typical, ~900 at most),
	 * so 256mb holds 1-2.5 million records, far more than pools hold */
	{"directory_max_bytes", PC_CFG_SIZE, "256mb", 1 * MB, 1 * TB, NULL,
	 OFF(directory_max_bytes), 0,
	 "memory for this node's directory records; when full the oldest "
	 "records of a stripe (1/64 of it) are evicted"},
	/* directory read cache (modules/read_cache.h): a record costs ~420
	 * bytes plus its key */
	{"directory_read_cache_ttl", PC_CFG_DURATION, "0", 0, 60 * MIN, NULL,
	 OFF(directory_read_cache_ttl_ms), 0,
	 "how long a reader keeps the records its lookups returned, so that "
	 "reads of those keys skip the lookup (a bare number is seconds); a "
	 "cached record that no longer reads is looked up again in the same "
	 "call; 0 = off"},
	{"directory_read_cache_entries", PC_CFG_INT, "65536", 1, 16777216,
	 NULL, OFF(directory_read_cache_entries), 0,
	 "records the read cache holds at most (least recently used go "
	 "first)"},
};

/* The original's key names (compat.h): staged here, applied at the end of
 * pc_settings_load. */
static int settings_alias(void *settings, const char *name, const char *value,
			  const char *origin, char *err, size_t errlen)
{
	struct pc_settings *s = settings;
	return pc_compat_stage(&s->compat, &pc_settings_table, name, value,
			       origin, err, errlen);
}

/* The sample configuration's headings (etc/peercached.conf is generated
 * from this table: peercached --print-config-sample). */
static const struct pc_cfg_section sections[] = {
	{"node_id", "Identity and placement", NULL},
	{"bind", "Where the node listens",
	 "Loopback only unless a cluster secret is set; the Unix socket is for "
	 "SGLang and local tools."},
	{"cluster_secret", "Who may talk to the node",
	 "Without a secret: this user, root and socket_group, over loopback. "
	 "A non-loopback bind needs a secret; keep it in a file only this user "
	 "can read (mode 600), never on a command line (docs/security.md)."},
	{"peers", "Cluster membership",
	 "Static peers, or discovery (docs/discovery.md): one of the two."},
	{"protocol", "Data transport (docs/rdma.md)",
	 "auto = RDMA when a device is usable and cluster_secret is set, else "
	 "TCP (one log line says which); rdma = refuse to start without them."},
	{"vnodes", "Ring and directory", NULL},
	{"max_masters", "Discovery (docs/discovery.md)", NULL},
	{"pool_size", "Memory", NULL},
	{"slot_max_page_bytes", "slotmap mode (docs/slotmap.md)",
	 "pool_size is the slot region, cut into size classes; no effect in "
	 "p2p mode."},
	{"metrics_enabled", "Metrics and dashboard", NULL},
	{"disk_enabled", "L4 disk tier (p2p mode only; docs/disk.md)", NULL},
	{"log_level", "Logging", NULL},
	{"rpc_max_message_bytes", "Limits on what one client may use",
	 "Every cap has a metric when it is hit (docs/security.md)."},
	{"request_deadline", "Deadlines",
	 "A page call (kv.*, session.get/set) never waits longer than "
	 "request_deadline, however many peers it touches; a peer that does "
	 "not answer is skipped until it answers a probe."},
	{"data_max_connections", "Data port", NULL},
	{"socket_group", "Local access", NULL},
	{"reactor_sq_entries", "Reactor threads",
	 "Defaults suit most hosts; docs/architecture.md explains each."},
	{"session_slice_bytes", "Local clients (shared-memory sessions)", NULL},
	{"kv_staging_max", "Request memory", NULL},
	{NULL, NULL, NULL},
};

const struct pc_cfg_table pc_settings_table = {keys, PC_ARRAY_LEN(keys),
					       settings_alias, sections};

int pc_settings_defaults(struct pc_settings *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	return pc_cfg_defaults(&pc_settings_table, s, err, errlen);
}

void pc_settings_free(struct pc_settings *s)
{
	pc_compat_free(&s->compat);
	pc_cfg_free(&pc_settings_table, s);
}

/* The config file named on the command line (--config F / --config=F) or in
 * PEERCACHE_CONFIG; NULL for none. Sets *missing when --config has no value. */
static const char *config_path(int argc, char *const *argv, bool *missing)
{
	const char *path = getenv("PEERCACHE_CONFIG");
	*missing = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--config") == 0) {
			if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
				*missing = true;
				return NULL;
			}
			path = argv[++i];
		} else if (strncmp(argv[i], "--config=", 9) == 0) {
			path = argv[i] + 9;
		}
	}
	return path && *path ? path : NULL;
}

static void warn_env(const char *var, void *arg)
{
	(void)arg;
	PC_LOGW("config", "ignoring unknown environment variable %s", var);
}

/* cluster_secret_file -> cluster_secret (one of the two, not both). */
static int load_secret_file(struct pc_settings *s, char *err, size_t errlen)
{
	if (!*s->cluster_secret_file)
		return 0;
	if (*s->cluster_secret) {
		snprintf(err, errlen, "cluster_secret_file: cluster_secret is "
			 "set too; set only one of them");
		return -EINVAL;
	}
	char secret[PC_SECRET_MAX + 1], why[PC_CFG_ERR_MAX - 32];
	int group = 0;
	int ret = pc_secret_read_file(s->cluster_secret_file, secret,
				      sizeof(secret), &group, why, sizeof(why));
	if (ret < 0) {
		snprintf(err, errlen, "cluster_secret_file: %s", why);
		return ret;
	}
	if (group)
		PC_LOGW("config", "cluster_secret_file %s is readable by its "
			"group: every member can act as a cluster node",
			s->cluster_secret_file);
	char *copy = strdup(secret);
	explicit_bzero(secret, sizeof(secret));
	if (!copy) {
		snprintf(err, errlen, "cluster_secret_file: out of memory");
		return -ENOMEM;
	}
	free(s->cluster_secret);
	s->cluster_secret = copy;
	return 0;
}

/* The staged aliases of the original's keys, once every source is read. */
static int apply_aliases(struct pc_settings *s, char *err, size_t errlen)
{
	struct pc_settings def;
	int ret = 0;
	if (s->compat && (ret = pc_settings_defaults(&def, err, errlen)) == 0) {
		ret = pc_compat_apply(s->compat, &pc_settings_table, s, &def,
				      err, errlen);
		pc_settings_free(&def);
	}
	pc_compat_free(&s->compat);
	return ret;
}

int pc_settings_load(struct pc_settings *s, int argc, char *const *argv,
		     char *const *envp, char *err, size_t errlen)
{
	int ret = pc_settings_defaults(s, err, errlen);
	if (ret < 0)
		return ret;
	bool missing;
	const char *path = config_path(argc, argv, &missing);
	if (missing) {
		snprintf(err, errlen, "command line: --config needs a file path");
		return -EINVAL;
	}
	if (path && (ret = pc_cfg_load_file(&pc_settings_table, s, path, err,
					    errlen)) < 0)
		return ret;
	/* Variables of the project's scripts, not settings. */
	static const char *const env_ignore[] = {
		"PEERCACHE_CONFIG", "PEERCACHE_BUILD_DIR", "PEERCACHE_TEST_ONLY",
		"PEERCACHE_TEST_LOG", NULL};
	ret = pc_cfg_load_env(&pc_settings_table, s, envp, env_ignore, warn_env,
			      NULL, err, errlen);
	if (ret < 0)
		return ret;
	static const char *const skip[] = {"config", NULL};
	ret = pc_cfg_parse_args(&pc_settings_table, s, argc, argv, skip, err,
				errlen);
	if (ret < 0 || (ret = apply_aliases(s, err, errlen)) < 0)
		return ret;
	return load_secret_file(s, err, errlen);
}

bool pc_settings_discovery_on(const struct pc_settings *s)
{
	return *s->discovery_addr || s->discovery_backend == PC_DISC_ETCD;
}

bool pc_host_is_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;
	if (strcasecmp(host, "localhost") == 0)
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return false;
}

/* ---- slot classes (slotmap's region) ---- */

#define SLOT_SIZE_MIN (4 * KB)
#define SLOT_SIZE_MAX (1 * GB)
#define SLOT_WAYS_MAX 64
#define SLOT_AUTO_TINY (16 * KB)
#define SLOT_AUTO_SMALL (256 * KB)
#define SLOT_FIELD_MAX 32

static const char slot_grammar[] = "auto, or SIZE:WAYS:SHARE,... with SIZE "
				   "4kb..1gb, WAYS 1..64, SHARE a percent "
				   "1%..100% or a bucket count";

static void slot_class_set(struct pc_settings *s, uint64_t size,
			   uint32_t ways, uint64_t buckets, uint32_t share_pm)
{
	s->slot_cls[s->slot_ncls++] = (struct pc_slot_class){
		.max_payload = size, .ways = ways, .buckets = buckets,
		.share_pm = share_pm};
}

/* Copy the field of item that ends at the next ':' (or the item's end)
 * into out; *p moves past it. -EINVAL when it does not fit. */
static int slot_field(const char **p, const char *end, char *out)
{
	const char *c = memchr(*p, ':', (size_t)(end - *p));
	const char *e = c ? c : end;
	size_t n = (size_t)(e - *p);
	if (n == 0 || n >= SLOT_FIELD_MAX)
		return -EINVAL;
	memcpy(out, *p, n);
	out[n] = '\0';
	*p = c ? c + 1 : end;
	return 0;
}

/* One SIZE:WAYS:SHARE item (no blanks inside) into s->slot_cls. Returns 0,
 * or -EINVAL with what is wrong in why. */
static int slot_item(struct pc_settings *s, const char *item, const char *end,
		     const char **why)
{
	char f[3][SLOT_FIELD_MAX];
	const char *p = item;
	for (int i = 0; i < 3; i++)
		if (slot_field(&p, end, f[i]) < 0 || (i < 2 && p == end)) {
			*why = "expected SIZE:WAYS:SHARE";
			return -EINVAL;
		}
	if (p != end) {
		*why = "expected SIZE:WAYS:SHARE (three fields)";
		return -EINVAL;
	}
	uint64_t size;
	int64_t ways, n;
	if (pc_parse_size(f[0], &size) < 0 || size < SLOT_SIZE_MIN ||
	    size > SLOT_SIZE_MAX) {
		*why = "SIZE is not a size within 4kb..1gb";
		return -EINVAL;
	}
	if (f[1][0] < '0' || f[1][0] > '9' || pc_parse_int(f[1], &ways) < 0 ||
	    ways < 1 || ways > SLOT_WAYS_MAX) {
		*why = "WAYS is not a whole number within 1..64";
		return -EINVAL;
	}
	size_t sl = strlen(f[2]);
	bool pct = f[2][sl - 1] == '%';
	if (pct)
		f[2][--sl] = '\0';
	if (f[2][0] < '0' || f[2][0] > '9' || pc_parse_int(f[2], &n) < 0 ||
	    n < 1 || (pct && n > 100) || (!pct && n > (1ll << 32))) {
		*why = pct ? "SHARE is not a whole percent within 1%..100%"
			   : "SHARE is not a percent (40%) or a bucket count "
			     "within 1..4294967296";
		return -EINVAL;
	}
	for (unsigned i = 0; i < s->slot_ncls; i++)
		if (s->slot_cls[i].max_payload == size) {
			*why = "two classes of one SIZE";
			return -EINVAL;
		}
	slot_class_set(s, size, (uint32_t)ways, pct ? 0 : (uint64_t)n,
		       pct ? (uint32_t)n * 10 : 0);
	return 0;
}

/* The slot_classes list: comma-separated items, blanks around each. */
static int slot_list(struct pc_settings *s, char *err, size_t errlen)
{
	const char *p = s->slot_classes, *why = NULL;
	unsigned idx = 0;
	uint32_t pm = 0;
	for (;;) {
		while (*p == ' ')
			p++;
		const char *end = p + strcspn(p, ",");
		const char *next = *end ? end + 1 : NULL;
		while (end > p && end[-1] == ' ')
			end--;
		idx++;
		if (s->slot_ncls == PC_SLOT_CLASSES_MAX)
			why = "more than 8 classes";
		else if (end == p || memchr(p, ' ', (size_t)(end - p)))
			why = "expected SIZE:WAYS:SHARE";
		else
			(void)slot_item(s, p, end, &why);
		if (why) {
			snprintf(err, errlen, "slot_classes: '%s': class %u "
				 "('%.*s'): %s (allowed: %s)", s->slot_classes,
				 idx, (int)PC_MIN(end - p, 40), p, why,
				 slot_grammar);
			return -EINVAL;
		}
		pm += s->slot_cls[s->slot_ncls - 1].share_pm;
		if (!next)
			break;
		p = next;
	}
	if (pm > 1000) {
		snprintf(err, errlen, "slot_classes: '%s': the percent shares "
			 "add up to %u%%, more than the region (at most 100%%)",
			 s->slot_classes, pm / 10);
		return -EINVAL;
	}
	return 0;
}

/* slot_num_buckets, slot_classes, slot_max_page_bytes and slot_ways ->
 * s->slot_cls (the rules in this file's header). */
static int slot_classes_derive(struct pc_settings *s, char *err,
			       size_t errlen)
{
	uint64_t max = s->slot_max_page_bytes;
	uint32_t ways = (uint32_t)s->slot_ways;
	bool is_auto = strcmp(s->slot_classes, "auto") == 0;
	s->slot_ncls = 0;
	memset(s->slot_cls, 0, sizeof(s->slot_cls));
	if (s->slot_num_buckets > 0) {
		if (!is_auto) {
			snprintf(err, errlen, "slot_num_buckets (%lld) and "
				 "slot_classes ('%s') are both set: "
				 "slot_num_buckets gives the one class of the "
				 "original's geometry, slot_classes a list; set "
				 "one of them (slot_classes = auto)",
				 (long long)s->slot_num_buckets,
				 s->slot_classes);
			return -EINVAL;
		}
		slot_class_set(s, max, ways, (uint64_t)s->slot_num_buckets, 0);
		return 0;
	}
	if (!is_auto)
		return slot_list(s, err, errlen);
	if (max > SLOT_AUTO_SMALL) {
		slot_class_set(s, SLOT_AUTO_TINY, ways, 0, 100);
		slot_class_set(s, SLOT_AUTO_SMALL, ways, 0, 350);
		slot_class_set(s, max, ways, 0, 550);
	} else if (max > SLOT_AUTO_TINY) {
		slot_class_set(s, SLOT_AUTO_TINY, ways, 0, 100);
		slot_class_set(s, max, ways, 0, 900);
	} else {
		slot_class_set(s, max, ways, 0, 1000);
	}
	return 0;
}

/* device_names: names, none twice, at most 8 (TP_RDMA_RAILS_MAX). */
static int device_names_check(const char *list, char *err, size_t errlen)
{
	char seen[8][64];
	unsigned n = 0;
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ",");
		const char *b = p, *e = p + len;
		while (b < e && *b == ' ')
			b++;
		while (e > b && e[-1] == ' ')
			e--;
		p += len + (p[len] == ',');
		if (b == e) {
			snprintf(err, errlen, "device_names: '%s' has an empty "
				 "name", list);
			return -EINVAL;
		}
		if ((size_t)(e - b) >= sizeof(seen[0]) || n == 8) {
			snprintf(err, errlen, "device_names: '%s': %s", list,
				 n == 8 ? "at most 8 devices (rails)"
					: "a name is too long");
			return -EINVAL;
		}
		snprintf(seen[n], sizeof(seen[n]), "%.*s", (int)(e - b), b);
		for (unsigned i = 0; i < n; i++)
			if (strcmp(seen[i], seen[n]) == 0) {
				snprintf(err, errlen, "device_names: '%s' "
					 "lists %s twice (one rail per device)",
					 list, seen[n]);
				return -EINVAL;
			}
		n++;
	}
	return 0;
}

int pc_settings_validate(struct pc_settings *s, char *err, size_t errlen)
{
	if (!pc_is_pow2((uint64_t)s->reactor_sq_entries)) {
		snprintf(err, errlen, "reactor_sq_entries: '%lld' is not a power "
			 "of two (allowed: 64, 128, ..., 32768)",
			 (long long)s->reactor_sq_entries);
		return -EINVAL;
	}
	if (!pc_is_pow2((uint64_t)s->reactor_buf_count)) {
		snprintf(err, errlen, "reactor_buf_count: '%lld' is not a power "
			 "of two (allowed: 16, 32, ..., 32768)",
			 (long long)s->reactor_buf_count);
		return -EINVAL;
	}
	int ret = slot_classes_derive(s, err, errlen);
	if (ret < 0)
		return ret;
	if (s->mode == PC_MODE_SLOTMAP && s->disk_enabled) {
		snprintf(err, errlen, "disk_enabled: the disk tier is not "
			 "supported in slotmap mode (its pages live only in the "
			 "slot region, as in the original); set disk_enabled = "
			 "false or mode = p2p");
		return -EINVAL;
	}
	if (*s->metrics_bind && !pc_host_is_loopback(s->metrics_bind) &&
	    !*s->cluster_secret) {
		snprintf(err, errlen, "metrics_bind: '%s' is not a loopback "
			 "address; serving metrics beyond loopback takes the "
			 "same opt-in as bind: a cluster_secret (allowed "
			 "without it: 127.0.0.0/8, ::1, localhost)",
			 s->metrics_bind);
		return -EINVAL;
	}
	ret = device_names_check(s->device_names, err, errlen);
	if (ret < 0)
		return ret;
	if (*s->discovery_addr && *s->peers) {
		snprintf(err, errlen, "peers and discovery_addr are both set: "
			 "membership is either the static peers list or what "
			 "discovery finds; set one of them");
		return -EINVAL;
	}
	if (s->discovery_backend == PC_DISC_ETCD) {
		const char *why = !*s->etcd_endpoints
			? "discovery_backend = etcd needs etcd_endpoints "
			  "(host:port of etcd's client URL, comma-separated)"
			: *s->peers ? "discovery_backend = etcd and peers are "
				      "both set: set one of them"
			: *s->discovery_addr
			? "discovery_addr names the embedded backend's "
			  "masters; with discovery_backend = etcd leave it "
			  "empty"
			: NULL;
		if (why) {
			snprintf(err, errlen, "%s", why);
			return -EINVAL;
		}
	} else if (*s->etcd_endpoints) {
		snprintf(err, errlen, "etcd_endpoints is set but "
			 "discovery_backend is embedded: set "
			 "discovery_backend = etcd (or clear etcd_endpoints)");
		return -EINVAL;
	}
	if (*s->discovery_addr &&
	    s->member_ttl_ms < 3 * s->heartbeat_interval_ms) {
		snprintf(err, errlen, "member_ttl (%llu ms) must be at least 3 "
			 "heartbeat_interval (%llu ms): a member would be "
			 "dropped after fewer than 3 missed heartbeats",
			 (unsigned long long)s->member_ttl_ms,
			 (unsigned long long)s->heartbeat_interval_ms);
		return -EINVAL;
	}
	if (!pc_host_is_loopback(s->bind) && !*s->cluster_secret) {
		snprintf(err, errlen, "bind: '%s' is not a loopback address; "
			 "a node listening beyond loopback needs "
			 "cluster_secret (allowed without it: 127.0.0.0/8, ::1, "
			 "localhost)", s->bind);
		return -EINVAL;
	}
	if (s->disk_enabled) {
		if (!*s->disk_path) {
			snprintf(err, errlen, "disk_path: empty; the disk tier "
				 "(disk_enabled) needs a directory to keep its "
				 "store in");
			return -EINVAL;
		}
		if (s->disk_region_size % (4 * KB)) {
			snprintf(err, errlen, "disk_region_size: %llu is not a "
				 "multiple of 4kb",
				 (unsigned long long)s->disk_region_size);
			return -EINVAL;
		}
		if (s->disk_size / s->disk_region_size < 2) {
			snprintf(err, errlen, "disk_size: %llu bytes is less "
				 "than two regions of disk_region_size (%llu); "
				 "the disk tier needs at least %llu",
				 (unsigned long long)s->disk_size,
				 (unsigned long long)s->disk_region_size,
				 2ull * s->disk_region_size);
			return -EINVAL;
		}
	}

	return 0;
}

void pc_settings_warn_inactive(const struct pc_settings *s)
{
	static const char *const slot_keys[] = {
		"slot_max_page_bytes", "slot_ways", "slot_num_buckets",
		"slot_classes"};
	struct pc_settings def;
	char err[PC_CFG_ERR_MAX];
	if (pc_settings_defaults(&def, err, sizeof(err)) < 0)
		return;
	bool listed = strcmp(s->slot_classes, "auto") != 0;
	for (size_t i = 0; i < PC_ARRAY_LEN(slot_keys); i++) {
		const struct pc_cfg_key *k =
			pc_cfg_find(&pc_settings_table, slot_keys[i]);
		if (!k || !pc_cfg_differs(k, s, &def))
			continue;
		if (s->mode != PC_MODE_SLOTMAP)
			PC_LOGW("config", "%s is set but has no effect: it "
				"shapes the slot region of mode = slotmap, and "
				"this node runs mode = p2p", k->name);
		else if (listed && i < 2) /* the sizes and ways' keys */
			PC_LOGW("config", "%s is set but has no effect: "
				"slot_classes lists the classes (their sizes "
				"and ways)", k->name);
	}
	pc_settings_free(&def);
}
