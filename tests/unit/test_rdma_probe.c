/*
 * tests/unit/test_rdma_probe.c — how the RDMA transport
 * (modules/transport_rdma.h) finds its devices: probing (no device, a port
 * down, a named device, too few SGEs, a GID index), device_names (order,
 * duplicates, unusable and address-less devices) and a device's network
 * address from sysfs (rv_netdev_addr, modules/rdma_verbs.h).
 *
 * Owns: nothing shared; every case runs on the verbs simulation
 * (tests/fake/rdma_sim.h) and leaves the fabric empty.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/transport_rdma.h"
#include "testutil.h"
#include "tests/fake/rdma_sim.h"

/* Nothing of the fabric is left. */
static void fabric_clean(void)
{
	char left[256];
	cr_assert_eq(rsim_leftovers(left, sizeof(left)), 0, "left: %s", left);
}

/* ------------------------------------------------------- device probing */

static struct tp_rdma_cfg probe_cfg(void)
{
	return (struct tp_rdma_cfg){.api = rsim_api(), .ib_port = 1,
				    .gid_index = 0};
}

static void probe_says(const struct tp_rdma_cfg *cfg, int want,
		       const char *needle)
{
	char why[200] = "";
	int n = tp_rdma_probe(cfg, why, sizeof(why));
	cr_assert_eq(n, want, "probe: %d (%s)", n, why);
	cr_assert(strstr(why, needle), "probe said \"%s\", not \"%s\"", why,
		  needle);
}

static void node_refused(const struct tp_rdma_cfg *cfg)
{
	struct tp_node *tn = NULL;
	cr_assert_eq(tp_rdma_node_new(cfg, &tn), -ENODEV);
	cr_assert_null(tn);
	fabric_clean();
}

Test(transport_rdma_probe, no_device)
{
	cr_assert_eq(rsim_reset(), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	probe_says(&cfg, 0, "no RDMA device");
	node_refused(&cfg);
	cfg.device = "mlx5_0";
	probe_says(&cfg, 0, "no RDMA device");
	node_refused(&cfg);
}

Test(transport_rdma_probe, port_down)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_DOWN), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	probe_says(&cfg, 0, "not active");
	probe_says(&cfg, 0, "sim0");
	node_refused(&cfg);
	cfg.ib_port = 2;
	probe_says(&cfg, 0, "no port 2");
	cr_assert_eq(rsim_reset(), 0);
}

Test(transport_rdma_probe, named_device)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_add_device("sim1", IBV_PORT_DOWN), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	cfg.device = "mlx5_7";
	probe_says(&cfg, 0, "mlx5_7");
	node_refused(&cfg);
	cfg.device = "sim1";
	probe_says(&cfg, 0, "not active");
	node_refused(&cfg);
	cfg.device = "sim0";
	probe_says(&cfg, 1, "sim0");
	cfg.device = NULL;
	probe_says(&cfg, 1, "sim0");
	cr_assert_eq(rsim_add_device("sim2", IBV_PORT_ACTIVE), 0);
	probe_says(&cfg, 2, "sim0");
	/* A node opens the device, and gives everything back. */
	struct tp_node *tn = NULL;
	cfg.device = "sim2";
	cr_assert_eq(tp_rdma_node_new(&cfg, &tn), 0);
	tp_rdma_node_free(tn);
	fabric_clean();
	cr_assert_eq(rsim_reset(), 0);
}

/* A device that cannot scatter a READ into a page's header and payload
 * (two SGEs) is not usable: probing says why, a node refuses it. */
Test(transport_rdma_probe, too_few_sges)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	cr_assert_eq(rsim_set_limits("sim0", &(struct rsim_limits){
						     .max_sge_rd = 1}), 0);
	probe_says(&cfg, 0, "2 needed");
	node_refused(&cfg);
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_set_limits("sim0", &(struct rsim_limits){
						     .max_sge = 1}), 0);
	probe_says(&cfg, 0, "1 SGEs per WR");
	node_refused(&cfg);
	/* A second device that can is used instead. */
	cr_assert_eq(rsim_add_device("sim1", IBV_PORT_ACTIVE), 0);
	probe_says(&cfg, 1, "sim1 port 1 active");
	cr_assert_eq(rsim_reset(), 0);
}

Test(transport_rdma_probe, gid_index)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	cfg.gid_index = 15;
	probe_says(&cfg, 1, "active");
	cfg.gid_index = -1;
	probe_says(&cfg, 1, "active");
	cfg.gid_index = 16;
	probe_says(&cfg, 0, "gid_index 16");
	node_refused(&cfg);
	cr_assert_eq(rsim_reset(), 0);
}

/* ------------------------------------------- a device's network address */

static void mkpath(const char *root, const char *rel)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/%s'", root, rel);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void put(const char *root, const char *rel, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	FILE *fp = fopen(path, "w");
	cr_assert(fp, "%s", path);
	fputs(text, fp);
	fclose(fp);
}

static void addr_is(const char *root, const char *dev, int want_err,
		    const char *want_ip)
{
	struct sockaddr_storage ss;
	int err = rv_netdev_addr(root, dev, 1, AF_INET, &ss);
	cr_assert_eq(err, want_err, "%s: %s", dev, strerror(err));
	if (want_ip) {
		char ip[64];
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip,
			  sizeof(ip));
		cr_assert_str_eq(ip, want_ip);
		cr_assert_eq(((struct sockaddr_in *)&ss)->sin_port, 0);
	}
}

/* The real table finds a rail's address through sysfs: a RoCE port's GID
 * table names its network devices, an IPoIB device lists its own; the
 * loopback interface stands in for a NIC here. */
Test(transport_rdma_probe, a_device_address_from_sysfs)
{
	char root[] = "/tmp/pc-sysfs-XXXXXX";
	cr_assert(mkdtemp(root));
	/* RoCE: GID 0's netdev is gone, GID 1's is up. */
	mkpath(root, "class/infiniband/roce0/ports/1/gid_attrs/ndevs");
	put(root, "class/infiniband/roce0/ports/1/gid_attrs/ndevs/0",
	    "pcnosuch0\n");
	put(root, "class/infiniband/roce0/ports/1/gid_attrs/ndevs/1", "lo\n");
	addr_is(root, "roce0", 0, "127.0.0.1");
	/* IPoIB: no GID table entries, a net directory. */
	mkpath(root, "class/infiniband/ib0/device/net/lo");
	addr_is(root, "ib0", 0, "127.0.0.1");
	/* Nothing that has an address. */
	mkpath(root, "class/infiniband/bare0/ports/1/gid_attrs/ndevs");
	put(root, "class/infiniband/bare0/ports/1/gid_attrs/ndevs/0",
	    "pcnosuch0\n");
	addr_is(root, "bare0", ENOENT, NULL);
	addr_is(root, "nodev", ENOENT, NULL);
	addr_is(root, "../x", EINVAL, NULL);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	cr_assert_eq(system(cmd), 0);
}

/* device_names: the listed devices in their order, each usable one a rail;
 * the rest left out and said; a rail after the first needs an address. */
Test(transport_rdma_probe, device_names)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_add_device("sim1", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_add_device("sim2", IBV_PORT_DOWN), 0);
	cr_assert_eq(rsim_add_device("sim3", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_device_addr("sim0", "127.0.0.1"), 0);
	cr_assert_eq(rsim_device_addr("sim1", "127.0.0.2"), 0);
	struct tp_rdma_cfg cfg = probe_cfg();
	cfg.devices = "sim1,sim0,sim1,mlx5_9,sim2";
	probe_says(&cfg, 2, "sim1 port 1 active and 1 more rail");
	probe_says(&cfg, 2, "sim1: listed twice");
	probe_says(&cfg, 2, "mlx5_9: not seen");
	probe_says(&cfg, 2, "sim2: port 1 is not active");
	cfg.devices = "mlx5_9,sim2";
	probe_says(&cfg, 0, "mlx5_9: not seen");
	node_refused(&cfg);
	/* device_names wins over device_name. */
	cfg.device = "sim3";
	cfg.devices = "sim1,sim0";
	struct tp_node *tn = NULL;
	cr_assert_eq(tp_rdma_node_new(&cfg, &tn), 0);
	cr_assert_eq(tp_rdma_node_rails(tn), 2);
	tp_rdma_node_free(tn);
	/* sim3 has no network address: only rail 0 may go without one. */
	cfg.devices = "sim0,sim3,sim1";
	cr_assert_eq(tp_rdma_node_new(&cfg, &tn), 0);
	cr_assert_eq(tp_rdma_node_rails(tn), 2);
	tp_rdma_node_free(tn);
	cfg.devices = "sim3,sim0";
	cr_assert_eq(tp_rdma_node_new(&cfg, &tn), 0);
	cr_assert_eq(tp_rdma_node_rails(tn), 2);
	tp_rdma_node_free(tn);
	fabric_clean();
	cr_assert_eq(rsim_reset(), 0);
}
