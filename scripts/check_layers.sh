#!/usr/bin/env bash
# scripts/check_layers.sh — the layering rules that a compiler does not check.
#
# Usage: scripts/check_layers.sh BUILD_DIR
#
#   1. Includes point down only: common <- reactor <- rpc <- storage/modules
#      <- server (docs/architecture.md); reactor/ names no module concept
#      (pool, transport, directory, kv, services, the module lifecycle).
#   2. Inside reactor/ no file calls "up": ops.c and timer.c call no other
#      reactor file, conn.c, io.c and listen.c do not call loop.c (the graph
#      at the head of reactor/ops.c). Checked on BUILD_DIR's objects.
#   3. Every name an object exports carries its owner's prefix (per folder,
#      per file in bench/).
# Names the compiler makes (__odr_asan.*, ...) are not ours and are skipped.
# Prints each violation and exits 1 if there is any; ctest runs it (layers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: check_layers.sh BUILD_DIR}
cd "$root"
bad=0
fail() { echo "check_layers: $*" >&2; bad=1; }

# ---------------------------------------------------------------- 1. includes
allowed_includes() {
	case $1 in
	common) echo "common" ;;
	reactor) echo "common reactor" ;;
	rpc) echo "common reactor rpc" ;;
	storage) echo "common storage" ;;
	modules) echo "common reactor rpc storage modules" ;;
	esac
}
for dir in common reactor rpc storage modules; do
	ok=" $(allowed_includes $dir) "
	while IFS=: read -r file line inc; do
		top=${inc#*\"}
		top=${top%%/*}
		[[ $ok == *" $top "* ]] ||
			fail "$file:$line includes $top/ (a $dir/ file may include: $ok)"
	done < <(grep -rnoE '#include "[a-z_]+/' "$dir" --include='*.[ch]' || true)
done
while IFS= read -r hit; do
	fail "reactor/ names a concept above it: $hit"
done < <(grep -rnIiE '\b(pools?|transports?|tp_[a-z]+|dir_[a-z]+|kv_[a-z]+|directory|svc_[a-z]+|pc_ctx|pc_modules?|services?_[a-z]+)\b' reactor || true)

# ------------------------------------------------------- 2. reactor call graph
objs="$build/reactor/CMakeFiles/pc_reactor.dir"
[[ -f $objs/ops.c.o ]] || { echo "check_layers: no $objs/ops.c.o (build first)" >&2; exit 2; }
defined() { nm -g --defined-only "$objs/$1.c.o" | awk 'NF == 3 {print $3}' | sort; }
used() { nm -u "$objs/$1.c.o" | awk '{print $NF}' | sort; }
calls() { comm -12 <(used "$1") <(defined "$2") | tr '\n' ' '; }
# "file: the files it must not call"
for rule in "ops: loop conn io listen group timer" \
	"timer: loop conn io listen group ops" \
	"conn: loop group" "io: loop group" "listen: loop group"; do
	from=${rule%%:*}
	for to in ${rule#*:}; do
		c=$(calls "$from" "$to")
		[[ -z $c ]] || fail "reactor/$from.c calls up into $to.c: $c"
	done
done

# --------------------------------------------------------- 3. exported names
prefixes_of() { # object path (relative to the build dir) -> allowed prefixes
	case $1 in
	common/*/sdnotify.c.o) echo "pc_sd_" ;;
	common/*) echo "pc_ met_" ;;
	reactor/*) echo "rx_" ;;
	rpc/*/mp.c.o) echo "mp_" ;;
	rpc/*) echo "rpc_" ;;
	storage/*/pool*.c.o) echo "pool_" ;;
	storage/*/ring.c.o) echo "ring_" ;;
	modules/*/module.c.o) echo "pc_ctx_ pc_modules_" ;;
	modules/*/services.c.o) echo "svc_" ;;
	modules/*/http_parse.c.o) echo "http_" ;;
	modules/*/dashboard_html.c.o) echo "pc_dashboard_" ;;
	modules/*/tier.c.o) echo "tier_" ;;
	modules/*/copier.c.o) echo "copier_" ;;
	modules/*/walk.c.o) echo "walk_" ;;
	modules/*/session_req.c.o) echo "sess_req_" ;;
	modules/*/spread.c.o) echo "pc_spread_" ;;
	modules/*/discovery*.c.o) echo "pc_mod_ disc_" ;;
	modules/*/etcd_wire.c.o) echo "etcd_" ;;
	modules/*/transport*.c.o) echo "tp_ pc_mod_" ;;
	modules/*/rdma_verbs.c.o) echo "rv_" ;;
	modules/*/disk*.c.o) echo "pc_mod_ disk_" ;;
	modules/*/placement_wire.c.o) echo "pl_" ;;
	modules/*/read_cache.c.o) echo "rc_" ;;
	modules/*/slotmap*.c.o) echo "pc_mod_ sm_" ;;
	modules/*) echo "pc_mod_" ;;
	# test builds: the allocation wraps (server/fault_alloc.h)
	server/*/fault_alloc.c.o) echo "pc_fault_alloc_ __wrap_" ;;
	server/*) echo "pc_ main" ;;
	# the CLI's own files share cli_* names (client/cli.h)
	client/*/peercache.dir/*) echo "cli_ main" ;;
	client/*) echo "pcache_ main" ;;
	bench/*/lg_*.c.o) echo "lg_" ;;
	bench/*/p2p_wire.c.o) echo "wire_" ;;
	bench/*/p2p_setup.c.o) echo "setup_" ;;
	bench/*/p2p_targets.c.o) echo "target_" ;;
	bench/*/p2p_sink.c.o) echo "sink_" ;;
	bench/tool/*/report.c.o | bench/tool/*/json.c.o | bench/tool/*/compare.c.o) echo "pcb_" ;;
	bench/tool/*/net.c.o) echo "pcb_net_" ;;
	bench/tool/*/be_redis.c.o) echo "pcb_be_redis" ;;
	bench/tool/*/be_memcached.c.o) echo "pcb_be_memcached" ;;
	bench/tool/*) echo "pcb_ main" ;;
	# an LD_PRELOAD allocation counter: interposing is its job
	bench/*/alloc_count.c.o) echo "malloc calloc realloc free aligned_alloc memalign posix_memalign" ;;
	bench/*) echo "main" ;;
	*) echo "" ;;
	esac
}
cd "$build"
while IFS= read -r obj; do
	obj=${obj#./}
	# Objects of sources that no longer exist (moved or removed files)
	# stay in a build tree until it is cleaned: skip them.
	src=${obj%.o}
	src="$(dirname "$(dirname "$(dirname "$src")")")/$(basename "$src")"
	[[ -f $root/$src || -f $src ]] || continue
	pre=$(prefixes_of "$obj")
	[[ -n $pre ]] || continue
	while IFS= read -r sym; do
		okp=0
		for p in $pre; do
			[[ $sym == "$p"* ]] && okp=1
		done
		((okp)) || fail "$obj exports '$sym' (expected a prefix of: $pre)"
	done < <(nm -g --defined-only "$obj" | awk 'NF == 3 && $3 !~ /^__/ {print $3}')
done < <(find common reactor rpc storage modules server client bench \
	-name '*.o' -path '*CMakeFiles*' 2>/dev/null | sort)

if ((bad)); then
	exit 1
fi
echo "check_layers: includes, the reactor's call graph and exported names are in order"
