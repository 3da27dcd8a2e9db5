/*
 * common/compat.h — the original PeerCache's setting names, as aliases.
 *
 * Owns: the alias table (one row per key of the original that is not one of
 * ours: its name, our key or none, the conversion, a note) and the values
 * staged for it while settings load. An original config file, its
 * PEERCACHE_* environment and its launch-line options therefore start a node:
 * an alias that maps to one of our keys sets it, one without effect here is
 * logged once ("accepted for compatibility, no effect: ..."), never an error.
 * Threading: main thread, while settings load (before any reactor starts).
 *
 * Rules (docs/migration.md):
 *   - aliases are staged while the file, the environment and the command line
 *     are read (the usual precedence picks each alias's value), then applied
 *     once, after all three;
 *   - our key wins: an alias is ignored, with a warning, when our key is set
 *     to a value other than its default;
 *   - several aliases of one key (control_bind_host, rdma_bind_host,
 *     meta_bind_host -> bind): the first row of the table that is set wins;
 *     the others are ignored, with a warning when their value differs.
 */
#ifndef PC_COMMON_COMPAT_H
#define PC_COMMON_COMPAT_H

#include <stddef.h>

#include "config.h"

struct pc_compat; /* staged alias values, owned by struct pc_settings */

enum pc_compat_conv {
	PC_COMPAT_SAME,   /* our key parses the value as the original did */
	PC_COMPAT_NOT,    /* a bool that means the opposite of ours (no_disk) */
};

/* What a no-effect key must still look like (a typo stays an error). */
enum pc_compat_check {
	PC_COMPAT_ANY,
	PC_COMPAT_INT,      /* integer within [min, max] */
	PC_COMPAT_CHOICE,   /* one of choices (comma-separated) */
};

struct pc_compat_alias {
	const char *name;          /* the original's key, normalized */
	const char *ours;          /* our key, or NULL: accepted, no effect */
	enum pc_compat_conv conv;  /* when ours != NULL */
	enum pc_compat_check check; /* when ours == NULL */
	long long min, max;        /* PC_COMPAT_INT */
	const char *choices;       /* PC_COMPAT_CHOICE: "a,b,c" */
	const char *note;          /* why / what it does here (logs, docs) */
};

extern const struct pc_compat_alias pc_compat_aliases[];
extern const size_t pc_compat_aliases_n;

/* The row for a normalized name (lowercase, '_'), or NULL. */
const struct pc_compat_alias *pc_compat_find(const char *name);

/*
 * Stage value for the alias name (normalized). *state is allocated on first
 * use; the caller frees it with pc_compat_free. A NULL value (a command-line
 * option given alone) means "true" for an alias of a bool and is an error for
 * any other. Returns 0, -ENOENT when name is not an alias, -EINVAL (err set)
 * for a missing value, -ENOMEM.
 */
int pc_compat_stage(struct pc_compat **state, const struct pc_cfg_table *t,
		    const char *name, const char *value, const char *origin,
		    char *err, size_t errlen);

/*
 * Apply the staged aliases to settings (defaults: the same table's defaults,
 * to tell "our key is set" from "left at its default"), logging each applied
 * alias, each no-effect key and each conflict once. Returns 0 or -EINVAL
 * with one error line naming where the bad value came from.
 */
int pc_compat_apply(const struct pc_compat *state,
		    const struct pc_cfg_table *t, void *settings,
		    const void *defaults, char *err, size_t errlen);

void pc_compat_free(struct pc_compat **state);

#endif /* PC_COMMON_COMPAT_H */
