/*
 * tests/unit/test_discovery_settings.c — the discovery settings: defaults
 * that detect a failure within 3 s, and the cross-key rules (static peers
 * and discovery are exclusive; member_ttl covers at least 3 heartbeats).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/settings.h"

static char err[PC_CFG_ERR_MAX];

/* Load argv (NULL-terminated) and validate: the validation's result. */
static int load_validate(char **argv)
{
	int argc = 0;
	while (argv[argc])
		argc++;
	char *envp[] = {NULL};
	struct pc_settings s;
	cr_assert_eq(pc_settings_load(&s, argc, argv, envp, err, sizeof(err)),
		     0, "%s", err);
	int ret = pc_settings_validate(&s, err, sizeof(err));
	pc_settings_free(&s);
	return ret;
}

Test(discovery_settings, defaults_detect_within_3s)
{
	struct pc_settings s;
	cr_assert_eq(pc_settings_defaults(&s, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.heartbeat_interval_ms, 500);
	cr_assert_eq(s.member_ttl_ms, 2000);
	/* removal after member_ttl, seen one heartbeat and a sweep later */
	cr_assert_lt(s.member_ttl_ms + s.heartbeat_interval_ms + 100, 3000);
	cr_assert_eq(s.max_masters, 3);
	cr_assert_str_eq(s.discovery_addr, "");
	pc_settings_free(&s);
}

Test(discovery_settings, peers_and_discovery_are_exclusive)
{
	char *both[] = {"peercached", "--peers", "127.0.0.1:1",
			"--discovery-addr", "127.0.0.1:2", NULL};
	cr_assert_eq(load_validate(both), -EINVAL);
	cr_assert(strstr(err, "both set"), "error was: %s", err);
	char *one[] = {"peercached", "--discovery-addr",
		       "127.0.0.1:2,127.0.0.1:3", NULL};
	cr_assert_eq(load_validate(one), 0, "%s", err);
}

Test(discovery_settings, ttl_covers_three_heartbeats)
{
	char *short_ttl[] = {"peercached", "--discovery-addr", "127.0.0.1:2",
			     "--heartbeat-interval", "1s", "--member-ttl",
			     "2s", NULL};
	cr_assert_eq(load_validate(short_ttl), -EINVAL);
	cr_assert(strstr(err, "at least 3 heartbeat_interval"), "error was: %s",
		  err);
	/* without discovery the pair means nothing and is not checked */
	char *off[] = {"peercached", "--heartbeat-interval", "1s",
		       "--member-ttl", "2s", NULL};
	cr_assert_eq(load_validate(off), 0, "%s", err);
}
