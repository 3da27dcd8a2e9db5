/*
 * tests/unit/test_settings.c — peercached's key table: its defaults match
 * DESIGN §11, every key parses from file, environment and command line in
 * that precedence, and the cross-key rules refuse what is not supported.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/settings.h"
#include "testutil.h"

static char err[PC_CFG_ERR_MAX];

Test(settings, defaults_follow_the_design)
{
	struct pc_settings s;
	cr_assert_eq(pc_settings_defaults(&s, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.metrics_port, 31997);
	cr_assert_eq(s.meta_port, 31998);
	cr_assert_eq(s.rpc_port, 31999);
	cr_assert_eq(s.data_port, 32000);
	cr_assert_str_eq(s.socket, "/run/peercache/peercached.sock");
	cr_assert_str_eq(s.bind, "127.0.0.1");
	cr_assert_eq(s.mode, PC_MODE_P2P);
	cr_assert_eq(s.vnodes, 160);
	cr_assert_eq(s.directory_replicas, 2);
	cr_assert_eq(s.max_channels_per_peer, 16);
	cr_assert_eq(s.max_masters, 3);
	cr_assert_str_eq(s.discovery_addr, "");
	cr_assert(s.metrics_enabled);
	cr_assert(s.metrics_dashboard);
	cr_assert(!s.disk_enabled);
	cr_assert_str_eq(s.disk_path, "");
	cr_assert_eq(s.disk_size, 0);
	cr_assert_eq(s.disk_region_size, 64ull << 20);
	cr_assert_eq(s.disk_queue_max, 256ull << 20);
	cr_assert_eq(s.pool_size, 4ull << 30);
	cr_assert_eq(pc_settings_validate(&s, err, sizeof(err)), 0, "%s", err);
	pc_settings_free(&s);
}

Test(settings, file_then_env_then_args)
{
	char *path = tu_write_temp("rpc_port = 1000\n"
				   "data_port = 1001\n"
				   "meta_port = 1002\n"
				   "pool_size = 64mb\n");
	char cfgarg[64];
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", path);
	char *argv[] = {"peercached", cfgarg, "--rpc-port", "0", NULL};
	char *envp[] = {"PEERCACHE_RPC_PORT=2000", "PEERCACHE_DATA_PORT=2001",
			"PATH=/bin", NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, 4, argv, envp, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(s.rpc_port, 0, "command line wins");
	cr_assert_eq(s.data_port, 2001, "environment beats the file");
	cr_assert_eq(s.meta_port, 1002, "file beats the default");
	cr_assert_eq(s.pool_size, 64ull << 20);
	pc_settings_free(&s);
	unlink(path);
	free(path);
}

Test(settings, bad_values_name_the_key_and_what_is_allowed)
{
	struct {
		char *arg, *val, *want;
	} cases[] = {
		{"--rpc-port", "70000", "rpc_port: '70000' is out of range"},
		{"--mode", "ring", "(allowed: p2p, slotmap)"},
		{"--pool-size", "4 parsecs", "pool_size: '4 parsecs'"},
		{"--metrics-enabled", "maybe", "metrics_enabled: 'maybe'"},
		{"--vnodes", "0", "vnodes: '0' is out of range (allowed: 1..4096)"},
		{"--heartbeat-interval", "soon", "heartbeat_interval: 'soon'"},
		{"--log-level", "loud", "log_level: 'loud'"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[] = {"peercached", cases[i].arg, cases[i].val, NULL};
		char *envp[] = {NULL};
		struct pc_settings s;
		cr_assert_eq(pc_settings_load(&s, 3, argv, envp, err,
					      sizeof(err)),
			     -EINVAL, "%s %s accepted", cases[i].arg,
			     cases[i].val);
		cr_assert(strstr(err, cases[i].want), "error was: %s", err);
		cr_assert(strstr(err, "command line"), "error was: %s", err);
		cr_assert_null(strchr(err, '\n'), "one line");
		pc_settings_free(&s);
	}
}

Test(settings, missing_config_file_and_missing_value)
{
	struct pc_settings s;
	char *a1[] = {"peercached", "--config", "/nonexistent/pc.conf", NULL};
	char *envp[] = {NULL};
	cr_assert_lt(pc_settings_load(&s, 3, a1, envp, err, sizeof(err)), 0);
	cr_assert(strstr(err, "/nonexistent/pc.conf"), "%s", err);
	pc_settings_free(&s);
	char *a2[] = {"peercached", "--config", NULL};
	cr_assert_eq(pc_settings_load(&s, 2, a2, envp, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "--config needs a file path"), "%s", err);
	pc_settings_free(&s);
}

static void expect_refused(char *key, char *val, const char *want)
{
	char *argv[] = {"peercached", key, val, NULL};
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, 3, argv, envp, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(pc_settings_validate(&s, err, sizeof(err)), -EINVAL,
		     "%s %s was accepted", key, val);
	cr_assert(strstr(err, want), "error was: %s", err);
	pc_settings_free(&s);
}

Test(settings, unsupported_choices_are_refused_loudly)
{
	expect_refused("--mode", "slotmap", "not supported yet");
	expect_refused("--protocol", "rdma", "not supported yet");
	expect_refused("--bind", "0.0.0.0", "needs cluster_secret");
	expect_refused("--reactor-sq-entries", "1000", "not a power of two");
	expect_refused("--reactor-buf-count", "100", "not a power of two");
}

Test(settings, non_loopback_bind_with_a_secret_is_allowed)
{
	char *argv[] = {"peercached", "--bind", "0.0.0.0", "--cluster-secret",
			"x", NULL};
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, 5, argv, envp, err, sizeof(err)), 0);
	cr_assert_eq(pc_settings_validate(&s, err, sizeof(err)), 0, "%s", err);
	pc_settings_free(&s);
}

Test(settings, loopback_detection)
{
	cr_assert(pc_host_is_loopback("127.0.0.1"));
	cr_assert(pc_host_is_loopback("127.9.8.7"));
	cr_assert(pc_host_is_loopback("::1"));
	cr_assert(pc_host_is_loopback("localhost"));
	cr_assert(!pc_host_is_loopback("0.0.0.0"));
	cr_assert(!pc_host_is_loopback("10.0.0.1"));
	cr_assert(!pc_host_is_loopback("::"));
	cr_assert(!pc_host_is_loopback("example.com"));
}

Test(settings, changed_but_inactive_settings_are_warned_about)
{
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pc_log_set_fd(pfd[1]);
	char *argv[] = {"peercached", "--slot-max-page-bytes", "16mb",
			"--slot-ways", "5", NULL};
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, 5, argv, envp, err, sizeof(err)), 0);
	pc_settings_warn_inactive(&s);
	pc_log_set_fd(2);
	close(pfd[1]);
	char out[4096] = "";
	ssize_t n = read(pfd[0], out, sizeof(out) - 1);
	close(pfd[0]);
	cr_assert_gt(n, 0);
	cr_assert(strstr(out, "slot_max_page_bytes is set but has no effect "
			       "yet"), "%s", out);
	cr_assert(strstr(out, "slot_ways is set but has no effect yet"),
		  "%s", out);
	cr_assert_null(strstr(out, "slot_num_buckets"),
		       "unchanged keys are quiet");
	pc_settings_free(&s);
}

Test(settings, every_key_is_in_the_help)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	pc_cfg_print_help(&pc_settings_table, f);
	fclose(f);
	for (size_t i = 0; i < pc_settings_table.n; i++) {
		char flag[80];
		snprintf(flag, sizeof(flag), "--%s", pc_settings_table.keys[i].name);
		for (char *p = flag; *p; p++)
			if (*p == '_')
				*p = '-';
		cr_assert(strstr(buf, flag), "%s missing from help", flag);
	}
	free(buf);
}

/* The disk tier on needs a path and at least two regions; off, nothing
 * about it is checked. */
Test(settings, disk_tier_combinations_are_checked)
{
	struct pc_settings s;
	char why[PC_CFG_ERR_MAX];
	cr_assert_eq(pc_settings_defaults(&s, why, sizeof(why)), 0, "%s", why);
	s.disk_enabled = true;
	cr_assert_eq(pc_settings_validate(&s, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "disk_path: empty"), "%s", why);
	free(s.disk_path);
	s.disk_path = strdup("/tmp/pc-disk");
	s.disk_size = 100ull << 20;
	cr_assert_eq(pc_settings_validate(&s, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "less than two regions"), "%s", why);
	s.disk_size = 128ull << 20;
	cr_assert_eq(pc_settings_validate(&s, why, sizeof(why)), 0, "%s", why);
	s.disk_region_size = (1ull << 20) + 512;
	cr_assert_eq(pc_settings_validate(&s, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "not a multiple of 4kb"), "%s", why);
	s.disk_enabled = false;
	cr_assert_eq(pc_settings_validate(&s, why, sizeof(why)), 0, "%s", why);
	pc_settings_free(&s);
}
