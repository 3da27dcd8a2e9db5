/*
 * modules/transport_select.c — which data transport a node runs
 * (protocol=auto|tcp|rdma).
 *
 * Owns: the RDMA device probe. Main thread, once at start. libibverbs is
 * opened with dlopen so that a node without it still starts; the probe only
 * counts devices. This version has no RDMA data path: "auto" reports what it
 * found and picks TCP, "rdma" is refused by the settings check (not
 * supported), "tcp" skips the probe.
 */
#include <dlfcn.h>

#include "common/log.h"
#include "common/settings.h"
#include "modules/transport.h"

#define LOG_MOD "transport"

int tp_rdma_devices(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	int n = 0;
	if (!h)
		return 0;
	void **(*get)(int *) = (void **(*)(int *))dlsym(h,
							 "ibv_get_device_list");
	void (*put)(void **) = (void (*)(void **))dlsym(h,
							"ibv_free_device_list");
	void **list = get ? get(&n) : NULL;
	if (list && put)
		put(list);
	dlclose(h);
	return n;
}

const char *tp_select(const struct pc_settings *s)
{
	if (s->protocol == PC_PROTO_AUTO) {
		int n = tp_rdma_devices();
		PC_LOGI(LOG_MOD, "protocol=auto: %d RDMA device%s found; using "
			"TCP (the RDMA data path is not in this version)", n,
			n == 1 ? "" : "s");
	}
	return "tcp";
}
