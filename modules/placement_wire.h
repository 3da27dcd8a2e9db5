/*
 * modules/placement_wire.h — a placement record (struct dir_rec) on the
 * wire, for the modules that send records between nodes: the directory's
 * dir.* methods (modules/directory.c) and the disk tier's disk.promote
 * (modules/disk_remote.c).
 *
 * Owns: the encoding [node, data, addr, rkey, len, gen, resident]
 * (docs/protocol.md "Directory"), nothing else. Threading: any; no state.
 */
#ifndef PC_MODULES_PLACEMENT_WIRE_H
#define PC_MODULES_PLACEMENT_WIRE_H

#include <stddef.h>

#include "modules/placement.h"
#include "rpc/mp.h"

/* Pack r as its 7-element array. */
void pl_rec_pack(msgpack_packer *pk, const struct dir_rec *r);
/* Read one record into r (found set): 0, or -EINVAL when it is not one. */
int pl_rec_read(struct mp_rd *p, struct dir_rec *r);
/* Read a str of 1..cap-1 bytes into out, NUL-terminated: 0 or -EINVAL. */
int pl_str_read(struct mp_rd *p, char *out, size_t cap);

#endif /* PC_MODULES_PLACEMENT_WIRE_H */
