/*
 * tests/unit/test_compat.c — the original PeerCache's key names (common/
 * compat.c): every alias row is well formed, a mapped key sets ours from the
 * file, the environment and the command line, a no-effect key is logged once
 * and never an error (unless its value is one the original refused too), and
 * conflicts follow the documented rule.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/compat.h"
#include "common/log.h"
#include "common/settings.h"
#include "testutil.h"

static char err[PC_CFG_ERR_MAX];
static char logs[16384];

/* Load with the log captured into logs[]; returns pc_settings_load's. */
static int load(struct pc_settings *s, int argc, char **argv, char **envp)
{
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pc_log_set_fd(pfd[1]);
	pc_log_set_level(PC_LOG_INFO); /* testutil quiets INFO */
	int r = pc_settings_load(s, argc, argv, envp, err, sizeof(err));
	pc_log_set_fd(2);
	close(pfd[1]);
	ssize_t n = read(pfd[0], logs, sizeof(logs) - 1);
	close(pfd[0]);
	logs[n > 0 ? n : 0] = '\0';
	return r;
}

/* Load a config file holding text, then the options opt1 opt2 (or NULL). */
static int load_conf(struct pc_settings *s, const char *text, char *opt1,
		     char *opt2, char **envp)
{
	char *path = tu_write_temp(text), cfgarg[300];
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", path);
	char *argv[] = {"peercached", cfgarg, opt1, opt2, NULL};
	int r = load(s, opt1 ? (opt2 ? 4 : 3) : 2, argv, envp);
	unlink(path);
	free(path);
	return r;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

Test(compat, every_row_is_well_formed)
{
	for (size_t i = 0; i < pc_compat_aliases_n; i++) {
		const struct pc_compat_alias *a = &pc_compat_aliases[i];
		cr_assert_null(pc_cfg_find(&pc_settings_table, a->name),
			       "%s shadows one of our keys", a->name);
		cr_assert_eq(strspn(a->name, "abcdefghijklmnopqrstuvwxyz_"),
			     strlen(a->name), "%s is not normalized", a->name);
		cr_assert(a->note && *a->note, "%s has no note", a->name);
		if (a->ours)
			cr_assert_not_null(pc_cfg_find(&pc_settings_table,
						       a->ours),
					   "%s -> unknown key %s", a->name,
					   a->ours);
		for (size_t j = 0; j < i; j++)
			cr_assert_str_neq(a->name, pc_compat_aliases[j].name);
	}
}

Test(compat, an_original_config_file_sets_our_keys)
{
	struct pc_settings s;
	char *envp[] = {NULL};
	int r = load_conf(&s, "global_segment_size = 8gb\n"
			  "local_hostname = 127.0.0.5\n"
			  "control_port = 0\n"
			  "rdma_port = 0\n"
			  "control_bind_host = 127.0.0.1\n"
			  "metrics_bind_host = 127.0.0.1\n"
			  "heartbeat_interval = 2.0\n"
			  "member_ttl = 6.0\n"
			  "disk_enabled = true\n"
			  "disk_path = /data/peercache\n"
			  "disk_size = 100gb\n"
			  "vnodes = 160\n", NULL, NULL, envp);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(s.pool_size, 8ull << 30);
	cr_assert_str_eq(s.advertise_host, "127.0.0.5");
	cr_assert_eq(s.rpc_port, 0);
	cr_assert_eq(s.data_port, 0);
	cr_assert_str_eq(s.bind, "127.0.0.1");
	cr_assert_str_eq(s.metrics_bind, "127.0.0.1");
	cr_assert_eq(s.heartbeat_interval_ms, 2000);
	cr_assert_eq(s.member_ttl_ms, 6000);
	cr_assert(strstr(logs, "global_segment_size = 8gb"), "%s", logs);
	cr_assert(strstr(logs, "sets pool_size = 8gb"), "%s", logs);
	cr_assert_eq(pc_settings_validate(&s, err, sizeof(err)), 0, "%s", err);
	pc_settings_free(&s);
}

Test(compat, no_effect_keys_are_logged_once_never_an_error)
{
	struct pc_settings s;
	char *envp[] = {"PEERCACHE_RDMA_OP_TIMEOUT_MS=2000",
			"PEERCACHE_ROLE=inference", NULL};
	int r = load_conf(&s, "role = storage\n"
			  "write_policy = local\n"
			  "device_names = mlx5_0,mlx5_1\n"
			  "ib_port = 1\n"
			  "gid_index = -1\n"
			  "directory_read_cache_ttl = 0.5\n", NULL, NULL,
			  envp);
	cr_assert_eq(r, 0, "%s", err);
	static const char *const quiet[] = {"role = inference",
					    "write_policy = local"};
	for (size_t i = 0; i < sizeof(quiet) / sizeof(quiet[0]); i++) {
		char want[128];
		snprintf(want, sizeof(want), "no effect: %s", quiet[i]);
		cr_assert_eq(count(logs, want), 1, "%s:\n%s", want, logs);
	}
	cr_assert_eq(count(logs, "no effect: role"), 1, "env beats file, once");
	cr_assert_null(strstr(logs, "unknown environment"), "%s", logs);
	/* The RDMA transport's own keys take effect, quietly; the
	 * original's PEERCACHE_RDMA_OP_TIMEOUT_MS is one of them. */
	cr_assert_eq(s.rdma_op_timeout_ms, 2000);
	cr_assert_null(strstr(logs, "no effect: rdma_op_timeout_ms"), "%s",
		       logs);
	cr_assert_eq(s.ib_port, 1);
	cr_assert_eq(s.gid_index, -1);
	cr_assert_null(strstr(logs, "no effect: ib_port"), "%s", logs);
	/* device_names drives one rail per device. */
	cr_assert_str_eq(s.device_names, "mlx5_0,mlx5_1");
	cr_assert_null(strstr(logs, "no effect: device_names"), "%s", logs);
	/* So does the directory read cache (seconds, as the original's). */
	cr_assert_eq(s.directory_read_cache_ttl_ms, 500);
	cr_assert_null(strstr(logs, "no effect: directory_read_cache_ttl"),
		       "%s", logs);
	pc_settings_free(&s);
}

/* argv (NULL-terminated) must fail to load with err holding both needles. */
static void expect_error(char **argv, const char *a, const char *b)
{
	char *envp[] = {NULL};
	int argc = 0;
	while (argv[argc])
		argc++;
	struct pc_settings s;
	cr_assert_lt(load(&s, argc, argv, envp), 0, "%s", argv[1]);
	cr_assert(strstr(err, a) && strstr(err, b), "%s", err);
	pc_settings_free(&s);
}

Test(compat, bad_values_of_the_original_keys_are_still_errors)
{
	char *a1[] = {"peercached", "--ib-port", "0", NULL};
	expect_error(a1, "ib_port: '0'", "1..255");
	char *a2[] = {"peercached", "--role=banana", NULL};
	expect_error(a2, "role: 'banana'", "auto,inference,storage");
	char *a3[] = {"peercached", "--global-segment-size", "lots", NULL};
	expect_error(a3, "pool_size: 'lots' is not a size",
		     "given as global_segment_size");
	char *a4[] = {"peercached", "--local-hostname", NULL};
	expect_error(a4, "local_hostname needs a value", "command line");
	char *a5[] = {"peercached", "--global-segmnt-size", "1gb", NULL};
	expect_error(a5, "unknown key", "global-segmnt-size");
}

Test(compat, the_original_launch_line_parses)
{
	char *argv[] = {"peercached", "--discovery-addr", "127.0.0.1:31998",
			"--global-segment-size", "64mb", "--disk-path", "/tmp/x",
			"--no-disk", "--device-name", "mlx5_0", "--node-id",
			"n1", NULL};
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(load(&s, 12, argv, envp), 0, "%s", err);
	cr_assert_eq(s.pool_size, 64ull << 20);
	cr_assert_not(s.disk_enabled);
	cr_assert_str_eq(s.node_id, "n1");
	cr_assert_str_eq(s.discovery_addr, "127.0.0.1:31998");
	cr_assert_str_eq(s.device_name, "mlx5_0");
	cr_assert_eq(count(logs, "no effect: device_name"), 0, "%s", logs);
	pc_settings_free(&s);
	char *a2[] = {"peercached", "--disk-enabled", "--no-disk", NULL};
	cr_assert_eq(load(&s, 3, a2, envp), 0, "%s", err);
	cr_assert(s.disk_enabled, "our key wins over --no-disk");
	cr_assert(strstr(logs, "no_disk = true (command line) ignored: "
			       "disk_enabled is set too"), "%s", logs);
	pc_settings_free(&s);
}

Test(compat, conflicts_follow_the_documented_rule)
{
	struct pc_settings s;
	char *envp[] = {"PEERCACHE_LOCAL_HOSTNAME=127.0.0.8", NULL};
	int r = load_conf(&s, "pool_size = 32mb\n"
			  "global_segment_size = 8gb\n"
			  "meta_bind_host = 127.0.0.3\n"
			  "control_bind_host = 127.0.0.2\n"
			  "rdma_bind_host = 127.0.0.2\n"
			  "local_hostname = 127.0.0.9\n",
			  "--local-hostname", "127.0.0.7", envp);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(s.pool_size, 32ull << 20, "our key wins");
	cr_assert(strstr(logs, "global_segment_size = 8gb") &&
		  strstr(logs, "ignored: pool_size is set too"), "%s", logs);
	cr_assert_str_eq(s.bind, "127.0.0.2", "first alias in the table");
	cr_assert_eq(count(logs, "meta_bind_host = 127.0.0.3"), 1, "%s",
		     logs);
	cr_assert_null(strstr(logs, "rdma_bind_host = 127.0.0.2 ("),
		       "an agreeing alias is quiet: %s", logs);
	cr_assert_str_eq(s.advertise_host, "127.0.0.7",
			 "command line > environment > file");
	pc_settings_free(&s);
}
