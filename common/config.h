/*
 * common/config.h — a table-driven configuration engine.
 *
 * Owns: parsing and validation of typed settings from four sources, in order
 * of precedence (later wins): built-in defaults < config file < PEERCACHE_*
 * environment < command line. The caller owns the settings struct; the key
 * table says where each value lives in it (offsetof) and what is allowed.
 * Thread-safety: none needed — configuration is loaded once on the main thread
 * before any reactor starts, then read-only.
 *
 * Every error is one line naming the source, the key, the value and what is
 * allowed, e.g.
 *   command line: rpc_port: '70000' is out of range (allowed: 0..65535)
 *   /etc/peercache/peercached.conf:12: disk_size: '10 parsecs' is not a size
 *     (allowed: a whole number with an optional unit b, k/kb/kib, m/mb/mib, ...)
 * The caller prints it and exits non-zero.
 */
#ifndef PC_COMMON_CONFIG_H
#define PC_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum pc_cfg_type {
	PC_CFG_BOOL,     /* bool: 1/0, true/false, yes/no, on/off (any case) */
	PC_CFG_INT,      /* int64_t within [min, max] */
	PC_CFG_SIZE,     /* uint64_t bytes: "4gb", "512MiB", "65536"; binary units */
	PC_CFG_DURATION, /* uint64_t milliseconds: "2s", "500ms", "1.5s", "2" (= s) */
	PC_CFG_STRING,   /* char * (heap, owned by the settings); max = max length */
	PC_CFG_ENUM,     /* int: index into choices[] */
};

/* Key flags. */
#define PC_CFG_SECRET 0x1u /* never printed by pc_cfg_dump (shown as "***") */

struct pc_cfg_key {
	const char *name;        /* canonical, snake_case: "rpc_port" */
	enum pc_cfg_type type;   /* how the text value is parsed */
	const char *def;         /* default as text; parsed like any other value */
	int64_t min;             /* INT/SIZE/DURATION: inclusive bounds */
	int64_t max;             /*   (SIZE/DURATION in bytes/ms); STRING: max len */
	const char *const *choices; /* ENUM: NULL-terminated allowed values */
	size_t offset;           /* offsetof(settings struct, field) */
	unsigned flags;          /* PC_CFG_SECRET, ... */
	const char *help;        /* one line for --help */
};

/* A heading in the sample configuration, printed before key first_key:
 * title, then note (wrapped; may be NULL). */
struct pc_cfg_section {
	const char *first_key;
	const char *title;
	const char *note;
};

struct pc_cfg_table {
	const struct pc_cfg_key *keys;
	size_t n;
	/* Optional: offered every name that is not in keys[] (normalized:
	 * lowercase, '_'), from any source, before it is an unknown key.
	 * value is NULL for a command-line option given alone. Returns 0,
	 * -ENOENT (not an alias either) or another -errno with err set. */
	int (*alias)(void *settings, const char *name, const char *value,
		     const char *origin, char *err, size_t errlen);
	/* Optional, NULL-terminated (first_key NULL): the sample's headings. */
	const struct pc_cfg_section *sections;
};

/*
 * Print the annotated sample configuration: intro (comment lines, may be
 * NULL), then every key of the table in order under its section's heading:
 * its help and allowed values as comments and "#key = default" (commented
 * out, so the file pins nothing: an upgrade's new defaults apply).
 */
void pc_cfg_print_sample(const struct pc_cfg_table *t, const char *intro,
			 FILE *out);

/* Size of the error buffer callers should pass. */
#define PC_CFG_ERR_MAX 512

/*
 * Fill every field of settings from the defaults. Fails (returns -EINVAL with
 * err set) only when a default in the table itself is invalid — a bug the
 * unit tests catch.
 */
int pc_cfg_defaults(const struct pc_cfg_table *t, void *settings, char *err,
		    size_t errlen);

/*
 * Set one key from text. name may use dashes or underscores and any case
 * ("rpc-port", "RPC_PORT"). origin names the source for the error line
 * ("command line", "environment PEERCACHE_RPC_PORT", "file.conf:12").
 * Returns 0, -ENOENT for an unknown key (err suggests the closest key when
 * one is close), or -EINVAL for a bad value.
 */
int pc_cfg_set(const struct pc_cfg_table *t, void *settings, const char *name,
	       const char *value, const char *origin, char *err, size_t errlen);

/* Find a key by name (dashes/underscores/case-insensitive); NULL if unknown. */
const struct pc_cfg_key *pc_cfg_find(const struct pc_cfg_table *t,
				     const char *name);

/*
 * Load "key = value" lines from a file. '#' starts a comment (at line start or
 * after whitespace); values may be double-quoted to hold '#' or spaces; blank
 * lines are ignored. Any unknown key or bad value is an error ("path:line: ...").
 * Returns 0 or a negative errno (-ENOENT/-EACCES for an unreadable file).
 */
int pc_cfg_load_file(const struct pc_cfg_table *t, void *settings,
		     const char *path, char *err, size_t errlen);

/*
 * Apply PEERCACHE_<KEY> variables from envp (NULL-terminated, like environ).
 * Names in ignore[] (NULL-terminated, e.g. "PEERCACHE_CONFIG") are skipped.
 * An unknown PEERCACHE_* variable is not an error: warn(name, arg) is called
 * for it (warn may be NULL). A bad value is an error.
 */
int pc_cfg_load_env(const struct pc_cfg_table *t, void *settings,
		    char *const *envp, const char *const *ignore,
		    void (*warn)(const char *var, void *arg), void *warn_arg,
		    char *err, size_t errlen);

/*
 * Apply "--key value" / "--key=value" arguments (argv[0] is skipped). A BOOL
 * key given alone ("--metrics-enabled" followed by another option or nothing)
 * means true. Options in skip[] (NULL-terminated, e.g. "config") are consumed
 * with their value and otherwise ignored — the caller handles them. A
 * positional argument or unknown option is an error.
 */
int pc_cfg_parse_args(const struct pc_cfg_table *t, void *settings, int argc,
		      char *const *argv, const char *const *skip, char *err,
		      size_t errlen);

/* Print one line per key for --help: "  --rpc-port N   help [default: 31999]". */
void pc_cfg_print_help(const struct pc_cfg_table *t, FILE *out);

/* Print the effective settings as "key = value" lines (a valid config file);
 * SECRET keys print as "***" when set. */
void pc_cfg_dump(const struct pc_cfg_table *t, const void *settings, FILE *out);

/* Bytes that hold any value's text: a STRING of up to 4095 bytes, every
 * byte escaped, in quotes, and the NUL. */
#define PC_CFG_TEXT_MAX 8448
/* Key k's value in settings as pc_cfg_dump prints it (config-file syntax:
 * strings quoted when needed; a SECRET key that is set is "***"). Longer
 * than len - 1 bytes is cut. */
void pc_cfg_format(const struct pc_cfg_key *k, const void *settings,
		   char *buf, size_t len);
/* fn(arg, key, value text as pc_cfg_format gives it) for every key, in
 * table order: the one walk behind pc_cfg_dump and the node's node.config. */
void pc_cfg_each(const struct pc_cfg_table *t, const void *settings,
		 void (*fn)(void *arg, const struct pc_cfg_key *k,
			    const char *value),
		 void *arg);

/* True when key k holds a different value in settings a and b. */
bool pc_cfg_differs(const struct pc_cfg_key *k, const void *a, const void *b);

/* Free heap strings held by STRING fields and zero them. */
void pc_cfg_free(const struct pc_cfg_table *t, void *settings);

/* The value parsers, exported for other users (RPC params, tools). Each
 * returns 0 or -EINVAL (-ERANGE on overflow). */
int pc_parse_bool(const char *s, bool *out);
int pc_parse_int(const char *s, int64_t *out);
int pc_parse_size(const char *s, uint64_t *out);
int pc_parse_duration_ms(const char *s, uint64_t *out);

/* Command lines: "--name VALUE" or "--name=VALUE" at argv[*i] (advancing *i
 * past a separate VALUE); NULL if argv[*i] is not this option, or when the
 * value is absent (*missing is then set). */
const char *pc_opt_value(int argc, char **argv, int *i, const char *name,
			 bool *missing);

/* Format bytes with the largest exact binary unit ("4gb", "1536kb", "100"). */
void pc_format_size(uint64_t bytes, char *buf, size_t len);

#endif /* PC_COMMON_CONFIG_H */
