/*
 * server/params.c — reactor parameters from settings.
 *
 * Owns: nothing; a pure mapping, so tests and the daemon size reactors alike.
 */
#include "common/settings.h"
#include "reactor/reactor.h"
#include "server/server.h"

void pc_server_reactor_params(const struct pc_settings *s, struct rx_params *p)
{
	rx_params_default(p);
	p->sq_entries = (unsigned)s->reactor_sq_entries;
	p->ops_max = (unsigned)s->reactor_ops_max;
	p->buf_count = (unsigned)s->reactor_buf_count;
	p->buf_bytes = (unsigned)s->reactor_buf_bytes;
	p->conn_out_max = s->conn_out_max;
	if (p->conn_out_high > p->conn_out_max / 2)
		p->conn_out_high = p->conn_out_max / 2;
	if (p->conn_out_low > p->conn_out_high / 2)
		p->conn_out_low = p->conn_out_high / 2;
	p->shutdown_grace_ms = (unsigned)s->shutdown_grace_ms;
	p->nice = (int)s->reactor_nice;
	p->idle_poll_ns = (uint64_t)s->reactor_idle_poll_us * 1000u;
}
