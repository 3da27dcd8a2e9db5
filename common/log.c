/*
 * common/log.c — the log sink.
 *
 * Owns: the global level (atomic), the output fd (atomic) and the per-thread
 * tag (thread-local). Each line is formatted into a stack buffer and written
 * with one write(2): lines from different threads never interleave. A line
 * longer than the buffer is cut and marked with "...[truncated]" so nothing
 * is cut silently.
 *
 * Journal form: when stderr is connected to systemd's journal (JOURNAL_STREAM
 * names the device and inode of the log fd, sd_journal_stream_fd's
 * convention), a line starts with its syslog priority "<N>" and carries no
 * timestamp: journald parses the priority and stamps the time itself. The
 * check runs once per output fd (again after pc_log_set_fd).
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int g_level = PC_LOG_INFO;
static int g_fd = 2;
static _Thread_local char t_thread[16] = "main";
/* Whether g_fd is the journal: -1 not checked yet, 0 no, 1 yes. */
static int g_journal = -1;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG",
					  "TRACE"};
/* syslog priorities: err, warning, info, debug (trace too). */
static const char journal_prio[] = {'3', '4', '6', '7', '7'};

void pc_log_set_level(enum pc_log_level level)
{
	__atomic_store_n(&g_level, (int)level, __ATOMIC_RELAXED);
}

enum pc_log_level pc_log_get_level(void)
{
	return (enum pc_log_level)__atomic_load_n(&g_level, __ATOMIC_RELAXED);
}

const char *pc_log_level_name(enum pc_log_level level)
{
	if ((unsigned)level >= PC_ARRAY_LEN(level_names))
		return "?";
	return level_names[level];
}

int pc_log_level_parse(const char *s, enum pc_log_level *out)
{
	for (unsigned i = 0; i < PC_ARRAY_LEN(level_names); i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum pc_log_level)i;
			return 0;
		}
	}
	if (strcasecmp(s, "warning") == 0) {
		*out = PC_LOG_WARN;
		return 0;
	}
	return -EINVAL;
}

void pc_log_set_thread(const char *name)
{
	snprintf(t_thread, sizeof(t_thread), "%s", name);
}

const char *pc_log_thread(void)
{
	return t_thread;
}

void pc_log_set_fd(int fd)
{
	__atomic_store_n(&g_fd, fd, __ATOMIC_RELAXED);
	__atomic_store_n(&g_journal, -1, __ATOMIC_RELAXED);
}

/* JOURNAL_STREAM is "<st_dev>:<st_ino>" of the stream systemd connected;
 * it is inherited, so it only counts when fd is still that stream. */
static bool fd_is_journal(int fd)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 ||
	    fstat(fd, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev &&
	       (unsigned long long)st.st_ino == ino;
}

/* Whether lines take the journal form (checked once per output fd). */
static bool log_journal(void)
{
	int j = __atomic_load_n(&g_journal, __ATOMIC_RELAXED);
	if (j < 0) {
		j = fd_is_journal(__atomic_load_n(&g_fd, __ATOMIC_RELAXED));
		__atomic_store_n(&g_journal, j, __ATOMIC_RELAXED);
	}
	return j;
}

void pc_log(enum pc_log_level level, const char *module, const char *fmt, ...)
{
	if (!PC_LOG_ENABLED(level))
		return;
	int saved_errno = errno;
	char line[2048];
	static const char trunc[] = "...[truncated]\n";
	int n;
	if (log_journal()) {
		n = snprintf(line, sizeof(line), "<%c>%-5s [%s/%s] ",
			     journal_prio[(unsigned)level <
					  sizeof(journal_prio) ? level : 0],
			     pc_log_level_name(level), t_thread,
			     module ? module : "-");
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = snprintf(line, sizeof(line),
			     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s/%s] ",
			     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			     tm.tm_hour, tm.tm_min, tm.tm_sec,
			     ts.tv_nsec / 1000000, pc_log_level_name(level),
			     t_thread, module ? module : "-");
	}
	if (n < 0)
		n = 0;
	size_t room = sizeof(line) - sizeof(trunc);
	size_t len = (size_t)n < room ? (size_t)n : room;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if (len + (size_t)m + 1 > room) {
		memcpy(line + room, trunc, sizeof(trunc) - 1);
		len = room + sizeof(trunc) - 1;
	} else {
		len += (size_t)m;
		line[len++] = '\n';
	}
	int fd = __atomic_load_n(&g_fd, __ATOMIC_RELAXED);
	ssize_t w = write(fd, line, len);
	(void)w;
	errno = saved_errno;
}

uint64_t pc_ratelimit_pass(struct pc_ratelimit *rl, uint64_t interval_ms)
{
	uint64_t now = pc_now_ns();
	uint64_t next = __atomic_load_n(&rl->next_ns, __ATOMIC_RELAXED);
	if (now >= next &&
	    __atomic_compare_exchange_n(&rl->next_ns, &next,
					now + interval_ms * 1000000ull, 0,
					__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
		return __atomic_exchange_n(&rl->suppressed, 0,
					   __ATOMIC_RELAXED) + 1;
	}
	__atomic_add_fetch(&rl->suppressed, 1, __ATOMIC_RELAXED);
	return 0;
}
