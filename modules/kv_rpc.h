/*
 * modules/kv_rpc.h — the kv.* RPC methods, served by the kv module.
 *
 * Owns: declarations only (modules/kv_rpc.c). The kv module lists the
 * methods in its module table and calls kv_rpc_init from its init, after
 * it offered as the "kv" service: the methods use nothing of kv but that API.
 */
#ifndef PC_MODULES_KV_RPC_H
#define PC_MODULES_KV_RPC_H

#include "modules/module.h"
#include "rpc/rpc.h"

extern const struct rpc_method kv_rpc_methods[];

/* Read the limits and register the metrics (main thread, init). */
int kv_rpc_init(struct pc_ctx *ctx);

#endif /* PC_MODULES_KV_RPC_H */
