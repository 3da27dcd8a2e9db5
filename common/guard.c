/*
 * common/guard.c — see guard.h.
 *
 * A guarded copy arms a thread-local sigjmp_buf; the SIGBUS handler jumps
 * back to it only when the fault happened inside an armed copy on the
 * faulting thread (SIGBUS is delivered to the thread that faulted). The
 * jump leaves memcpy mid-way, which is safe: memcpy holds no locks and
 * allocates nothing, and the destination is treated as garbage by callers.
 */
#include "guard.h"
#include "copy.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

static _Thread_local sigjmp_buf *t_jmp;
static struct sigaction g_prev;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_err;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *j = t_jmp;
	if (j) {
		t_jmp = NULL;
		siglongjmp(*j, 1);
	}
	/* Not ours: behave as if we had never been installed. */
	if (g_prev.sa_flags & SA_SIGINFO && g_prev.sa_sigaction) {
		g_prev.sa_sigaction(sig, si, uc);
		return;
	}
	if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN &&
	    g_prev.sa_handler) {
		g_prev.sa_handler(sig);
		return;
	}
	signal(SIGBUS, SIG_DFL);
	raise(SIGBUS);
}

static void install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &g_prev) < 0)
		g_init_err = -errno;
}

int pc_guard_init(void)
{
	pthread_once(&g_once, install);
	return g_init_err;
}

int pc_guarded_run(void (*fn)(void *arg), void *arg)
{
	sigjmp_buf jb;
	pc_guard_init();
	/* volatile: the value must survive the jump */
	volatile int ret = 0;
	if (sigsetjmp(jb, 1) == 0) {
		t_jmp = &jb;
		fn(arg);
	} else {
		ret = -EFAULT;
	}
	t_jmp = NULL;
	return ret;
}

struct copy_args {
	void *dst;
	const void *src;
	size_t n;
};

static void do_copy(void *arg)
{
	struct copy_args *a = arg;
	pc_copy(a->dst, a->src, a->n);
}

int pc_guarded_copy(void *dst, const void *src, size_t n)
{
	struct copy_args a = {dst, src, n};
	return pc_guarded_run(do_copy, &a);
}
