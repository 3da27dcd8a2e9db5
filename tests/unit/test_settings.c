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
#include "common/util.h"
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
	cr_assert_eq(s.rdma_op_timeout_ms, 5000, "the original's 5 s");
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

/* The original's environment variable is this key's: same name, same
 * unit (milliseconds); 0 turns the RDMA operation timeout off. */
Test(settings, rdma_op_timeout_from_the_original_environment)
{
	char *argv[] = {"peercached", NULL};
	char *envp[] = {"PEERCACHE_RDMA_OP_TIMEOUT_MS=2000", NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, 1, argv, envp, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(s.rdma_op_timeout_ms, 2000);
	pc_settings_free(&s);
	char *off[] = {"peercached", "--rdma-op-timeout-ms", "0", NULL};
	cr_assert_eq(pc_settings_load(&s, 3, off, envp, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(s.rdma_op_timeout_ms, 0, "command line wins; 0 = off");
	pc_settings_free(&s);
	char *bad[] = {"PEERCACHE_RDMA_OP_TIMEOUT_MS=soon", NULL};
	cr_assert_lt(pc_settings_load(&s, 1, argv, bad, err, sizeof(err)), 0);
	cr_assert(strstr(err, "rdma_op_timeout_ms: 'soon'"), "%s", err);
	pc_settings_free(&s);
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

/* What pc_settings_warn_inactive logs for argv (a NUL-terminated copy). */
static void warnings_for(char **argv, int argc, char *out, size_t cap)
{
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pc_log_set_fd(pfd[1]);
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, argc, argv, envp, err, sizeof(err)),
		     0, "%s", err);
	pc_settings_warn_inactive(&s);
	pc_log_set_fd(2);
	close(pfd[1]);
	ssize_t n = read(pfd[0], out, cap - 1);
	close(pfd[0]);
	out[n > 0 ? n : 0] = '\0';
	pc_settings_free(&s);
}

Test(settings, slot_settings_without_effect_are_warned_about)
{
	char out[4096];
	char *p2p[] = {"peercached", "--slot-max-page-bytes", "16mb",
		       "--slot-ways", "5", NULL};
	warnings_for(p2p, 5, out, sizeof(out));
	cr_assert(strstr(out, "slot_max_page_bytes is set but has no effect: "
			      "it shapes the slot region of mode = slotmap"),
		  "%s", out);
	cr_assert(strstr(out, "slot_ways is set but has no effect"), "%s", out);
	cr_assert_null(strstr(out, "slot_num_buckets"),
		       "unchanged keys are quiet");
	char *slot[] = {"peercached", "--mode", "slotmap", "--slot-ways", "5",
			"--slot-num-buckets", "100", NULL};
	warnings_for(slot, 7, out, sizeof(out));
	cr_assert_eq(out[0], '\0', "in slotmap mode they count: %s", out);
	char *list[] = {"peercached", "--mode", "slotmap", "--slot-ways", "5",
			"--slot-classes", "64kb:2:100%", NULL};
	warnings_for(list, 7, out, sizeof(out));
	cr_assert(strstr(out, "slot_ways is set but has no effect: "
			      "slot_classes lists the classes"), "%s", out);
	cr_assert_null(strstr(out, "slot_classes is set"), "%s", out);
}

/* Settings loaded from argv and validated: 0 or the error in err. */
static int slot_validate(struct pc_settings *s, char **argv, int argc)
{
	char *envp[] = {NULL};
	cr_assert_eq(pc_settings_load(s, argc, argv, envp, err, sizeof(err)),
		     0, "%s", err);
	return pc_settings_validate(s, err, sizeof(err));
}

static void expect_class(const struct pc_settings *s, unsigned i,
			 uint64_t size, uint32_t ways, uint64_t buckets,
			 uint32_t share_pm)
{
	cr_assert_lt(i, s->slot_ncls);
	const struct pc_slot_class *c = &s->slot_cls[i];
	cr_assert_eq(c->max_payload, size, "class %u size %llu", i,
		     (unsigned long long)c->max_payload);
	cr_assert_eq(c->ways, ways, "class %u ways", i);
	cr_assert_eq(c->buckets, buckets, "class %u buckets", i);
	cr_assert_eq(c->share_pm, share_pm, "class %u share", i);
}

Test(settings, slotmap_is_accepted_with_the_default_classes)
{
	struct pc_settings s;
	char *argv[] = {"peercached", "--mode", "slotmap", NULL};
	cr_assert_eq(slot_validate(&s, argv, 3), 0, "%s", err);
	cr_assert_eq(s.mode, PC_MODE_SLOTMAP);
	cr_assert_str_eq(s.slot_classes, "auto");
	/* 8mb > 256kb: small pages on 10 %, MLA-sized slots on 35 %, the
	 * largest on 55 % */
	cr_assert_eq(s.slot_ncls, 3);
	expect_class(&s, 0, 16ull << 10, 4, 0, 100);
	expect_class(&s, 1, 256ull << 10, 4, 0, 350);
	expect_class(&s, 2, 8ull << 20, 4, 0, 550);
	pc_settings_free(&s);
}

/* auto with pages of at most 256kb: the small class and the largest; at
 * most 16kb, and slot_num_buckets (the original's geometry): one class */
Test(settings, single_slot_classes)
{
	struct pc_settings s;
	char *small[] = {"peercached", "--slot-max-page-bytes", "256kb",
			 "--slot-ways", "8", NULL};
	cr_assert_eq(slot_validate(&s, small, 5), 0, "%s", err);
	cr_assert_eq(s.slot_ncls, 2);
	expect_class(&s, 0, 16ull << 10, 8, 0, 100);
	expect_class(&s, 1, 256ull << 10, 8, 0, 900);
	pc_settings_free(&s);
	char *tiny[] = {"peercached", "--slot-max-page-bytes", "16kb", NULL};
	cr_assert_eq(slot_validate(&s, tiny, 3), 0, "%s", err);
	cr_assert_eq(s.slot_ncls, 1);
	expect_class(&s, 0, 16ull << 10, 4, 0, 1000);
	pc_settings_free(&s);
	char *orig[] = {"peercached", "--slot-num-buckets", "1023",
			"--slot-max-page-bytes", "4mb", "--slot-ways", "2",
			NULL};
	cr_assert_eq(slot_validate(&s, orig, 7), 0, "%s", err);
	cr_assert_eq(s.slot_ncls, 1);
	expect_class(&s, 0, 4ull << 20, 2, 1023, 0);
	pc_settings_free(&s);
}

Test(settings, slot_classes_list_is_parsed)
{
	struct pc_settings s;
	char *argv[] = {"peercached", "--slot-classes",
			"16kb:8:25%, 4mb:4:1000 ,1gb:1:75%", NULL};
	cr_assert_eq(slot_validate(&s, argv, 3), 0, "%s", err);
	cr_assert_eq(s.slot_ncls, 3);
	expect_class(&s, 0, 16ull << 10, 8, 0, 250);
	expect_class(&s, 1, 4ull << 20, 4, 1000, 0);
	expect_class(&s, 2, 1ull << 30, 1, 0, 750);
	pc_settings_free(&s);
	char *eight[] = {"peercached", "--slot-classes",
			 "4kb:1:1,8kb:1:1,16kb:1:1,32kb:1:1,64kb:1:1,"
			 "128kb:1:1,256kb:1:1,512kb:64:100%", NULL};
	cr_assert_eq(slot_validate(&s, eight, 3), 0, "%s", err);
	cr_assert_eq(s.slot_ncls, 8);
	expect_class(&s, 7, 512ull << 10, 64, 0, 1000);
	pc_settings_free(&s);
}

Test(settings, bad_slot_settings_are_refused)
{
	/* slot_classes values and what their refusal says */
	static const char *const cases[][2] = {
		{"", "expected SIZE:WAYS:SHARE"},
		{"Auto", "class 1 ('Auto'): expected"},
		{"8mb:4", "expected SIZE:WAYS:SHARE"},
		{"8mb:4:40%:1", "three fields"},
		{"8mb:4:40%,", "class 2 (''): expected"},
		{"8 mb:4:40%", "expected SIZE:WAYS:SHARE"},
		{"lots:4:40%", "SIZE is not a size"},
		{"2kb:4:40%", "within 4kb..1gb"},
		{"2gb:4:40%", "within 4kb..1gb"},
		{"8mb:0:40%", "WAYS is not a whole number within 1..64"},
		{"8mb:65:40%", "within 1..64"},
		{"8mb:+4:40%", "WAYS"},
		{"8mb:4:0%", "within 1%..100%"},
		{"8mb:4:101%", "within 1%..100%"},
		{"8mb:4:4.5%", "whole percent"},
		{"8mb:4:0", "bucket count"},
		{"8mb:4:x", "bucket count"},
		{"8mb:4:%", "percent"},
		{"256kb:4:40%,8mb:4:61%", "add up to 101%, more than the region"},
		{"8mb:4:40%,8192kb:2:10",
		 "class 2 ('8192kb:2:10'): two classes of one SIZE"},
		{"4kb:1:1,8kb:1:1,16kb:1:1,32kb:1:1,64kb:1:1,"
		 "128kb:1:1,256kb:1:1,512kb:1:1,1mb:1:1",
		 "class 9 ('1mb:1:1'): more than 8 classes"},
	};
	for (size_t i = 0; i < PC_ARRAY_LEN(cases); i++) {
		struct pc_settings s;
		char *argv[] = {"peercached", "--slot-classes",
				(char *)cases[i][0], NULL};
		cr_assert_eq(slot_validate(&s, argv, 3), -EINVAL,
			     "'%s' accepted", cases[i][0]);
		cr_assert(strstr(err, cases[i][1]), "%s: error was: %s",
			  cases[i][0], err);
		cr_assert(strstr(err, "slot_classes: '"), "%s", err);
		cr_assert_null(strchr(err, '\n'), "one line");
		pc_settings_free(&s);
	}
}

Test(settings, slot_num_buckets_and_a_class_list_are_refused_together)
{
	struct pc_settings s;
	char *argv[] = {"peercached", "--slot-num-buckets", "100",
			"--slot-classes", "8mb:4:100%", NULL};
	cr_assert_eq(slot_validate(&s, argv, 5), -EINVAL);
	cr_assert(strstr(err, "slot_num_buckets (100) and slot_classes "
			      "('8mb:4:100%') are both set"), "%s", err);
	pc_settings_free(&s);
	/* out of the key's own range: refused while loading */
	char *ways[] = {"peercached", "--slot-ways", "65", NULL};
	char *envp[] = {NULL};
	cr_assert_eq(pc_settings_load(&s, 3, ways, envp, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "slot_ways: '65' is out of range"), "%s", err);
	pc_settings_free(&s);
}

Test(settings, slotmap_refuses_the_disk_tier)
{
	struct pc_settings s;
	char *argv[] = {"peercached", "--mode", "slotmap", "--disk-enabled",
			"--disk-path", "/tmp/pc-disk", "--disk-size", "1gb",
			NULL};
	cr_assert_eq(slot_validate(&s, argv, 8), -EINVAL);
	cr_assert(strstr(err, "disk tier is not supported in slotmap mode"),
		  "%s", err);
	pc_settings_free(&s);
	/* the original's no_disk = false means the same */
	char *path = tu_write_temp("mode = slotmap\nno_disk = false\n"
				   "disk_path = /tmp/pc-disk\n"
				   "disk_size = 1gb\n");
	char cfgarg[64];
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", path);
	char *file[] = {"peercached", cfgarg, NULL};
	cr_assert_eq(slot_validate(&s, file, 2), -EINVAL);
	cr_assert(strstr(err, "not supported in slotmap mode"), "%s", err);
	pc_settings_free(&s);
	unlink(path);
	free(path);
	argv[2] = "p2p";
	cr_assert_eq(slot_validate(&s, argv, 8), 0, "%s", err);
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

Test(settings, device_names_lists_each_rail_once)
{
	struct {
		char *val;
		int ret;
		const char *want;
	} cases[] = {
		{"mlx5_0,mlx5_1", 0, NULL},
		{" mlx5_0 , mlx5_1 ,mlx5_2", 0, NULL},
		{"mlx5_0,mlx5_1,mlx5_0", -EINVAL, "lists mlx5_0 twice"},
		{"mlx5_0,,mlx5_1", -EINVAL, "an empty name"},
		{"a,b,c,d,e,f,g,h,i", -EINVAL, "at most 8 devices"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct pc_settings s;
		char *argv[] = {"peercached", "--device-names", cases[i].val,
				NULL};
		cr_assert_eq(slot_validate(&s, argv, 3), cases[i].ret,
			     "%s: %s", cases[i].val, err);
		if (cases[i].want)
			cr_assert(strstr(err, cases[i].want), "%s", err);
		else
			cr_assert_str_eq(s.device_names, cases[i].val);
		pc_settings_free(&s);
	}
}
