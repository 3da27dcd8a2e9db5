/*
 * tests/unit/test_pcb_report.c — peercache-bench's reports (bench/tool/):
 * JSON written and read back field for field (strings with quotes,
 * backslashes, control characters and UTF-8; doubles exactly), peaks,
 * compare's matching and ratios, the HTML page's charts (one point per row
 * per chart, nothing fetched), Markdown and console marks, and the JSON
 * reader refusing truncated, deep, malformed and mistyped input without
 * crashing.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/tool/report_int.h"
#include "testutil.h"

static const char nasty[] = "q\"uote b\\slash \x01\x1f\t\n\r\x7f µs 日本 \xf0\x9f\x98\x80 </td>&";

static struct pcb_row row(const char *target, const char *op, unsigned batch,
			  unsigned conc, double pages_s)
{
	struct pcb_row w;

	memset(&w, 0, sizeof(w));
	snprintf(w.target, sizeof(w.target), "%s", target);
	snprintf(w.via, sizeof(w.via), "%s",
		 strcmp(target, "redis") == 0 ? "resp" : "session");
	snprintf(w.op, sizeof(w.op), "%s", op);
	snprintf(w.mode, sizeof(w.mode), "%s",
		 strcmp(target, "redis") == 0 ? "-" : "p2p");
	w.processes = conc > 1 ? 2 : 1;
	w.threads = conc / w.processes;
	w.concurrency = conc;
	w.batch = batch;
	w.page_bytes = 65536;
	w.page_tokens = strcmp(target, "redis") == 0 ? 0 : 16;
	w.seconds = 10.000000001;
	w.calls = 123456789012ull;
	w.pages = w.calls * batch;
	w.hits = w.pages - 7;
	w.errors = 3;
	w.wrong = 1;
	w.bytes = UINT64_MAX - 5;
	w.hit_rate = (double)w.hits / (double)w.pages;
	w.pages_s = pages_s;
	w.tokens_s = pages_s * w.page_tokens;
	w.gbps = pages_s * 65536 / 1e9;
	w.batch_lat = (struct pcb_lat){ 0.1, 12.5, 1e-300, 99.75 * conc,
					1234567.891, 1.7976931348623157e308 };
	w.page_lat = (struct pcb_lat){ 1.0 / 3, 2.0 / 3, 3, 4, 5, 6 };
	return w;
}

/* 3 series (peercache get b=8, peercache exists b=8, redis get b=8) at
 * concurrencies 1, 2, 4 (redis: 1, 2). */
static void build(struct pcb_report *r)
{
	char *argv[] = { "peercache-bench", "drive", "--name",
			 "it's a \"test\"", "", NULL };

	pcb_report_init(r, 5, argv);
	pcb_report_set(r, "op", "%s", "get");
	pcb_report_set(r, "nasty", "%s", nasty);
	pcb_report_set(r, "op", "%s", "get,exists"); /* replaces */
	snprintf(r->cpu, sizeof(r->cpu), "%s", nasty);
	snprintf(r->host, sizeof(r->host), "h<b>&\"x\"");
	static const unsigned conc[] = { 1, 2, 4 };
	for (int i = 0; i < 3; i++) {
		struct pcb_row a = row("peercache", "get", 8, conc[i], 1000.5 * (i + 1));
		struct pcb_row b = row("peercache", "exists", 8, conc[i], 5e6 / (i + 1));
		cr_assert_eq(pcb_report_add_row(r, &a), 0);
		cr_assert_eq(pcb_report_add_row(r, &b), 0);
		if (i < 2) {
			struct pcb_row c = row("redis", "get", 8, conc[i], 777);
			cr_assert_eq(pcb_report_add_row(r, &c), 0);
		}
	}
	snprintf(r->rows[0].mode, sizeof(r->rows[0].mode), "p2p");
	r->rows[1].pages_s = NAN; /* must come out as 0 */
	r->rows[1].gbps = INFINITY;
	pcb_report_mark_peaks(r);
}

static char *render(int (*form)(const struct pcb_report *, FILE *),
		    const struct pcb_report *r, size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);

	cr_assert(f);
	cr_assert_eq(form(r, f), 0);
	cr_assert_eq(fclose(f), 0);
	if (len)
		*len = n;
	return buf;
}

static double finite_or_0(double v)
{
	return isfinite(v) ? v : 0;
}

static void assert_same_report(const struct pcb_report *a,
			       const struct pcb_report *b)
{
#define S(f) cr_assert_str_eq(a->f, b->f, #f)
	S(version); S(build); S(host); S(kernel); S(cpu); S(started); S(command);
#undef S
	cr_assert_eq(a->cpus, b->cpus);
	cr_assert_eq(a->mem_bytes, b->mem_bytes);
	cr_assert_eq(a->nsettings, b->nsettings);
	for (unsigned i = 0; i < a->nsettings; i++) {
		cr_assert_str_eq(a->settings[i].key, b->settings[i].key);
		cr_assert_str_eq(a->settings[i].val, b->settings[i].val);
	}
	cr_assert_eq(a->nrows, b->nrows);
	for (unsigned i = 0; i < a->nrows; i++) {
		const struct pcb_row *x = &a->rows[i], *y = &b->rows[i];
#define X(f) cr_assert_str_eq(x->f, y->f, "row %u " #f, i);
		PCB_ROW_STRS(X)
#undef X
#define X(f) cr_assert_eq(x->f, y->f, "row %u " #f, i);
		PCB_ROW_UINTS(X)
		PCB_ROW_U64S(X)
		X(peak)
#undef X
#define X(f) cr_assert_eq(finite_or_0(x->f), y->f, "row %u " #f ": %.17g %.17g", i, x->f, y->f);
		PCB_ROW_DBLS(X)
#undef X
#define X(f)                                                                  \
	cr_assert_eq(x->batch_lat.f, y->batch_lat.f, "row %u batch " #f, i); \
	cr_assert_eq(x->page_lat.f, y->page_lat.f, "row %u page " #f, i);
		PCB_LAT_DBLS(X)
#undef X
	}
}

Test(pcb_report, init_and_settings)
{
	struct pcb_report r;

	build(&r);
	cr_assert_str_eq(r.command, "peercache-bench drive --name "
				    "'it'\\''s a \"test\"' ''");
	cr_assert(strstr(r.version, PEERCACHE_VERSION " ("));
	cr_assert(strstr(r.build, "optimized") || strstr(r.build, "debug"));
	cr_assert_eq(strlen(r.started), 20, "%s", r.started);
	cr_assert(r.cpus > 0);
	cr_assert(r.mem_bytes > 0);
	cr_assert(r.kernel[0]);
	cr_assert_eq(r.nsettings, 2);
	cr_assert_str_eq(r.settings[0].key, "op");
	cr_assert_str_eq(r.settings[0].val, "get,exists");
	pcb_report_free(&r);
}

Test(pcb_report, json_round_trips_every_field)
{
	struct pcb_report r, back;
	char err[256];
	size_t len;

	build(&r);
	char *json = render(pcb_report_json, &r, &len);
	cr_assert_eq(pcb_report_parse_json(json, len, &back, err, sizeof(err)), 0,
		     "%s", err);
	assert_same_report(&r, &back);
	cr_assert_eq(back.rows[1].pages_s, 0);
	cr_assert_null(strstr(json, "nan"));
	cr_assert_null(strstr(json, "inf"));
	cr_assert(strstr(json, "\\u0001\\u001f\\t\\n\\r\\u007f"));

	/* and from a file, written by write_files */
	char dir[] = "/tmp/pcb_report_XXXXXX", prefix[64], path[80];
	cr_assert(mkdtemp(dir));
	snprintf(prefix, sizeof(prefix), "%s/run", dir);
	cr_assert_eq(pcb_report_write_files(&r, prefix, err, sizeof(err)), 0, "%s", err);
	struct pcb_report file;
	snprintf(path, sizeof(path), "%s.json", prefix);
	cr_assert_eq(pcb_report_load_json(path, &file, err, sizeof(err)), 0, "%s", err);
	assert_same_report(&r, &file);
	pcb_report_free(&file);
	static const char *const ext[] = { ".json", ".md", ".html" };
	for (int i = 0; i < 3; i++) {
		struct stat st;
		snprintf(path, sizeof(path), "%s%s", prefix, ext[i]);
		cr_assert_eq(stat(path, &st), 0, "%s", path);
		cr_assert(st.st_size > 100);
		unlink(path);
	}
	rmdir(dir);

	/* a file that cannot be written is named */
	snprintf(prefix, sizeof(prefix), "%s/gone/run", dir);
	cr_assert_lt(pcb_report_write_files(&r, prefix, err, sizeof(err)), 0);
	cr_assert(strstr(err, "gone/run.json"), "%s", err);
	cr_assert_lt(pcb_report_load_json(path, &file, err, sizeof(err)), 0);
	cr_assert(strstr(err, path), "%s", err);

	pcb_report_free(&file);
	pcb_report_free(&back);
	pcb_report_free(&r);
	free(json);
}

Test(pcb_report, unicode_escapes_and_truncation)
{
	/* \u escapes (a surrogate pair among them) decode to UTF-8; a string
	 * longer than its field is cut at a character boundary */
	static const char in[] =
		"{\"tool\":\"peercache-bench\",\"format\":1,\"unknown\":[1,{\"x\":null}],"
		"\"host\":{\"name\":\"a\\u00b5\\u65e5\\ud83d\\ude00\\/\"},"
		"\"rows\":[{\"target\":\"0123456789abc\\u00b5\\u00b5\",\"extra\":true}]}";
	struct pcb_report r;
	char err[256];

	cr_assert_eq(pcb_report_parse_json(in, strlen(in), &r, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_str_eq(r.host, "aµ日\xf0\x9f\x98\x80/");
	cr_assert_eq(r.nrows, 1);
	/* 13 + 2 + 2 bytes into 16: the second µ does not fit whole */
	cr_assert_str_eq(r.rows[0].target, "0123456789abcµ");
	cr_assert_eq(r.rows[0].calls, 0);
	cr_assert_str_eq(r.rows[0].op, "");
	pcb_report_free(&r);
}

/* Found by fuzz_pcb_json: settings keys longer than their field are cut;
 * two that cut alike were kept as two entries, which the written report
 * then gave back as one (the round trip changed the report). They are one
 * from the first read on, the later value winning. */
Test(pcb_report, settings_keys_cut_alike_are_one)
{
	static const char in[] =
		"{\"tool\":\"peercache-bench\",\"format\":1,\"settings\":{"
		"\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk-first\":\"1\","
		"\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk-second\":\"2\"},"
		"\"rows\":[]}";
	struct pcb_report r, back;
	char err[256];
	size_t len1, len2;

	cr_assert_eq(pcb_report_parse_json(in, strlen(in), &r, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(r.nsettings, 1, "%u settings", r.nsettings);
	cr_assert_str_eq(r.settings[0].val, "2");
	char *j1 = render(pcb_report_json, &r, &len1);
	cr_assert_eq(pcb_report_parse_json(j1, len1, &back, err, sizeof(err)), 0,
		     "%s", err);
	char *j2 = render(pcb_report_json, &back, &len2);
	cr_assert(len1 == len2 && memcmp(j1, j2, len1) == 0,
		  "the written report reads back differently");
	free(j1);
	free(j2);
	pcb_report_free(&back);
	pcb_report_free(&r);
}

Test(pcb_report, peaks_per_series)
{
	struct pcb_report r;

	memset(&r, 0, sizeof(r));
	struct pcb_row rows[] = {
		row("peercache", "get", 8, 1, 10), row("peercache", "get", 8, 2, 30),
		row("peercache", "get", 16, 1, 50), row("peercache", "get", 8, 4, 30),
		row("redis", "get", 8, 1, 0), row("redis", "get", 8, 2, 0),
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_assert_eq(pcb_report_add_row(&r, &rows[i]), 0);
	r.rows[0].peak = true;
	pcb_report_mark_peaks(&r);
	static const bool want[] = { false, true, true, false, true, false };
	for (unsigned i = 0; i < r.nrows; i++)
		cr_assert_eq(r.rows[i].peak, want[i], "row %u", i);
	cr_assert(pcb_same_series(&r.rows[0], &r.rows[3]));
	cr_assert_not(pcb_same_series(&r.rows[0], &r.rows[2]));

	char *con = render(pcb_report_console, &r, NULL);
	int stars = 0;
	for (char *l = con; l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
		stars += strncmp(l, "* ", 2) == 0;
	cr_assert_eq(stars, 3, "%s", con);
	char *md = render(pcb_report_markdown, &r, NULL);
	int bold = 0;
	for (char *l = md; (l = strstr(l, "\n| **")); l++)
		bold++;
	cr_assert_eq(bold, 3, "%s", md);
	free(con);
	free(md);
	pcb_report_free(&r);
}

Test(pcb_report, console_and_markdown)
{
	struct pcb_report r;

	build(&r);
	char *con = render(pcb_report_console, &r, NULL);
	cr_assert(strstr(con, "pages/s"));
	cr_assert(strstr(con, "redis/resp"));
	cr_assert(strstr(con, "65536 bytes") || strstr(con, "mixed"));
	/* redis rows know no tokens: "-" */
	char *l = strstr(con, "redis/resp");
	cr_assert(l && strstr(l, " - "), "%s", con);
	for (const char *p = con; *p; p++)
		cr_assert(*p == '\n' || (unsigned char)*p >= 0x20, "control byte in %s", con);
	char *md = render(pcb_report_markdown, &r, NULL);
	cr_assert(strstr(md, "# peercache-bench report"));
	cr_assert(strstr(md, "| target/via | op |"));
	cr_assert(strstr(md, "h<b>&") == NULL);
	free(con);
	free(md);
	pcb_report_free(&r);
}

static int count(const char *s, const char *end, const char *needle)
{
	int n = 0;

	while ((s = strstr(s, needle)) && (!end || s < end))
		n++, s++;
	return n;
}

static void check_html(const struct pcb_report *r)
{
	char *html = render(pcb_report_html, r, NULL);
	char *t = strstr(html, "<svg id=\"chart-throughput\"");
	char *p = strstr(html, "<svg id=\"chart-p99\"");

	cr_assert(t && p && t < p);
	/* one point per row in each chart, none elsewhere */
	cr_assert_eq(count(t, p, "class=\"pt\""), (int)r->nrows);
	cr_assert_eq(count(p, strstr(p, "</svg>"), "class=\"pt\""), (int)r->nrows);
	cr_assert_eq(count(html, NULL, "class=\"pt\""), 2 * (int)r->nrows);
	cr_assert_eq(count(html, NULL, "<circle class=\"pt\""), 2 * (int)r->nrows);
	/* offline: nothing to fetch, nothing to run */
	cr_assert_null(strstr(html, "<script"));
	cr_assert_null(strstr(html, "src="));
	cr_assert_null(strstr(html, "url("));
	cr_assert_null(strstr(html, "@import"));
	cr_assert_eq(count(html, NULL, "http"), count(html, NULL, "xmlns=\"http://www.w3.org/2000/svg\"") + 1 /* http-equiv */);
	cr_assert_null(strstr(html, "nan"));
	cr_assert_null(strstr(html, "inf"));
	cr_assert_null(strstr(html, "<b>"));
	free(html);
}

Test(pcb_report, html_charts)
{
	struct pcb_report r;

	build(&r);
	check_html(&r);
	char *html = render(pcb_report_html, &r, NULL);
	cr_assert(strstr(html, "h&lt;b&gt;&amp;&quot;x&quot;"));
	/* three series: three colours, a legend entry each */
	cr_assert(strstr(html, "data-series=\"peercache/session get p2p b=8\""));
	cr_assert(strstr(html, "data-series=\"redis/resp get - b=8\""));
	cr_assert_eq(count(html, NULL, "<polyline"), 6);
	cr_assert(strstr(html, "fill=\"#1f77b4\""));
	cr_assert(strstr(html, "fill=\"#ff7f0e\""));
	cr_assert(strstr(html, "fill=\"#2ca02c\""));
	free(html);
	pcb_report_free(&r);

	/* one point, all zero; and no rows at all */
	memset(&r, 0, sizeof(r));
	struct pcb_row z = row("peercache", "set", 1, 3, 0);
	z.batch_lat.p99_us = 0;
	cr_assert_eq(pcb_report_add_row(&r, &z), 0);
	check_html(&r);
	pcb_report_free(&r);
	memset(&r, 0, sizeof(r));
	check_html(&r);
	char *md = render(pcb_report_markdown, &r, NULL);
	char *json = render(pcb_report_json, &r, NULL);
	struct pcb_report back;
	char err[256];
	cr_assert_eq(pcb_report_parse_json(json, strlen(json), &back, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(back.nrows, 0);
	free(md);
	free(json);
}

Test(pcb_report, compare)
{
	struct pcb_report a, b;
	char *text = NULL;
	size_t n = 0;
	FILE *f;

	build(&a);
	a.rows[1].pages_s = 2000; /* build's NaN: no ratio from it */
	f = open_memstream(&text, &n);
	cr_assert_eq(pcb_compare(&a, &a, "a.json", "a.json", f), 0);
	fclose(f);
	cr_assert(strstr(text, "over 8 matched rows: min 1.000, median 1.000, max 1.000"), "%s", text);
	cr_assert_null(strstr(text, "only in"));
	free(text);

	/* B: twice the pages/s, one row dropped, one row of its own */
	build(&b);
	b.rows[1].pages_s = 2000;
	for (unsigned i = 0; i < b.nrows; i++) {
		b.rows[i].pages_s *= 2;
		b.rows[i].gbps *= 2;
		b.rows[i].batch_lat.p99_us /= 2;
	}
	b.rows[b.nrows - 1].concurrency = 64;
	f = open_memstream(&text, &n);
	cr_assert_eq(pcb_compare(&a, &b, "a.json", "b.json", f), 0);
	fclose(f);
	cr_assert(strstr(text, "over 7 matched rows: min 2.000, median 2.000, max 2.000"), "%s", text);
	cr_assert(strstr(text, "only in a.json: peercache/session exists p2p b=8 conc 4"), "%s", text);
	cr_assert(strstr(text, "only in b.json: peercache/session exists p2p b=8 conc 64"), "%s", text);
	cr_assert(strstr(text, "0.500"), "%s", text);
	free(text);

	/* a ratio set with a median between two values */
	for (unsigned i = 0; i < b.nrows; i++)
		b.rows[i].pages_s = a.rows[i].pages_s * (i + 1);
	f = open_memstream(&text, &n);
	cr_assert_eq(pcb_compare(&a, &b, "a", "b", f), 0);
	fclose(f);
	/* matched rows 0..6 with ratios 1..7 */
	cr_assert(strstr(text, "min 1.000, median 4.000, max 7.000"), "%s", text);
	free(text);

	/* nothing in common */
	for (unsigned i = 0; i < b.nrows; i++)
		b.rows[i].batch = 99;
	f = open_memstream(&text, &n);
	cr_assert_eq(pcb_compare(&a, &b, "a", "b", f), -ENOENT);
	fclose(f);
	free(text);
	pcb_report_free(&a);
	pcb_report_free(&b);
}

static void refused(const char *in, size_t len, const char *why)
{
	struct pcb_report r;
	char err[256];

	memset(&r, 0xa5, sizeof(r));
	int rc = pcb_report_parse_json(in, len, &r, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "%s: accepted (%d)", why, rc);
	cr_assert(strlen(err) > 0, "%s: no message", why);
	cr_assert_null(r.rows, "%s: rows left behind", why);
}

Test(pcb_report, json_reader_refuses_bad_input)
{
	static const char *const bad[] = {
		"", " ", "{", "}", "[1,]", "{\"a\":}", "{\"a\" 1}", "{a:1}",
		"{\"a\":1,}", "{\"a\":1} x", "[01]", "[-]", "[1.]", "[1e]", "[.5]",
		"[+1]", "[tru]", "[nul]", "\"abc", "\"a\\x\"", "\"\\u12\"",
		"\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\u0000\"",
		"\"a\x01\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf5\x80\x80\x80\"",
		"\"\xe6\x97\"", "[1 2]", "{\"a\":1 \"b\":2}",
		/* wrong types */
		"[]", "\"report\"", "{\"tool\":\"other\"}", "{\"format\":2}",
		"{\"rows\":{}}", "{\"rows\":[1]}", "{\"host\":[]}",
		"{\"host\":{\"cpus\":\"8\"}}", "{\"host\":{\"cpus\":4294967296}}",
		"{\"host\":{\"mem_bytes\":18446744073709551616}}",
		"{\"rows\":[{\"calls\":-1}]}", "{\"rows\":[{\"calls\":1.5}]}",
		"{\"rows\":[{\"pages_s\":\"1\"}]}", "{\"rows\":[{\"peak\":1}]}",
		"{\"rows\":[{\"batch_lat\":[]}]}", "{\"rows\":[{\"target\":7}]}",
		"{\"settings\":{\"a\":1}}", "{\"version\":null}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		refused(bad[i], strlen(bad[i]), bad[i]);
	refused("{\"a\":\"x\0\"}", 10, "a NUL byte");

	/* deep nesting, as arrays and as objects, far past the limit */
	enum { DEEP = 100000 };
	char *deep = malloc(2 * DEEP + 16);
	cr_assert(deep);
	memset(deep, '[', DEEP);
	memset(deep + DEEP, ']', DEEP);
	refused(deep, 2 * DEEP, "deep arrays");
	size_t n = 0;
	for (int i = 0; i < 5000; i++)
		n += (size_t)sprintf(deep + n, "{\"a\":");
	refused(deep, n, "deep objects");
	free(deep);

	/* every truncation of a real report, and single-byte changes */
	struct pcb_report r, back;
	char err[256];
	size_t len;
	build(&r);
	char *json = render(pcb_report_json, &r, &len);
	for (size_t cut = 0; cut < len; cut++) {
		/* a cut after the closing brace leaves only whitespace out */
		bool whole = strspn(json + cut, " \n") == len - cut;
		if (whole)
			continue;
		refused(json, cut, "truncated");
	}
	static const char flips[] = { '"', '\\', '{', '}', '[', ']', ',', ':', '0', 'x', '\0', (char)0x80 };
	for (size_t pos = 0; pos < len; pos += 3) {
		for (size_t k = 0; k < sizeof(flips); k++) {
			char saved = json[pos];
			json[pos] = flips[k];
			if (pcb_report_parse_json(json, len, &back, err, sizeof(err)) == 0)
				pcb_report_free(&back);
			json[pos] = saved;
		}
	}
	cr_assert_eq(pcb_report_parse_json(json, len, &back, err, sizeof(err)), 0, "%s", err);
	pcb_report_free(&back);
	free(json);
	pcb_report_free(&r);

	/* the generic reader: limits */
	struct pcb_json_doc doc;
	cr_assert_eq(pcb_json_parse(&doc, "[[[[1]]]]", 9, err, sizeof(err)), 0);
	cr_assert_eq(doc.nodes[0].type, PCB_J_ARR);
	pcb_json_free(&doc);
	cr_assert_eq(pcb_json_parse(&doc, "[1", 2, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "at byte 2"), "%s", err);
}
