/*
 * reactor/fault.c — test-only fault injection (reactor/fault.h).
 */
#include "fault.h"

#ifdef PEERCACHE_FAULT_INJECTION
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/faultspec.h"
#include "common/log.h"

#define LOG_MOD "reactor"

static struct {
	pthread_once_t once;
	struct pc_fault_spec spec;
} g = {.once = PTHREAD_ONCE_INIT};

static _Thread_local uint64_t t_state;

static void fault_read_env(void)
{
	if (!pc_fault_spec_read("PEERCACHE_TEST_REACTOR_FAULTS", &g.spec))
		return;
	PC_LOGW(LOG_MOD, "test-only fault injection in the reactor is on "
		"(PEERCACHE_TEST_REACTOR_FAULTS=%s): refused submissions, "
		"short sends and reads, errors after I/O, receive buffers "
		"held back, at rate %.4f, seed %llu",
		getenv("PEERCACHE_TEST_REACTOR_FAULTS"), g.spec.rate,
		(unsigned long long)g.spec.seed);
}

void rx_fault_init(void)
{
	pthread_once(&g.once, fault_read_env);
}

static uint64_t draw(void)
{
	return pc_fault_draw(&g.spec, &t_state);
}

static bool hit(void)
{
	rx_fault_init();
	return pc_fault_hit(&g.spec, &t_state);
}

bool rx_fault_sqe(void)
{
	return hit();
}

size_t rx_fault_len(size_t len)
{
	if (len < 2 || !hit())
		return len;
	return 1 + (size_t)(draw() % (len - 1));
}

int rx_fault_err(void)
{
	static const int errs[] = {-ECONNRESET, -ETIMEDOUT, -EIO};
	return errs[draw() % (sizeof(errs) / sizeof(errs[0]))];
}

int rx_fault_res(int res)
{
	return res >= 0 && hit() ? rx_fault_err() : res;
}

/* A hit holds the buffers back for the next HOLD_PASSES flushes too, long
 * enough for a busy loop to drain a small ring. */
#define HOLD_PASSES 32
static _Thread_local unsigned t_hold;

bool rx_fault_hold(void)
{
	if (t_hold) {
		t_hold--;
		return true;
	}
	if (!hit())
		return false;
	t_hold = HOLD_PASSES;
	return true;
}
#endif
