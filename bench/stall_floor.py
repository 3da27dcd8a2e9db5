#!/usr/bin/python3
"""bench/stall_floor.py — how many 512 KiB copies take over 1 ms of thread
CPU on this machine with no node at all: the floor under local_bench.py's
"stalls > 1 ms of reactor CPU".

PROCS (2) processes, one per reactor of local_bench's node, each copy in a
loop what a reactor's copier does for a set and a get of 4 MiB pages: a
512 KiB slice from a client region (a memfd, written first, as a client
does) into a pool (anonymous memory, transparent huge pages advised and
populated, as storage/pool.c does), then from the pool into the other half
of the region; each slice is timed with the thread's CPU clock. Slices
that take > 1 ms of CPU with nothing but memory to touch are what the
machine adds (a guest without steal-time accounting counts the host's
preemption of its vCPU as the running thread's CPU time).

GET_DST selects how the half of the region the gets write into was made
ready, to show the cost local_bench.py's CPU stalls came from:
  written      (default) the client wrote it first
  read-warmed  never written, each page read once first (a hole faulted
               in by a read: the node's prefault before f042f27); the
               first write to each page then costs a hypervisor exit on
               a guest with shadow paging
  write-warmed never written, each page's first byte read and written
               back once first (the node's prefault now writes a get's
               pages, changing nothing)

Environment: SECONDS_ [6], PROCS [2], POOL_MB [1024], REGION_MB [256],
GET_DST [written]. Prints one JSON line per process and a summary.
"""
import ctypes
import json
import mmap
import os
import sys
import time

SECONDS = float(os.environ.get("SECONDS_", "6"))
PROCS = int(os.environ.get("PROCS", "2"))
POOL = int(os.environ.get("POOL_MB", "1024")) << 20
REGION = int(os.environ.get("REGION_MB", "256")) << 20
GET_DST = os.environ.get("GET_DST", "written")
SLICE = 512 << 10
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def addr_of(m):
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def one(out_fd):
    pool = mmap.mmap(-1, POOL, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pool.madvise(mmap.MADV_HUGEPAGE)
    for off in range(0, POOL, 2 << 20):
        pool.madvise(MADV_POPULATE_WRITE, off, 2 << 20)
    fd = os.memfd_create("stall-floor")
    os.ftruncate(fd, REGION)
    reg = mmap.mmap(fd, REGION)
    half = REGION // 2
    ctypes.memset(addr_of(reg), 7, half)
    if GET_DST == "written":
        ctypes.memset(addr_of(reg) + half, 0, half)
    elif GET_DST in ("read-warmed", "write-warmed"):
        for off in range(half, REGION, PAGE):
            b = reg[off]
            if GET_DST == "write-warmed":
                reg[off] = b  # a write of the same byte
    else:
        raise SystemExit("GET_DST: written, read-warmed or write-warmed")
    p, r = addr_of(pool), addr_of(reg)
    n = over = over2 = 0
    worst = 0.0
    po = 0
    first_gets = []  # CPU ms of the gets of the first pass over the region
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        for ro in range(0, half, SLICE):
            for dst, src in ((p + po, r + ro), (r + half + ro, p + po)):
                c0 = time.thread_time_ns()
                ctypes.memmove(dst, src, SLICE)
                ms = (time.thread_time_ns() - c0) / 1e6
                n += 1
                over += ms > 1.0
                over2 += ms > 2.0
                worst = max(worst, ms)
                if n <= half // SLICE * 2 and dst != p + po:
                    first_gets.append(ms)
            po = (po + SLICE) % POOL
            if time.monotonic() >= end:
                break
    first_gets.sort()
    fg = first_gets[len(first_gets) // 2] if first_gets else 0.0
    os.write(out_fd, (json.dumps({"slices": n, "over_1ms": over, "over_2ms": over2,
                                  "worst_ms": round(worst, 2),
                                  "first_get_median_ms": round(fg, 3)}) + "\n").encode())


def main():
    rfd, wfd = os.pipe()
    pids = []
    for _ in range(PROCS):
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            try:
                one(wfd)
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(wfd)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(rfd) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for row in rows:
        print(json.dumps(row))
    print("stall_floor: GET_DST=%s, %d processes, %.0f s, load %.1f: %d of %d slices over "
          "1 ms of CPU (%d over 2 ms), worst %.2f ms; a get slice of the first pass "
          "(first write to the page) %s ms of CPU (median per process)" % (
              GET_DST, PROCS, SECONDS, os.getloadavg()[0], sum(r["over_1ms"] for r in rows),
              sum(r["slices"] for r in rows), sum(r["over_2ms"] for r in rows),
              max((r["worst_ms"] for r in rows), default=0),
              "/".join(str(r["first_get_median_ms"]) for r in rows)))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        raise SystemExit(__doc__)
    main()
