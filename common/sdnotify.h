/*
 * common/sdnotify.h — tell systemd about the node's state (sd_notify(3)'s
 * protocol, without libsystemd).
 *
 * Owns: nothing; reads NOTIFY_SOCKET on every call. Thread-safety: any
 * thread (systemd checks the sender's process, not its thread). When the
 * node runs under a unit with Type=notify, systemd sets NOTIFY_SOCKET to a
 * datagram socket: a path ("/run/systemd/notify") or an abstract name
 * ("@..."). Each message is one datagram of "KEY=value" lines (READY=1,
 * RELOADING=1, STOPPING=1, STATUS=...).
 */
#ifndef PC_COMMON_SDNOTIFY_H
#define PC_COMMON_SDNOTIFY_H

#include "util.h"

/*
 * Send state ("KEY=value" lines, newline-separated) to the service manager.
 * Returns 1 when sent, 0 when NOTIFY_SOCKET is unset (not under a
 * Type=notify unit: nothing to do), or a negative errno: -EAFNOSUPPORT for
 * an address form other than a path or '@' name (vsock), -ENAMETOOLONG,
 * or the error of socket/sendto.
 */
int pc_sd_notify(const char *state);

/* printf-style pc_sd_notify; -EMSGSIZE when the text is over 1 KiB. */
int pc_sd_notifyf(const char *fmt, ...) PC_PRINTF(1, 2);

#endif /* PC_COMMON_SDNOTIFY_H */
