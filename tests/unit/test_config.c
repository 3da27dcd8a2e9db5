/*
 * tests/unit/test_config.c — unit tests for common/config.c.
 *
 * Owns: a test key table covering every value type and a settings struct that
 * each test fills from defaults (fixture) and frees afterwards, so ASan's leak
 * check also covers the engine's string handling. Criterion runs every test
 * in its own process; the file-scope fixture is per test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/settings.h"
#include "tests/unit/testutil.h"

struct tcfg {
	bool metrics_enabled;
	bool prefetch;
	int64_t rpc_port;
	int64_t weight;
	uint64_t cache_size;
	uint64_t chunk_size;
	uint64_t heartbeat_interval_ms;
	char *node_name;
	char *auth_token;
	int mode;
};

static const char *const modes[] = {"p2p", "slotmap", NULL};

#define TB (1ll << 40)

static const struct pc_cfg_key keys[] = {
	{"metrics_enabled", PC_CFG_BOOL, "false", 0, 0, NULL,
	 offsetof(struct tcfg, metrics_enabled), 0, "serve /metrics"},
	{"prefetch", PC_CFG_BOOL, "on", 0, 0, NULL,
	 offsetof(struct tcfg, prefetch), 0, "prefetch neighbours"},
	{"rpc_port", PC_CFG_INT, "31999", 0, 65535, NULL,
	 offsetof(struct tcfg, rpc_port), 0, "RPC listen port"},
	{"weight", PC_CFG_INT, "-5", -100, 100, NULL,
	 offsetof(struct tcfg, weight), 0, "placement weight"},
	{"cache_size", PC_CFG_SIZE, "64mb", 4096, TB, NULL,
	 offsetof(struct tcfg, cache_size), 0, "memory pool size"},
	{"chunk_size", PC_CFG_SIZE, "0", 0, INT64_MAX, NULL,
	 offsetof(struct tcfg, chunk_size), 0, "chunk size, 0 = auto"},
	{"heartbeat_interval", PC_CFG_DURATION, "2.0", 1, 3600000, NULL,
	 offsetof(struct tcfg, heartbeat_interval_ms), 0, "peer heartbeat"},
	{"node_name", PC_CFG_STRING, "node-a", 0, 16, NULL,
	 offsetof(struct tcfg, node_name), 0, "name of this node"},
	{"auth_token", PC_CFG_STRING, "", 0, 64, NULL,
	 offsetof(struct tcfg, auth_token), PC_CFG_SECRET, "shared secret"},
	{"mode", PC_CFG_ENUM, "p2p", 0, 0, modes, offsetof(struct tcfg, mode),
	 0, "directory mode"},
};

static const struct pc_cfg_table table = {keys, sizeof(keys) / sizeof(keys[0]),
					   NULL, NULL};

static struct tcfg c;
static char err[PC_CFG_ERR_MAX];

static void setup(void)
{
	memset(&c, 0xa5, sizeof(c)); /* defaults must not trust old contents */
	err[0] = '\0';
	cr_assert_eq(pc_cfg_defaults(&table, &c, err, sizeof(err)), 0, "%s",
		     err);
}

static void teardown(void)
{
	pc_cfg_free(&table, &c);
}

#define assert_has(hay, needle)                                                \
	cr_assert(strstr((hay), (needle)) != NULL, "'%s' lacks '%s'", (hay),   \
		  (needle))
#define assert_lacks(hay, needle)                                              \
	cr_assert(strstr((hay), (needle)) == NULL, "'%s' has '%s'", (hay),     \
		  (needle))

/* Set through the public API with a fixed origin; returns the result. */
static int set(const char *name, const char *value)
{
	err[0] = '\0';
	return pc_cfg_set(&table, &c, name, value, "test", err, sizeof(err));
}

/* A value error must be -EINVAL, one line, naming origin, key and "allowed". */
static void expect_bad(const char *name, const char *value, const char *what)
{
	cr_assert_eq(set(name, value), -EINVAL, "%s='%s' accepted", name,
		     value);
	assert_has(err, "test: ");
	assert_has(err, pc_cfg_find(&table, name)->name);
	assert_has(err, "(allowed: ");
	assert_has(err, what);
	assert_lacks(err, "\n");
}

static char *write_temp(const char *text)
{
	char *path = tu_write_temp(text);
	cr_assert_not_null(path);
	return path;
}

static int load_text(const char *text)
{
	char *path = write_temp(text);
	err[0] = '\0';
	int r = pc_cfg_load_file(&table, &c, path, err, sizeof(err));
	unlink(path);
	free(path);
	return r;
}

/* ---- defaults and table validation ------------------------------------ */

TestSuite(config, .init = setup, .fini = teardown);

Test(config, defaults)
{
	cr_assert_eq(c.metrics_enabled, false);
	cr_assert_eq(c.prefetch, true);
	cr_assert_eq(c.rpc_port, 31999);
	cr_assert_eq(c.weight, -5);
	cr_assert_eq(c.cache_size, 64ull << 20);
	cr_assert_eq(c.chunk_size, 0);
	cr_assert_eq(c.heartbeat_interval_ms, 2000);
	cr_assert_str_eq(c.node_name, "node-a");
	cr_assert_str_eq(c.auth_token, "");
	cr_assert_eq(c.mode, 0);
}

static void expect_bad_table(const struct pc_cfg_key *k, const char *what)
{
	struct pc_cfg_table t = {k, 1, NULL, NULL};
	struct tcfg s;
	memset(&s, 0, sizeof(s));
	cr_assert_eq(pc_cfg_defaults(&t, &s, err, sizeof(err)), -EINVAL,
		     "table entry '%s' accepted", k->name);
	assert_has(err, what);
	pc_cfg_free(&t, &s);
}

Test(config, bad_tables_are_caught)
{
	static const struct pc_cfg_key bad_default = {
		"rpc_port", PC_CFG_INT, "70000", 0, 65535, NULL,
		offsetof(struct tcfg, rpc_port), 0, ""};
	static const struct pc_cfg_key no_max = {
		"node_name", PC_CFG_STRING, "x", 0, 0, NULL,
		offsetof(struct tcfg, node_name), 0, ""};
	static const struct pc_cfg_key no_choices = {
		"mode", PC_CFG_ENUM, "p2p", 0, 0, NULL,
		offsetof(struct tcfg, mode), 0, ""};
	static const struct pc_cfg_key bad_name = {
		"Rpc-Port", PC_CFG_INT, "1", 0, 9, NULL,
		offsetof(struct tcfg, rpc_port), 0, ""};
	static const struct pc_cfg_key inverted = {
		"rpc_port", PC_CFG_INT, "1", 9, 0, NULL,
		offsetof(struct tcfg, rpc_port), 0, ""};
	expect_bad_table(&bad_default, "'70000' is out of range");
	expect_bad_table(&no_max, "max length");
	expect_bad_table(&no_choices, "choices");
	expect_bad_table(&bad_name, "snake_case");
	expect_bad_table(&inverted, "min > max");
	static const struct pc_cfg_key negative_size = {
		"cache_size", PC_CFG_SIZE, "1", -1, 9, NULL,
		offsetof(struct tcfg, cache_size), 0, ""};
	static const struct pc_cfg_key no_default = {
		"rpc_port", PC_CFG_INT, NULL, 0, 9, NULL,
		offsetof(struct tcfg, rpc_port), 0, ""};
	expect_bad_table(&negative_size, "negative min");
	expect_bad_table(&no_default, "missing default");

	struct pc_cfg_key dup[2] = {keys[2], keys[2]};
	struct pc_cfg_table t = {dup, 2, NULL, NULL};
	struct tcfg s;
	cr_assert_eq(pc_cfg_defaults(&t, &s, err, sizeof(err)), -EINVAL);
	assert_has(err, "duplicate");
}

Test(config, find_accepts_dashes_and_case)
{
	cr_assert_eq(pc_cfg_find(&table, "rpc_port"), &keys[2]);
	cr_assert_eq(pc_cfg_find(&table, "rpc-port"), &keys[2]);
	cr_assert_eq(pc_cfg_find(&table, "RPC_PORT"), &keys[2]);
	cr_assert_eq(pc_cfg_find(&table, "Heartbeat-Interval"), &keys[6]);
	cr_assert_null(pc_cfg_find(&table, "rpc_portx"));
	cr_assert_null(pc_cfg_find(&table, ""));
	char longname[300];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	cr_assert_null(pc_cfg_find(&table, longname));
}

/* ---- value parsers ----------------------------------------------------- */

Test(config, parse_bool)
{
	static const char *const yes[] = {"1", "true", "TRUE", "yes", "Yes",
					  "on", "ON"};
	static const char *const no[] = {"0", "false", "False", "no", "NO",
					 "off", "Off"};
	static const char *const bad[] = {"", "2", "y", "n", "truee", " true",
					  "enabled", "-1"};
	bool b;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		b = false;
		cr_assert_eq(pc_parse_bool(yes[i], &b), 0, "%s", yes[i]);
		cr_assert(b, "%s", yes[i]);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		b = true;
		cr_assert_eq(pc_parse_bool(no[i], &b), 0, "%s", no[i]);
		cr_assert(!b, "%s", no[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(pc_parse_bool(bad[i], &b), -EINVAL, "%s", bad[i]);
}

Test(config, parse_int)
{
	int64_t v;
	cr_assert_eq(pc_parse_int("0", &v), 0);
	cr_assert_eq(v, 0);
	cr_assert_eq(pc_parse_int("-5", &v), 0);
	cr_assert_eq(v, -5);
	cr_assert_eq(pc_parse_int("+7", &v), 0);
	cr_assert_eq(v, 7);
	cr_assert_eq(pc_parse_int("007", &v), 0);
	cr_assert_eq(v, 7);
	cr_assert_eq(pc_parse_int("9223372036854775807", &v), 0);
	cr_assert_eq(v, INT64_MAX);
	cr_assert_eq(pc_parse_int("-9223372036854775808", &v), 0);
	cr_assert_eq(v, INT64_MIN);
	cr_assert_eq(pc_parse_int("9223372036854775808", &v), -ERANGE);
	cr_assert_eq(pc_parse_int("-9223372036854775809", &v), -ERANGE);
	cr_assert_eq(pc_parse_int("99999999999999999999999", &v), -ERANGE);
	static const char *const bad[] = {"", "-", "+", "12x", "1.0", " 1",
					  "1 ", "0x10", "--1", "1e3", "abc"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(pc_parse_int(bad[i], &v), -EINVAL, "'%s'", bad[i]);
}

Test(config, parse_size)
{
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{"0", 0},
		{"100", 100},
		{"1b", 1},
		{"1B", 1},
		{"1k", 1024},
		{"1kb", 1024},
		{"1KiB", 1024},
		{"2K", 2048},
		{"512MiB", 512ull << 20},
		{"3m", 3ull << 20},
		{"3MB", 3ull << 20},
		{"4gb", 4ull << 30},
		{"4 gb", 4ull << 30},
		{"4\tGiB", 4ull << 30},
		{"1t", 1ull << 40},
		{"1TB", 1ull << 40},
		{"2tib", 2ull << 40},
		{"16777215tb", 16777215ull << 40},
		{"18446744073709551615", UINT64_MAX},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 42;
		cr_assert_eq(pc_parse_size(ok[i].s, &v), 0, "'%s'", ok[i].s);
		cr_assert_eq(v, ok[i].v, "'%s' -> %llu", ok[i].s,
			     (unsigned long long)v);
	}
	static const char *const bad[] = {"", "-1", "-1kb", "1.5gb", ".5k",
					  "10 parsecs", "kb", "1 k b", "1xb",
					  "1pb", "1kbb", " 1", "+1", "1e3"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(pc_parse_size(bad[i], &v), -EINVAL, "'%s'", bad[i]);
	cr_assert_eq(pc_parse_size("18446744073709551616", &v), -ERANGE);
	cr_assert_eq(pc_parse_size("16777216tb", &v), -ERANGE);
	cr_assert_eq(pc_parse_size("99999999999999gb", &v), -ERANGE);
}

Test(config, parse_duration)
{
	static const struct {
		const char *s;
		uint64_t ms;
	} ok[] = {
		{"2s", 2000},     {"500ms", 500},  {"1.5s", 1500},
		{"2m", 120000},   {"1h", 3600000}, {"2", 2000},
		{"2.0", 2000},    {"0", 0},        {"0.5", 500},
		{".5s", 500},     {"1.", 1000},    {"2 s", 2000},
		{"2MS", 2},       {"1.5H", 5400000}, {"0ms", 0},
		{"0.000s", 0},    {"1000us", 1},   {"250us", 1},
		{"1us", 1},       {"1499us", 1},   {"1500us", 2},
		{"2499us", 2},    {"2500us", 3},   {"0.0001s", 1},
		{"0.0000000001s", 1}, {"0.0015", 2}, {"1.0004s", 1000},
		{"0.25m", 15000}, {"90m", 5400000},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 42;
		cr_assert_eq(pc_parse_duration_ms(ok[i].s, &v), 0, "'%s'",
			     ok[i].s);
		cr_assert_eq(v, ok[i].ms, "'%s' -> %llu", ok[i].s,
			     (unsigned long long)v);
	}
	static const char *const bad[] = {"", "abc", "-1s", "-1", "1x", "s",
					  ".", ".s", "1.5.2", "1e3", "2 sec",
					  "1d", " 1s", "+1s", "1,5s"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(pc_parse_duration_ms(bad[i], &v), -EINVAL, "'%s'",
			     bad[i]);
	cr_assert_eq(pc_parse_duration_ms("99999999999999999999999", &v),
		     -ERANGE);
	cr_assert_eq(pc_parse_duration_ms("6000000000h", &v), -ERANGE);
	cr_assert_eq(pc_parse_duration_ms("18446744073709551.616s", &v),
		     -ERANGE);
}

Test(config, format_size)
{
	static const struct {
		uint64_t v;
		const char *s;
	} cases[] = {
		{4294967296ull, "4gb"}, {1536ull * 1024, "1536kb"},
		{100, "100"},           {0, "0"},
		{1024, "1kb"},          {1025, "1025"},
		{3ull << 20, "3mb"},    {1ull << 40, "1tb"},
		{1ull << 60, "1048576tb"}, {UINT64_MAX, "18446744073709551615"},
	};
	char buf[32];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		pc_format_size(cases[i].v, buf, sizeof(buf));
		cr_assert_str_eq(buf, cases[i].s);
		uint64_t back;
		cr_assert_eq(pc_parse_size(buf, &back), 0, "%s", buf);
		cr_assert_eq(back, cases[i].v, "%s", buf);
	}
	pc_format_size(4294967296ull, buf, 3); /* truncates, stays terminated */
	cr_assert_str_eq(buf, "4g");
}

/* ---- pc_cfg_set: good values and every bad-value path ------------------ */

Test(config, set_good_values)
{
	cr_assert_eq(set("metrics-enabled", "YES"), 0, "%s", err);
	cr_assert(c.metrics_enabled);
	cr_assert_eq(set("RPC_PORT", "65535"), 0, "%s", err);
	cr_assert_eq(c.rpc_port, 65535);
	cr_assert_eq(set("weight", "-100"), 0, "%s", err);
	cr_assert_eq(c.weight, -100);
	cr_assert_eq(set("cache_size", "4kb"), 0, "%s", err);
	cr_assert_eq(c.cache_size, 4096);
	cr_assert_eq(set("cache_size", "1tb"), 0, "%s", err);
	cr_assert_eq(c.cache_size, 1ull << 40);
	cr_assert_eq(set("heartbeat-interval", "1ms"), 0, "%s", err);
	cr_assert_eq(c.heartbeat_interval_ms, 1);
	cr_assert_eq(set("heartbeat_interval", "1h"), 0, "%s", err);
	cr_assert_eq(c.heartbeat_interval_ms, 3600000);
	cr_assert_eq(set("node_name", "0123456789abcdef"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "0123456789abcdef");
	cr_assert_eq(set("node_name", "caf\xc3\xa9 #1"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "caf\xc3\xa9 #1");
	cr_assert_eq(set("mode", "SlotMap"), 0, "%s", err);
	cr_assert_eq(c.mode, 1);
	cr_assert_eq(set("auth_token", "s3cret"), 0, "%s", err);
	cr_assert_str_eq(c.auth_token, "s3cret");
}

Test(config, bad_bool)
{
	expect_bad("metrics_enabled", "maybe", "true/false");
	assert_has(err, "'maybe' is not a boolean");
}

Test(config, bad_int)
{
	expect_bad("rpc_port", "12x", "0..65535");
	assert_has(err, "test: rpc_port: '12x' is not an integer");
	expect_bad("rpc_port", "", "0..65535");
	expect_bad("rpc_port", "99999999999999999999", "0..65535");
	assert_has(err, "out of range");
	expect_bad("rpc_port", "70000", "0..65535");
	cr_assert_str_eq(err, "test: rpc_port: '70000' is out of range "
			      "(allowed: 0..65535)");
	expect_bad("rpc_port", "-1", "0..65535");
	expect_bad("weight", "101", "-100..100");
	expect_bad("weight", "-101", "-100..100");
	cr_assert_eq(c.rpc_port, 31999, "a failed set changed the value");
	cr_assert_eq(c.weight, -5);
}

Test(config, bad_size)
{
	expect_bad("cache_size", "10 parsecs", "k/kb/kib");
	assert_has(err, "'10 parsecs' is not a size");
	expect_bad("cache_size", "-1gb", "whole number");
	expect_bad("cache_size", "1.5gb", "whole number");
	expect_bad("cache_size", "", "whole number");
	expect_bad("cache_size", "4pb", "whole number");
	expect_bad("cache_size", "99999999999999999999", "4kb..1tb");
	expect_bad("cache_size", "16777216tb", "4kb..1tb");
	expect_bad("cache_size", "4095", "4kb..1tb");
	cr_assert_str_eq(err, "test: cache_size: '4095' is out of range "
			      "(allowed: 4kb..1tb)");
	expect_bad("cache_size", "1025gb", "4kb..1tb");
	cr_assert_eq(c.cache_size, 64ull << 20);
}

Test(config, bad_duration)
{
	expect_bad("heartbeat_interval", "soon", "us, ms, s, m, h");
	assert_has(err, "'soon' is not a duration");
	expect_bad("heartbeat_interval", "-2s", "a bare number is seconds");
	expect_bad("heartbeat_interval", "0", "1ms..1h");
	cr_assert_str_eq(err, "test: heartbeat_interval: '0' is out of range "
			      "(allowed: 1ms..1h)");
	expect_bad("heartbeat_interval", "3601s", "1ms..1h");
	expect_bad("heartbeat_interval", "99999999999999999999h", "1ms..1h");
	cr_assert_eq(c.heartbeat_interval_ms, 2000);
}

Test(config, bad_string)
{
	expect_bad("node_name", "0123456789abcdefg", "at most 16 bytes");
	assert_has(err, "'0123456789abcdefg' is too long");
	expect_bad("node_name", "a\x01z", "printable");
	assert_has(err, "'a\\x01z' contains a control character");
	expect_bad("node_name", "two\nlines", "printable");
	assert_has(err, "'two\\x0alines'");
	expect_bad("node_name", "tab\there", "printable");
	expect_bad("node_name", "del\x7f", "printable");
	cr_assert_str_eq(c.node_name, "node-a");
}

Test(config, bad_enum)
{
	expect_bad("mode", "mesh", "p2p, slotmap");
	cr_assert_str_eq(err, "test: mode: 'mesh' is not allowed "
			      "(allowed: p2p, slotmap)");
	expect_bad("mode", "", "p2p, slotmap");
	cr_assert_eq(c.mode, 0);
}

Test(config, error_values_are_escaped_and_truncated)
{
	char big[2000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	expect_bad("rpc_port", big, "0..65535");
	assert_has(err, "...' is not an integer");
	cr_assert_lt(strlen(err), 200, "%s", err);

	/* Escapes must not push a long value past the error buffer either. */
	char ctl[600];
	memset(ctl, '\x1b', sizeof(ctl) - 1);
	ctl[sizeof(ctl) - 1] = '\0';
	expect_bad("weight", ctl, "-100..100");
	assert_has(err, "\\x1b");
	assert_has(err, "...'");
	assert_lacks(err, "\x1b");
	expect_bad("weight", "\xff\xfe", "-100..100");
	assert_has(err, "'\\xff\\xfe'");
}

Test(config, secret_values_are_not_echoed)
{
	char longtok[100];
	memset(longtok, 'k', sizeof(longtok) - 1);
	longtok[sizeof(longtok) - 1] = '\0';
	expect_bad("auth_token", longtok, "at most 64 bytes");
	assert_has(err, "'***'");
	assert_lacks(err, "kkkk");
}

Test(config, unknown_key_suggests_closest)
{
	cr_assert_eq(set("rpc_prot", "1"), -ENOENT);
	cr_assert_str_eq(err, "test: unknown key 'rpc_prot'; did you mean "
			      "'rpc_port'?");
	cr_assert_eq(set("Cache-Sise", "1"), -ENOENT);
	assert_has(err, "unknown key 'Cache-Sise'; did you mean 'cache_size'?");
	cr_assert_eq(set("heartbeat", "1"), -ENOENT); /* too far: 9 edits */
	cr_assert_eq(set("mod", "p2p"), -ENOENT);
	assert_has(err, "did you mean 'mode'?");
}

Test(config, unknown_key_without_suggestion)
{
	cr_assert_eq(set("zzzzzzzz", "1"), -ENOENT);
	cr_assert_str_eq(err, "test: unknown key 'zzzzzzzz'");
	cr_assert_eq(set("bad\nname", "1"), -ENOENT);
	assert_has(err, "'bad\\x0aname'");
	char longname[300];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	cr_assert_eq(set(longname, "1"), -ENOENT);
	assert_has(err, "...'");
}

Test(config, string_set_twice_frees_old)
{
	cr_assert_eq(set("node_name", "first"), 0);
	cr_assert_eq(set("node_name", "second"), 0);
	cr_assert_str_eq(c.node_name, "second");
	/* ASan's leak check at exit proves "first" and "node-a" were freed. */
}

Test(config, null_err_buffer_is_allowed)
{
	cr_assert_eq(pc_cfg_set(&table, &c, "rpc_port", "x", "t", NULL, 0),
		     -EINVAL);
	cr_assert_eq(pc_cfg_set(&table, &c, "nope", "x", "t", NULL, 0),
		     -ENOENT);
}

/* ---- config file ------------------------------------------------------ */

Test(config, file_accepted_forms)
{
	int r = load_text(
		"# PeerCache test config\n"
		"\n"
		"   # indented comment\n"
		"rpc_port = 4000\n"
		"weight=7\n"
		"Cache-Size   =   8 MiB   \n"
		"heartbeat_interval = 1.5 # seconds, like the Python version\n"
		"node_name = a#b\n"
		"mode = slotmap\t# tab before comment\n"
		"metrics_enabled = on\r\n"
		"auth_token = \"x \\\"y\\\" \\\\ #z\"  # quoted\n"
		"prefetch = \"off\"\n"
		"\t\n"
		"chunk_size = 64k"); /* no final newline */
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(c.rpc_port, 4000);
	cr_assert_eq(c.weight, 7);
	cr_assert_eq(c.cache_size, 8ull << 20);
	cr_assert_eq(c.heartbeat_interval_ms, 1500);
	cr_assert_str_eq(c.node_name, "a#b");
	cr_assert_eq(c.mode, 1);
	cr_assert(c.metrics_enabled);
	cr_assert_str_eq(c.auth_token, "x \"y\" \\ #z");
	cr_assert(!c.prefetch);
	cr_assert_eq(c.chunk_size, 64 * 1024);
}

Test(config, file_comment_needs_whitespace_before_hash)
{
	cr_assert_eq(load_text("node_name = a #b\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "a");
	cr_assert_eq(load_text("node_name = x # a = b\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "x");
	cr_assert_eq(load_text("node_name =\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "");
	cr_assert_eq(load_text("node_name =    # nothing here\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "");
	cr_assert_eq(load_text("node_name =#x\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "#x");
	cr_assert_eq(load_text("node_name = \"\"\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, "");
	cr_assert_eq(load_text("node_name = \" pad \"\n"), 0, "%s", err);
	cr_assert_str_eq(c.node_name, " pad ");
}

/* Load text and expect an error starting "<path>:<line>: " with detail. */
static void expect_file_error(const char *text, int line, int code,
			      const char *detail)
{
	char *path = write_temp(text);
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "%s:%d: ", path, line);
	int r = pc_cfg_load_file(&table, &c, path, err, sizeof(err));
	unlink(path);
	free(path);
	cr_assert_eq(r, code, "'%s' -> %d (%s)", text, r, err);
	cr_assert_eq(strncmp(err, prefix, strlen(prefix)), 0,
		     "'%s' does not start with '%s'", err, prefix);
	assert_has(err, detail);
	assert_lacks(err, "\n");
}

Test(config, file_syntax_errors_have_line_numbers)
{
	expect_file_error("rpc_port = 1\n# c\nthis line has no equals\n", 3,
			  -EINVAL, "expected 'key = value'");
	expect_file_error("\n\n\n\n= 5\n", 5, -EINVAL,
			  "expected 'key = value'");
	expect_file_error("rpc port = 5\n", 1, -EINVAL,
			  "expected 'key = value'");
	expect_file_error("a\n", 1, -EINVAL, "expected 'key = value'");
	expect_file_error("x=1\ny=2\n", 1, -ENOENT, "unknown key 'x'");
	expect_file_error("rpc_port = 1\nrpc_prot = 2\n", 2, -ENOENT,
			  "did you mean 'rpc_port'?");
	expect_file_error("\n# x\nrpc_port = 70000\n", 3, -EINVAL,
			  "rpc_port: '70000' is out of range (allowed: "
			  "0..65535)");
	expect_file_error("node_name = \"open\n", 1, -EINVAL,
			  "unterminated");
	expect_file_error("node_name = \"a\" b\n", 1, -EINVAL,
			  "unexpected text after quoted value");
	expect_file_error("node_name = \"a\\nb\"\n", 1, -EINVAL,
			  "bad escape");
	expect_file_error("mode = mesh # nope\n", 1, -EINVAL,
			  "'mesh' is not allowed (allowed: p2p, slotmap)");
}

Test(config, file_line_length_limit)
{
	/* 4096 bytes of content is the limit; 4097 is an error, not a cut. */
	char *text = malloc(3 * 4200);
	cr_assert_not_null(text);
	memset(text, ' ', 4096);
	text[0] = '#';
	strcpy(text + 4096, "\nrpc_port = 5\n");
	cr_assert_eq(load_text(text), 0, "%s", err);
	cr_assert_eq(c.rpc_port, 5);

	memset(text, ' ', 4097);
	text[0] = '#';
	strcpy(text + 4097, "\n");
	expect_file_error(text, 1, -E2BIG, "longer than 4096 bytes");

	strcpy(text, "rpc_port = 6\n");
	size_t o = strlen(text);
	memset(text + o, 'x', 5000);
	strcpy(text + o + 5000, "\n");
	expect_file_error(text, 2, -E2BIG, "longer than 4096 bytes");
	cr_assert_eq(c.rpc_port, 6);
	free(text);
}

Test(config, file_with_nul_byte)
{
	char *path = write_temp("");
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	fwrite("rpc_port = 1\nnode_name = a\0b\n", 1, 29, f);
	fclose(f);
	int r = pc_cfg_load_file(&table, &c, path, err, sizeof(err));
	unlink(path);
	cr_assert_eq(r, -EILSEQ);
	assert_has(err, ":2: ");
	assert_has(err, "NUL");
	free(path);
}

Test(config, file_line_count_limit)
{
	size_t n = 65537;
	char *text = malloc(2 * n + 1);
	cr_assert_not_null(text);
	for (size_t i = 0; i < n; i++)
		memcpy(text + 2 * i, "#\n", 2);
	text[2 * n] = '\0';
	expect_file_error(text, 65537, -E2BIG, "too many lines");
	text[2 * (n - 1)] = '\0'; /* 65536 lines are fine */
	cr_assert_eq(load_text(text), 0, "%s", err);
	free(text);
}

Test(config, missing_file)
{
	const char *path = "/nonexistent/peercache-test.conf";
	cr_assert_eq(pc_cfg_load_file(&table, &c, path, err, sizeof(err)),
		     -ENOENT);
	cr_assert_str_eq(err, "cannot read config file "
			      "'/nonexistent/peercache-test.conf': "
			      "No such file or directory");
	/* The path is escaped too: the error stays one line. */
	cr_assert_eq(pc_cfg_load_file(&table, &c, "/nonexistent/a\nb", err,
				      sizeof(err)),
		     -ENOENT);
	assert_has(err, "'/nonexistent/a\\x0ab'");
}

Test(config, directory_is_not_a_config_file)
{
	int r = pc_cfg_load_file(&table, &c, "/tmp", err, sizeof(err));
	cr_assert_lt(r, 0);
	assert_has(err, "/tmp");
}

/* ---- environment ------------------------------------------------------- */

struct warn_log {
	int calls;
	char last[128];
};

static void on_warn(const char *var, void *arg)
{
	struct warn_log *w = arg;
	w->calls++;
	snprintf(w->last, sizeof(w->last), "%s", var);
}

Test(config, env_sets_keys)
{
	char *envp[] = {"HOME=/root",
			"PEERCACHE_RPC_PORT=4100",
			"PEERCACHE_CACHE_SIZE=1gb",
			"PEERCACHE_HEARTBEAT_INTERVAL=250ms",
			"PEERCACHE_METRICS_ENABLED=true",
			"PEERCACHE_NODE_NAME=a=b",
			"PEERCACHE_NOEQUALS",
			"peercache_rpc_port=1",
			NULL};
	struct warn_log w = {0};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, on_warn, &w, err,
				     sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(c.rpc_port, 4100);
	cr_assert_eq(c.cache_size, 1ull << 30);
	cr_assert_eq(c.heartbeat_interval_ms, 250);
	cr_assert(c.metrics_enabled);
	cr_assert_str_eq(c.node_name, "a=b");
	cr_assert_eq(w.calls, 0);
}

Test(config, env_unknown_var_warns_and_continues)
{
	char *envp[] = {"PEERCACHE_RPC_PROT=1", "PEERCACHE_WEIGHT=3",
			"PEERCACHE_=x", NULL};
	struct warn_log w = {0};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, on_warn, &w, err,
				     sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(w.calls, 2);
	cr_assert_str_eq(w.last, "PEERCACHE_");
	cr_assert_eq(c.weight, 3);
	/* A NULL callback is allowed. */
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, NULL, NULL, err,
				     sizeof(err)),
		     0);
}

Test(config, env_warn_gets_the_variable_name)
{
	char *envp[] = {"PEERCACHE_RPC_PROT=1", NULL};
	struct warn_log w = {0};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, on_warn, &w, err,
				     sizeof(err)),
		     0);
	cr_assert_eq(w.calls, 1);
	cr_assert_str_eq(w.last, "PEERCACHE_RPC_PROT");
}

Test(config, env_ignore_list)
{
	char *envp[] = {"PEERCACHE_CONFIG=/etc/x.conf", "PEERCACHE_LOG=debug",
			"PEERCACHE_RPC_PORT=7", NULL};
	const char *const ignore[] = {"PEERCACHE_CONFIG", "PEERCACHE_LOG",
				      NULL};
	struct warn_log w = {0};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, ignore, on_warn, &w,
				     err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(w.calls, 0);
	cr_assert_eq(c.rpc_port, 7);
}

Test(config, env_bad_value_is_an_error)
{
	char *envp[] = {"PEERCACHE_RPC_PORT=70000", NULL};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, NULL, NULL, err,
				     sizeof(err)),
		     -EINVAL);
	cr_assert_str_eq(err, "environment PEERCACHE_RPC_PORT: rpc_port: "
			      "'70000' is out of range (allowed: 0..65535)");
}

/* ---- command line ------------------------------------------------------ */

static int args(int argc, char **argv, const char *const *skip)
{
	err[0] = '\0';
	return pc_cfg_parse_args(&table, &c, argc, argv, skip, err,
				 sizeof(err));
}

#define ARGS(...)                                                              \
	((char *[]){"peercached", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"peercached", __VA_ARGS__}) /      \
			  sizeof(char *)))
#define RUN(skip, ...) args(ARGC(__VA_ARGS__), ARGS(__VA_ARGS__), skip)

Test(config, args_accepted_forms)
{
	cr_assert_eq(RUN(NULL, "--rpc-port", "4200", "--weight=-7",
			 "--CACHE_SIZE", "2 gb", "--heartbeat_interval=0.5",
			 "--node-name=", "--mode", "slotmap"),
		     0, "%s", err);
	cr_assert_eq(c.rpc_port, 4200);
	cr_assert_eq(c.weight, -7);
	cr_assert_eq(c.cache_size, 2ull << 30);
	cr_assert_eq(c.heartbeat_interval_ms, 500);
	cr_assert_str_eq(c.node_name, "");
	cr_assert_eq(c.mode, 1);
	cr_assert_eq(RUN(NULL, "--weight", "-8"), 0, "%s", err);
	cr_assert_eq(c.weight, -8);
	char *only_argv0[] = {"peercached", NULL};
	cr_assert_eq(args(1, only_argv0, NULL), 0);
}

Test(config, args_bool_forms)
{
	cr_assert_eq(RUN(NULL, "--metrics-enabled"), 0, "%s", err);
	cr_assert(c.metrics_enabled);
	c.metrics_enabled = false;
	cr_assert_eq(RUN(NULL, "--metrics-enabled", "--rpc-port", "1"), 0,
		     "%s", err);
	cr_assert(c.metrics_enabled);
	cr_assert_eq(c.rpc_port, 1);
	cr_assert_eq(RUN(NULL, "--metrics-enabled", "off"), 0, "%s", err);
	cr_assert(!c.metrics_enabled);
	cr_assert_eq(RUN(NULL, "--metrics-enabled=yes"), 0, "%s", err);
	cr_assert(c.metrics_enabled);
	cr_assert_eq(RUN(NULL, "--no-metrics-enabled", "--no_prefetch"), 0,
		     "%s", err);
	cr_assert(!c.metrics_enabled);
	cr_assert(!c.prefetch);
	cr_assert_eq(RUN(NULL, "--no-prefetch=1"), -EINVAL);
	assert_has(err, "--no-prefetch takes no value");
	cr_assert_eq(RUN(NULL, "--metrics-enabled", "maybe"), -EINVAL);
	assert_has(err, "command line: metrics_enabled: 'maybe' is not a "
			"boolean");
	cr_assert_eq(RUN(NULL, "--no-rpc-port"), -ENOENT); /* not a bool */
}

Test(config, args_skip_list)
{
	const char *const skip[] = {"config", "help", NULL};
	cr_assert_eq(RUN(skip, "--config", "/etc/x.conf", "--rpc-port", "9"), 0,
		     "%s", err);
	cr_assert_eq(c.rpc_port, 9);
	cr_assert_eq(RUN(skip, "--CONFIG=/x", "--weight", "1"), 0, "%s", err);
	cr_assert_eq(c.weight, 1);
	/* A value-less skipped flag leaves the next option alone. */
	cr_assert_eq(RUN(skip, "--help", "--weight", "2"), 0, "%s", err);
	cr_assert_eq(c.weight, 2);
	cr_assert_eq(RUN(skip, "--config"), 0, "%s", err);
}

Test(config, args_positional_is_an_error)
{
	cr_assert_eq(RUN(NULL, "--rpc-port", "1", "extra"), -EINVAL);
	cr_assert_str_eq(err, "command line: unexpected argument 'extra'");
	cr_assert_eq(RUN(NULL, "-p"), -EINVAL);
	cr_assert_str_eq(err, "command line: unexpected argument '-p'");
	cr_assert_eq(RUN(NULL, "--"), -EINVAL);
	cr_assert_eq(RUN(NULL, "--metrics-enabled", "true", "x"), -EINVAL);
	assert_has(err, "unexpected argument 'x'");
}

Test(config, args_missing_value)
{
	cr_assert_eq(RUN(NULL, "--rpc-port"), -EINVAL);
	cr_assert_str_eq(err, "command line: --rpc-port needs a value");
	cr_assert_eq(RUN(NULL, "--cache-size", "--rpc-port", "1"), -EINVAL);
	cr_assert_str_eq(err, "command line: --cache-size needs a value");
}

Test(config, args_unknown_and_bad_values)
{
	cr_assert_eq(RUN(NULL, "--rpc-prot", "1"), -ENOENT);
	cr_assert_str_eq(err, "command line: unknown key 'rpc-prot'; did you "
			      "mean 'rpc_port'?");
	cr_assert_eq(RUN(NULL, "--frobnicate=1"), -ENOENT);
	cr_assert_str_eq(err, "command line: unknown key 'frobnicate'");
	cr_assert_eq(RUN(NULL, "--rpc-port=70000"), -EINVAL);
	cr_assert_str_eq(err, "command line: rpc_port: '70000' is out of "
			      "range (allowed: 0..65535)");
	char longopt[300] = "--";
	memset(longopt + 2, 'a', 250);
	cr_assert_eq(RUN(NULL, longopt), -ENOENT);
	assert_lacks(err, "\n");
}

/* ---- precedence -------------------------------------------------------- */

Test(config, precedence_file_env_args)
{
	cr_assert_eq(load_text("rpc_port = 1\nweight = 1\nnode_name = file\n"
			       "mode = slotmap\n"),
		     0, "%s", err);
	char *envp[] = {"PEERCACHE_RPC_PORT=2", "PEERCACHE_WEIGHT=2", NULL};
	cr_assert_eq(pc_cfg_load_env(&table, &c, envp, NULL, NULL, NULL, err,
				     sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(RUN(NULL, "--rpc-port", "3"), 0, "%s", err);
	cr_assert_eq(c.rpc_port, 3);        /* args beat env and file */
	cr_assert_eq(c.weight, 2);          /* env beats file */
	cr_assert_str_eq(c.node_name, "file"); /* file beats default */
	cr_assert_eq(c.mode, 1);
	cr_assert_eq(c.cache_size, 64ull << 20); /* untouched default */
}

/* ---- dump and help ----------------------------------------------------- */

static char *capture_dump(const struct tcfg *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	pc_cfg_dump(&table, s, f);
	fclose(f);
	return buf;
}

Test(config, dump_format)
{
	char *out = capture_dump(&c);
	assert_has(out, "metrics_enabled = false\n");
	assert_has(out, "prefetch = true\n");
	assert_has(out, "rpc_port = 31999\n");
	assert_has(out, "weight = -5\n");
	assert_has(out, "cache_size = 64mb\n");
	assert_has(out, "chunk_size = 0\n");
	assert_has(out, "heartbeat_interval = 2s\n");
	assert_has(out, "node_name = node-a\n");
	assert_has(out, "auth_token = \"\"\n");
	assert_has(out, "mode = p2p\n");
	free(out);

	cr_assert_eq(set("heartbeat_interval", "1500ms"), 0);
	cr_assert_eq(set("auth_token", "hunter2"), 0);
	cr_assert_eq(set("cache_size", "1536k"), 0);
	out = capture_dump(&c);
	assert_has(out, "heartbeat_interval = 1500ms\n");
	assert_has(out, "auth_token = ***\n");
	assert_lacks(out, "hunter2");
	assert_has(out, "cache_size = 1536kb\n");
	free(out);
	cr_assert_eq(set("heartbeat_interval", "30m"), 0);
	out = capture_dump(&c);
	assert_has(out, "heartbeat_interval = 30m\n");
	free(out);
}

static void expect_round_trip(const char *node_name)
{
	cr_assert_eq(set("node_name", node_name), 0, "%s", err);
	char *out = capture_dump(&c);
	char *path = write_temp(out);
	struct tcfg back;
	cr_assert_eq(pc_cfg_defaults(&table, &back, err, sizeof(err)), 0);
	int r = pc_cfg_load_file(&table, &back, path, err, sizeof(err));
	unlink(path);
	free(path);
	cr_assert_eq(r, 0, "%s\n--- dump:\n%s", err, out);
	free(out);
	cr_assert_eq(back.metrics_enabled, c.metrics_enabled);
	cr_assert_eq(back.prefetch, c.prefetch);
	cr_assert_eq(back.rpc_port, c.rpc_port);
	cr_assert_eq(back.weight, c.weight);
	cr_assert_eq(back.cache_size, c.cache_size);
	cr_assert_eq(back.chunk_size, c.chunk_size);
	cr_assert_eq(back.heartbeat_interval_ms, c.heartbeat_interval_ms);
	cr_assert_str_eq(back.node_name, c.node_name);
	cr_assert_eq(back.mode, c.mode);
	pc_cfg_free(&table, &back);
}

Test(config, dump_round_trips)
{
	cr_assert_eq(set("metrics_enabled", "1"), 0);
	cr_assert_eq(set("prefetch", "off"), 0);
	cr_assert_eq(set("rpc_port", "0"), 0);
	cr_assert_eq(set("weight", "-100"), 0);
	cr_assert_eq(set("cache_size", "1000005"), 0, "%s", err);
	cr_assert_eq(set("chunk_size", "9223372036854775807"), 0, "%s", err);
	cr_assert_eq(set("heartbeat_interval", "0.0015"), 0);
	cr_assert_eq(set("mode", "slotmap"), 0);
	static const char *const names[] = {
		"plain", "", " lead", "trail ", "a#b", "a #b", "#x", "\"q\"",
		"back\\slash", "q\" #\\", "caf\xc3\xa9", "= eq =",
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		expect_round_trip(names[i]);
}

Test(config, dump_round_trips_defaults)
{
	expect_round_trip("node-a");
}

Test(config, help_lists_every_key)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	pc_cfg_print_help(&table, f);
	fclose(f);
	assert_has(buf, "  --metrics-enabled [BOOL]");
	assert_has(buf, "  --rpc-port N ");
	assert_has(buf, "--cache-size SIZE ");
	assert_has(buf, "--heartbeat-interval DURATION ");
	assert_has(buf, "--node-name STR ");
	assert_has(buf, "--mode p2p|slotmap ");
	assert_has(buf, "RPC listen port [default: 31999]\n");
	assert_has(buf, "memory pool size [default: 64mb]\n");
	assert_has(buf, "shared secret\n"); /* empty default: not shown */

	/* One line per key, help text aligned in one column. */
	int lines = 0;
	long col = -1;
	for (char *line = buf, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
		const struct pc_cfg_key *k = &keys[lines++];
		char *h = strstr(line, k->help);
		cr_assert(h && h < nl, "line %d lacks '%s'", lines, k->help);
		if (col >= 0)
			cr_assert_eq(h - line, col, "help not aligned: %.*s",
				     (int)(nl - line), line);
		col = h - line;
	}
	cr_assert_eq(lines, (int)table.n);
	free(buf);
}

/* An enum with many choices: errors and help cut the list, never overflow. */
Test(config, long_enum_lists_are_cut)
{
	static char names[40][24];
	static const char *choices[41];
	for (int i = 0; i < 40; i++) {
		snprintf(names[i], sizeof(names[i]), "choice_number_%02d", i);
		choices[i] = names[i];
	}
	const struct pc_cfg_key k = {"mode", PC_CFG_ENUM, "choice_number_39",
				     0, 0, choices, offsetof(struct tcfg, mode),
				     0, "many"};
	struct pc_cfg_table t = {&k, 1, NULL, NULL};
	struct tcfg s;
	cr_assert_eq(pc_cfg_defaults(&t, &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.mode, 39);
	cr_assert_eq(pc_cfg_set(&t, &s, "mode", "x", "test", err, sizeof(err)),
		     -EINVAL);
	assert_has(err, "(allowed: choice_number_00, ");
	assert_has(err, "...)");
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	pc_cfg_print_help(&t, f);
	fclose(f);
	assert_has(buf, "--mode choice_number_00|");
	assert_has(buf, "...  many [default: choice_number_39]\n");
	free(buf);
}

Test(config, dump_marks_out_of_range_enum)
{
	c.mode = 7; /* only reachable by writing the struct directly */
	char *out = capture_dump(&c);
	assert_has(out, "mode = ?\n");
	free(out);
}

static void count_key(void *arg, const struct pc_cfg_key *k, const char *value)
{
	(void)k;
	(void)value;
	++*(size_t *)arg;
}

/* node.config's walk (pc_cfg_each, pc_cfg_format): what pc_cfg_dump prints,
 * the secret as "***". */
Test(config, each_and_format_redact_secrets)
{
	cr_assert_eq(set("auth_token", "hunter2"), 0);
	char buf[PC_CFG_TEXT_MAX];
	pc_cfg_format(pc_cfg_find(&table, "auth_token"), &c, buf, sizeof(buf));
	cr_assert_str_eq(buf, "***");
	pc_cfg_format(pc_cfg_find(&table, "cache_size"), &c, buf, sizeof(buf));
	cr_assert_str_eq(buf, "64mb");
	size_t n = 0;
	pc_cfg_each(&table, &c, count_key, &n);
	cr_assert_eq(n, table.n);
	char small[4];
	pc_cfg_format(pc_cfg_find(&table, "node_name"), &c, small, sizeof(small));
	cr_assert_str_eq(small, "nod"); /* cut, and terminated */
}

/*
 * The redaction rule (node.config, --print-config): a key whose name says
 * it holds a secret is flagged PC_CFG_SECRET, so its value is never
 * printed or sent ("***"). A path to a secret (…_file) is not one. And any
 * value's text fits PC_CFG_TEXT_MAX (every byte escaped, quotes, NUL).
 */
Test(settings, secret_like_keys_are_redacted)
{
	static const char *const secret_words[] = {
		"secret", "password", "passwd", "token", "credential",
		"private_key", NULL};
	const struct pc_cfg_table *t = &pc_settings_table;
	unsigned flagged = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct pc_cfg_key *k = &t->keys[i];
		size_t len = strlen(k->name);
		bool is_path = len > 5 && !strcmp(k->name + len - 5, "_file");
		bool looks = false;
		for (unsigned j = 0; secret_words[j]; j++)
			looks |= strstr(k->name, secret_words[j]) != NULL;
		if (looks && !is_path)
			cr_assert(k->flags & PC_CFG_SECRET,
				  "%s looks secret but is not PC_CFG_SECRET",
				  k->name);
		flagged += (k->flags & PC_CFG_SECRET) != 0;
		if (k->type == PC_CFG_STRING)
			cr_assert_leq(2 * k->max + 3, PC_CFG_TEXT_MAX, "%s",
				      k->name);
	}
	cr_assert_geq(flagged, 1); /* cluster_secret */
	cr_assert(pc_cfg_find(t, "cluster_secret")->flags & PC_CFG_SECRET);
}
