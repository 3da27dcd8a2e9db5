/*
 * common/compat.c — the original PeerCache's setting names (see compat.h).
 *
 * Owns: the alias table and struct pc_compat, the per-row staged values (heap
 * strings, freed by pc_compat_free). Threads: main thread, while settings
 * load. Invariants: a row holds at most one staged value (a later source
 * replaces an earlier one, so the usual precedence holds); nothing reaches
 * the settings before pc_compat_apply, which logs each row once per load.
 *
 * The rows come from the original's config.py allow-list, its
 * peercache-storage-server options and its environment
 * (docs/migration.md); keys whose name is ours too (discovery_addr, vnodes,
 * disk_path, ...) need no row.
 */
#include "compat.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "util.h"

#define LOG_MOD "config"
#define COMPAT_ORIGIN_MAX 320

static const char one_bind[] =
	"one listen address for the rpc, data and meta ports";

/* name, ours, conv, check, min, max, choices, note */
const struct pc_compat_alias pc_compat_aliases[] = {
	{"global_segment_size", "pool_size", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 "publish pool bytes; the original divided it by tp_size per rank, "
	 "a node here holds one pool for all ranks of the host"},
	{"local_hostname", "advertise_host", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 "the address other nodes reach this one at"},
	{"control_port", "rpc_port", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 "control-plane RPC port (0 = pick a free one)"},
	{"rdma_port", "data_port", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 "data-plane listener: TCP, and rdma_cm on the same port number when "
	 "the node runs RDMA (0 = pick a free one)"},
	{"control_bind_host", "bind", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 one_bind},
	{"rdma_bind_host", "bind", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 one_bind},
	{"meta_bind_host", "bind", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 one_bind},
	{"metrics_bind_host", "metrics_bind", PC_COMPAT_SAME, 0, 0, 0, NULL,
	 "metrics HTTP listen address"},
	{"no_disk", "disk_enabled", PC_COMPAT_NOT, 0, 0, 0, NULL,
	 "peercache-storage-server --no-disk"},
	{"role", NULL, 0, PC_COMPAT_CHOICE, 0, 0, "auto,inference,storage",
	 "every node here both serves and stores pages"},
	{"write_policy", NULL, 0, PC_COMPAT_CHOICE, 0, 0, "local,storage,both",
	 "hybrid mode is not in this version: pages are published in the "
	 "writer's own node (the original's 'local')"},
	{"prefix", NULL, 0, PC_COMPAT_ANY, 0, 0, NULL,
	 "the key namespace is a client setting: put prefix in SGLang's "
	 "extra config, which the shim honours"},
};
const size_t pc_compat_aliases_n = PC_ARRAY_LEN(pc_compat_aliases);

struct pc_compat {
	char *value[PC_ARRAY_LEN(pc_compat_aliases)];
	char origin[PC_ARRAY_LEN(pc_compat_aliases)][COMPAT_ORIGIN_MAX];
};

const struct pc_compat_alias *pc_compat_find(const char *name)
{
	for (size_t i = 0; i < pc_compat_aliases_n; i++)
		if (strcmp(pc_compat_aliases[i].name, name) == 0)
			return &pc_compat_aliases[i];
	return NULL;
}

static bool compat_target_is_bool(const struct pc_cfg_table *t,
				  const struct pc_compat_alias *a)
{
	const struct pc_cfg_key *k = a->ours ? pc_cfg_find(t, a->ours) : NULL;
	return k && k->type == PC_CFG_BOOL;
}

int pc_compat_stage(struct pc_compat **state, const struct pc_cfg_table *t,
		    const char *name, const char *value, const char *origin,
		    char *err, size_t errlen)
{
	const struct pc_compat_alias *a = pc_compat_find(name);
	if (!a)
		return -ENOENT;
	if (!value) {
		if (!compat_target_is_bool(t, a)) {
			snprintf(err, errlen, "%s: %s needs a value", origin,
				 a->name);
			return -EINVAL;
		}
		value = "true";
	}
	if (!*state && !(*state = calloc(1, sizeof(**state))))
		return -ENOMEM;
	size_t i = (size_t)(a - pc_compat_aliases);
	char *copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	free((*state)->value[i]);
	(*state)->value[i] = copy;
	snprintf((*state)->origin[i], COMPAT_ORIGIN_MAX, "%s", origin);
	return 0;
}

/* A no-effect key's value must still be one the original accepted. */
static const char *compat_check(const struct pc_compat_alias *a, const char *v)
{
	int64_t n;
	switch (a->check) {
	case PC_COMPAT_ANY:
		return NULL;
	case PC_COMPAT_INT:
		return pc_parse_int(v, &n) < 0 || n < a->min || n > a->max
			       ? "is not an integer in range"
			       : NULL;
	case PC_COMPAT_CHOICE: {
		size_t len = strlen(v);
		for (const char *c = a->choices; c && *c;) {
			size_t cl = strcspn(c, ",");
			if (cl == len && strncasecmp(c, v, len) == 0)
				return NULL;
			c += cl + (c[cl] == ',');
		}
		return "is not one of the original's choices";
	}
	}
	return NULL;
}

/* A no-effect key: check it, log it. */
static int compat_no_effect(const struct pc_compat_alias *a, const char *v,
			    const char *origin, char *err, size_t errlen)
{
	const char *why = compat_check(a, v);
	if (why) {
		char range[64] = "";
		if (a->check == PC_COMPAT_INT)
			snprintf(range, sizeof(range), "%lld..%lld", a->min,
				 a->max);
		snprintf(err, errlen, "%s: %s: '%.64s' %s (allowed: %s)",
			 origin, a->name, v, why,
			 a->check == PC_COMPAT_INT ? range : a->choices);
		return -EINVAL;
	}
	PC_LOGW(LOG_MOD, "accepted for compatibility, no effect: %s = %.64s "
		"(%s): %s", a->name, v, origin, a->note);
	return 0;
}

/* The earlier staged row that targets the same key as row i, or -1. */
static long compat_earlier(const struct pc_compat *st, size_t i)
{
	for (size_t j = 0; j < i; j++)
		if (st->value[j] && pc_compat_aliases[j].ours &&
		    strcmp(pc_compat_aliases[j].ours,
			   pc_compat_aliases[i].ours) == 0)
			return (long)j;
	return -1;
}

static int compat_apply_row(const struct pc_compat *st, size_t i,
			    const struct pc_cfg_table *t, void *settings,
			    const void *defaults, char *err, size_t errlen)
{
	const struct pc_compat_alias *a = &pc_compat_aliases[i];
	const char *v = st->value[i], *origin = st->origin[i];
	long j = compat_earlier(st, i);
	if (j >= 0) {
		if (strcmp(st->value[j], v) != 0)
			PC_LOGW(LOG_MOD, "%s = %.64s (%s) ignored: %s = %.64s "
				"sets %s (the first alias in the table wins)",
				a->name, v, origin, pc_compat_aliases[j].name,
				st->value[j], a->ours);
		return 0;
	}
	const struct pc_cfg_key *k = pc_cfg_find(t, a->ours);
	PC_ASSERT(k); /* the unit tests check every row's target */
	if (pc_cfg_differs(k, settings, defaults)) {
		PC_LOGW(LOG_MOD, "%s = %.64s (%s) ignored: %s is set too, and "
			"our key wins", a->name, v, origin, k->name);
		return 0;
	}
	const char *text = v;
	if (a->conv == PC_COMPAT_NOT) {
		bool b;
		if (pc_parse_bool(v, &b) < 0) {
			snprintf(err, errlen, "%s: %s: '%.64s' is not a boolean "
				 "(allowed: 1/0, true/false, yes/no, on/off)",
				 origin, a->name, v);
			return -EINVAL;
		}
		text = b ? "false" : "true";
	}
	char inner[PC_CFG_ERR_MAX];
	int r = pc_cfg_set(t, settings, k->name, text, origin, inner,
			   sizeof(inner));
	if (r < 0) {
		snprintf(err, errlen, "%.400s (given as %s)", inner, a->name);
		return r;
	}
	PC_LOGI(LOG_MOD, "%s = %.64s (%s) sets %s = %s", a->name, v, origin,
		k->name, text);
	return 0;
}

int pc_compat_apply(const struct pc_compat *st, const struct pc_cfg_table *t,
		    void *settings, const void *defaults, char *err,
		    size_t errlen)
{
	for (size_t i = 0; st && i < pc_compat_aliases_n; i++) {
		if (!st->value[i])
			continue;
		int r = pc_compat_aliases[i].ours
				? compat_apply_row(st, i, t, settings, defaults,
						   err, errlen)
				: compat_no_effect(&pc_compat_aliases[i],
						   st->value[i], st->origin[i],
						   err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

void pc_compat_free(struct pc_compat **state)
{
	if (!*state)
		return;
	for (size_t i = 0; i < pc_compat_aliases_n; i++)
		free((*state)->value[i]);
	free(*state);
	*state = NULL;
}
