/*
 * modules/modules.h — the module tables this folder defines.
 *
 * Owns: declarations only. The list of modules a node runs is in
 * server/module_list.c; nothing else names a module.
 */
#ifndef PC_MODULES_MODULES_H
#define PC_MODULES_MODULES_H

#include "modules/module.h"

extern const struct pc_module pc_mod_stats_log;
extern const struct pc_module pc_mod_metrics;
extern const struct pc_module pc_mod_rpc_server;
extern const struct pc_module pc_mod_node;
extern const struct pc_module pc_mod_transport;
extern const struct pc_module pc_mod_cluster;
extern const struct pc_module pc_mod_transport_revoke;
extern const struct pc_module pc_mod_directory;
extern const struct pc_module pc_mod_kv;
extern const struct pc_module pc_mod_slotmap;
extern const struct pc_module pc_mod_kv_rpc;
extern const struct pc_module pc_mod_disk;
extern const struct pc_module pc_mod_republish;
extern const struct pc_module pc_mod_session;
extern const struct pc_module pc_mod_discovery;

#endif /* PC_MODULES_MODULES_H */
