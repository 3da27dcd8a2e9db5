/*
 * server/server.h — what peercached's main() is built from.
 *
 * Owns: the declarations of the module list and of pc_server_run(), which
 * tests call to run a whole node in-process.
 */
#ifndef PC_SERVER_SERVER_H
#define PC_SERVER_SERVER_H

#include <stddef.h>

#include "modules/module.h"

extern const struct pc_module *const pc_node_modules[];
extern const size_t pc_node_modules_count;

/* Build reactor parameters from the settings. */
struct pc_settings;
void pc_server_reactor_params(const struct pc_settings *s,
			      struct rx_params *p);

#endif /* PC_SERVER_SERVER_H */
