/*
 * tests/fuzz/fuzz_pcb_json.c — libFuzzer target for peercache-bench's report
 * reader (bench/tool/json.c, report.c): `compare` reads JSON files a user
 * hands it.
 *
 * Per input: parse it as a report. When that succeeds, every report form is
 * written (console, JSON, Markdown, HTML: the writers see whatever strings
 * and numbers the reader let through), and the JSON written must read back
 * and write again to the same bytes (what the tool writes, it reads). A
 * failed parse must leave nothing to free. Any violation traps.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_pcb_json -max_total_time=60 WORK tests/fuzz/corpus/pcb_json
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/tool/report_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *json_of(const struct pcb_report *r, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		abort();
	if (pcb_report_json(r, f) < 0)
		__builtin_trap();
	fclose(f);
	return buf;
}

static void all_forms(const struct pcb_report *r)
{
	FILE *f = fopen("/dev/null", "w");
	if (!f)
		abort();
	if (pcb_report_console(r, f) < 0 || pcb_report_markdown(r, f) < 0 ||
	    pcb_report_html(r, f) < 0)
		__builtin_trap();
	fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pcb_report r;
	char err[256];
	memset(&r, 0, sizeof(r));
	if (pcb_report_parse_json((const char *)data, size, &r, err,
				  sizeof(err)) < 0) {
		if (r.rows || r.nrows || !err[0])
			__builtin_trap();
		return 0;
	}
	pcb_report_mark_peaks(&r);
	all_forms(&r);
	size_t len1, len2;
	char *j1 = json_of(&r, &len1);
	struct pcb_report r2;
	memset(&r2, 0, sizeof(r2));
	if (pcb_report_parse_json(j1, len1, &r2, err, sizeof(err)) < 0)
		__builtin_trap();
	char *j2 = json_of(&r2, &len2);
	if (len1 != len2 || memcmp(j1, j2, len1) != 0)
		__builtin_trap();
	free(j1);
	free(j2);
	pcb_report_free(&r);
	pcb_report_free(&r2);
	return 0;
}
