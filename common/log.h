/*
 * common/log.h — leveled, timestamped log lines tagged by thread and module.
 *
 * Owns: the process-wide log level and sink (stderr). Thread-safety: any thread
 * may log; each line is written with one write(2) so lines never interleave.
 * The thread tag is thread-local ("main", "r0", "r1", ...). Rule of use: one
 * line per state change; anything that can repeat per request goes through
 * PC_LOG_RL so a flood becomes one line plus a "suppressed N" count.
 */
#ifndef PC_COMMON_LOG_H
#define PC_COMMON_LOG_H

#include <stdint.h>

#include "util.h"

enum pc_log_level {
	PC_LOG_ERROR = 0,
	PC_LOG_WARN = 1,
	PC_LOG_INFO = 2,
	PC_LOG_DEBUG = 3,
	PC_LOG_TRACE = 4,
};

/* Set / read the threshold: lines above it are dropped before formatting. */
void pc_log_set_level(enum pc_log_level level);
enum pc_log_level pc_log_get_level(void);

/* Parse "error|warn|info|debug|trace"; 0 on success, -EINVAL otherwise. */
int pc_log_level_parse(const char *s, enum pc_log_level *out);
const char *pc_log_level_name(enum pc_log_level level);

/* Name the calling thread in log lines (copied, at most 15 characters). */
void pc_log_set_thread(const char *name);
const char *pc_log_thread(void);

/* Redirect output to fd (default 2). For tests that capture log lines. */
void pc_log_set_fd(int fd);

/* Emit one line: "<utc time> <LEVEL> [<thread>/<module>] <message>", or
 * under systemd's journal "<N><LEVEL> [<thread>/<module>] <message>" with N
 * the syslog priority (3 error, 4 warning, 6 info, 7 debug and trace) and
 * no time (journald records it). */
void pc_log(enum pc_log_level level, const char *module, const char *fmt, ...)
	PC_PRINTF(3, 4);

/*
 * Rate limiter for a log call site: at most one line per interval; the next
 * line that passes reports how many were suppressed in between.
 */
struct pc_ratelimit {
	uint64_t next_ns;    /* earliest time the next line may pass */
	uint64_t suppressed; /* lines dropped since the last one that passed */
};

/* Returns the number suppressed before this line plus one if the line may be
 * printed now, or 0 if it must be dropped. Safe from any thread. */
uint64_t pc_ratelimit_pass(struct pc_ratelimit *rl, uint64_t interval_ms);

#define PC_LOG_ENABLED(level) ((level) <= pc_log_get_level())

#define PC_LOGE(mod, ...) pc_log(PC_LOG_ERROR, mod, __VA_ARGS__)
#define PC_LOGW(mod, ...) pc_log(PC_LOG_WARN, mod, __VA_ARGS__)
#define PC_LOGI(mod, ...) pc_log(PC_LOG_INFO, mod, __VA_ARGS__)
#define PC_LOGD(mod, ...)                                                      \
	do {                                                                   \
		if (PC_LOG_ENABLED(PC_LOG_DEBUG))                              \
			pc_log(PC_LOG_DEBUG, mod, __VA_ARGS__);                \
	} while (0)

/*
 * Rate-limited log line: at most one per 10 s per call site; when lines were
 * dropped, the next one says how many ("(+N similar suppressed)").
 */
#define PC_LOG_RL(level, mod, fmt, ...)                                        \
	do {                                                                   \
		static struct pc_ratelimit pc_rl_;                             \
		uint64_t pc_n_ = pc_ratelimit_pass(&pc_rl_, 10000);            \
		if (pc_n_ > 1)                                                 \
			pc_log(level, mod, fmt " (+%llu similar suppressed)",  \
			       ##__VA_ARGS__, (unsigned long long)(pc_n_ - 1));\
		else if (pc_n_ == 1)                                           \
			pc_log(level, mod, fmt, ##__VA_ARGS__);                \
	} while (0)

#endif /* PC_COMMON_LOG_H */
