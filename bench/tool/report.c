/*
 * bench/tool/report.c — a peercache-bench report: what it records about the
 * host and the build, its rows, and the four forms people read it in
 * (console table, JSON, Markdown, one offline HTML page with SVG charts).
 *
 * Owns: nothing global. A struct pcb_report is plain memory of its caller;
 * rows are malloc'd here and freed by pcb_report_free. Called from one
 * thread (the tool's main) after the workers have been joined.
 * Invariants: every form writes finite numbers only (NaN and Inf become 0)
 * and valid UTF-8 (bad bytes become U+FFFD in JSON); the JSON form is the
 * one json.c reads back, field for field (report_int.h lists the fields).
 */
#include "report_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/json.h"

#ifndef PEERCACHE_VERSION
#define PEERCACHE_VERSION "unknown"
#endif
#ifndef PEERCACHE_GIT_REV
#define PEERCACHE_GIT_REV "unknown"
#endif

static double fin(double v)
{
	return isfinite(v) ? v : 0.0;
}

/* ------------------------------------------------------------ the record */

/* "model name : X" from /proc/cpuinfo (other architectures name it
 * otherwise: fall back to uname's machine). */
static void read_cpu_model(char *buf, size_t len, const char *machine)
{
	static const char *const keys[] = { "model name", "Model", "cpu model",
					    "Hardware" };
	char line[512];
	FILE *f = fopen("/proc/cpuinfo", "r");

	snprintf(buf, len, "%s", machine);
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (!colon)
			continue;
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			size_t kl = strlen(keys[k]);
			if (strncmp(line, keys[k], kl) != 0 ||
			    (line[kl] != ' ' && line[kl] != '\t' && line[kl] != ':'))
				continue;
			char *v = colon + 1;
			v += strspn(v, " \t");
			v[strcspn(v, "\n")] = '\0';
			if (*v) {
				pcb_copy_utf8(buf, len, v);
				fclose(f);
				return;
			}
		}
	}
	fclose(f);
}

static uint64_t read_mem_total(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* Bytes a shell takes literally without quotes. */
static bool shell_plain(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			    "0123456789_-+=./:,@%^", *s))
			return false;
	return true;
}

/* argv joined so that pasting it into a shell runs the same command; an
 * argument that does not fit is left out whole and " ..." says so. */
static void join_command(char *buf, size_t len, int argc, char **argv)
{
	size_t n = 0;
	char word[1024];

	buf[0] = '\0';
	for (int i = 0; i < argc && argv && argv[i]; i++) {
		size_t w = 0;
		const char *a = argv[i];
		bool plain = shell_plain(a);

		if (!plain)
			word[w++] = '\'';
		for (; *a && w + 6 < sizeof(word); a++) {
			if (*a == '\'' && !plain) {
				memcpy(word + w, "'\\''", 4);
				w += 4;
			} else {
				word[w++] = *a;
			}
		}
		if (!plain)
			word[w++] = '\'';
		word[w] = '\0';
		if (*a || n + (n ? 1 : 0) + w + 5 > len) {
			if (n + 5 <= len)
				memcpy(buf + n, " ...", 5);
			return;
		}
		if (n)
			buf[n++] = ' ';
		memcpy(buf + n, word, w + 1);
		n += w;
	}
}

void pcb_report_init(struct pcb_report *r, int argc, char **argv)
{
	struct utsname u;
	time_t now = time(NULL);
	struct tm tm;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	memset(r, 0, sizeof(*r));
	snprintf(r->version, sizeof(r->version), "%s",
		 PEERCACHE_VERSION " (" PEERCACHE_GIT_REV ")");
#if defined(__clang__)
#define PCB_CC "clang "
#else
#define PCB_CC "gcc "
#endif
#if defined(__OPTIMIZE__)
#define PCB_OPT "optimized"
#else
#define PCB_OPT "debug"
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PCB_SAN ", sanitized"
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PCB_SAN ", sanitized"
#endif
#endif
#ifndef PCB_SAN
#define PCB_SAN ""
#endif
	snprintf(r->build, sizeof(r->build), "%s",
		 PCB_CC __VERSION__ ", " PCB_OPT PCB_SAN);
	if (gethostname(r->host, sizeof(r->host) - 1) != 0)
		snprintf(r->host, sizeof(r->host), "unknown");
	if (uname(&u) == 0) {
		char k[sizeof(u.sysname) + sizeof(u.release) + 1];

		snprintf(k, sizeof(k), "%s %s", u.sysname, u.release);
		pcb_copy_utf8(r->kernel, sizeof(r->kernel), k);
		read_cpu_model(r->cpu, sizeof(r->cpu), u.machine);
	} else {
		read_cpu_model(r->cpu, sizeof(r->cpu), "unknown");
	}
	r->cpus = cpus > 0 ? (unsigned)cpus : 0;
	r->mem_bytes = read_mem_total();
	if (gmtime_r(&now, &tm))
		strftime(r->started, sizeof(r->started), "%Y-%m-%dT%H:%M:%SZ",
			 &tm);
	join_command(r->command, sizeof(r->command), argc, argv);
}

void pcb_report_set(struct pcb_report *r, const char *key, const char *fmt, ...)
{
	struct pcb_kv *kv = NULL;
	va_list ap;

	for (unsigned i = 0; i < r->nsettings; i++)
		if (strcmp(r->settings[i].key, key) == 0)
			kv = &r->settings[i];
	if (!kv) {
		if (r->nsettings == PCB_SETTINGS_MAX) {
			fprintf(stderr,
				"peercache-bench: more than %d report settings, "
				"'%s' left out\n",
				PCB_SETTINGS_MAX, key);
			return;
		}
		kv = &r->settings[r->nsettings++];
		pcb_copy_utf8(kv->key, sizeof(kv->key), key);
	}
	va_start(ap, fmt);
	vsnprintf(kv->val, sizeof(kv->val), fmt, ap);
	va_end(ap);
}

int pcb_report_add_row(struct pcb_report *r, const struct pcb_row *row)
{
	struct pcb_row *rows;

	if (r->nrows >= PCB_REPORT_ROWS_MAX)
		return -ENOMEM;
	rows = realloc(r->rows, ((size_t)r->nrows + 1) * sizeof(*rows));
	if (!rows)
		return -ENOMEM;
	rows[r->nrows++] = *row;
	r->rows = rows;
	return 0;
}

bool pcb_same_series(const struct pcb_row *a, const struct pcb_row *b)
{
	return strcmp(a->target, b->target) == 0 &&
	       strcmp(a->via, b->via) == 0 && strcmp(a->op, b->op) == 0 &&
	       strcmp(a->mode, b->mode) == 0 && a->batch == b->batch;
}

void pcb_report_mark_peaks(struct pcb_report *r)
{
	for (unsigned i = 0; i < r->nrows; i++)
		r->rows[i].peak = false;
	for (unsigned i = 0; i < r->nrows; i++) {
		unsigned best = i;
		bool first = true;

		for (unsigned j = 0; j < i && first; j++)
			first = !pcb_same_series(&r->rows[j], &r->rows[i]);
		if (!first)
			continue;
		for (unsigned j = i + 1; j < r->nrows; j++)
			if (pcb_same_series(&r->rows[j], &r->rows[i]) &&
			    fin(r->rows[j].pages_s) > fin(r->rows[best].pages_s))
				best = j;
		r->rows[best].peak = true;
	}
}

void pcb_report_free(struct pcb_report *r)
{
	free(r->rows);
	r->rows = NULL;
	r->nrows = 0;
}

void pcb_printable(char *buf, size_t len, const char *s)
{
	size_t n = 0;

	if (len == 0)
		return;
	for (; *s && n + 1 < len; s++)
		buf[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
	buf[n] = '\0';
}

void pcb_series_label(const struct pcb_row *row, char *buf, size_t len)
{
	char t[160];

	snprintf(t, sizeof(t), "%s/%s %s %s b=%u", row->target, row->via,
		 row->op, row->mode, row->batch);
	pcb_printable(buf, len, t);
}

static int finish(FILE *out)
{
	if (fflush(out) != 0 || ferror(out))
		return errno ? -errno : -EIO;
	return 0;
}

/* -------------------------------------------------------- table columns */


static void fmt_us(char *buf, size_t len, double us)
{
	us = fin(us);
	if (us < 10)
		snprintf(buf, len, "%.2f", us);
	else if (us < 1000)
		snprintf(buf, len, "%.1f", us);
	else if (us < 1e9)
		snprintf(buf, len, "%.0f", us);
	else
		snprintf(buf, len, "%.3g", us);
}

#define CELL 96

static void c_target(const struct pcb_row *w, char *b)
{
	char t[CELL];
	snprintf(t, sizeof(t), "%s/%s", w->target, w->via);
	pcb_printable(b, CELL, t);
}
static void c_op(const struct pcb_row *w, char *b) { pcb_printable(b, CELL, w->op); }
static void c_mode(const struct pcb_row *w, char *b) { pcb_printable(b, CELL, w->mode); }
static void c_conc(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%u", w->concurrency); }
static void c_batch(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%u", w->batch); }
static void c_hit(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%.1f", fin(w->hit_rate) * 100); }
static void c_pages(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%.0f", fin(w->pages_s)); }
static void c_tokens(const struct pcb_row *w, char *b)
{
	if (w->page_tokens == 0 || strstr(w->op, "exists"))
		snprintf(b, CELL, "-"); /* not known; exists moves no tokens */
	else
		snprintf(b, CELL, "%.0f", fin(w->tokens_s));
}
static void c_gbps(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%.3f", fin(w->gbps)); }
static void c_bp50(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->batch_lat.p50_us); }
static void c_bp95(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->batch_lat.p95_us); }
static void c_bp99(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->batch_lat.p99_us); }
static void c_bp999(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->batch_lat.p999_us); }
static void c_bmax(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->batch_lat.max_us); }
static void c_pp50(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->page_lat.p50_us); }
static void c_pp99(const struct pcb_row *w, char *b) { fmt_us(b, CELL, w->page_lat.p99_us); }
static void c_errors(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%" PRIu64, w->errors); }
static void c_wrong(const struct pcb_row *w, char *b) { snprintf(b, CELL, "%" PRIu64, w->wrong); }

static const struct column {
	const char *head;
	void (*cell)(const struct pcb_row *w, char *buf);
	bool left; /* text: aligned left */
} columns[] = {
	{ "target/via", c_target, true },
	{ "op", c_op, true },
	{ "mode", c_mode, true },
	{ "conc", c_conc, false },
	{ "batch", c_batch, false },
	{ "hit%", c_hit, false },
	{ "pages/s", c_pages, false },
	{ "tokens/s", c_tokens, false },
	{ "GB/s", c_gbps, false },
	{ "b.p50", c_bp50, false },
	{ "b.p95", c_bp95, false },
	{ "b.p99", c_bp99, false },
	{ "b.p999", c_bp999, false },
	{ "b.max", c_bmax, false },
	{ "pg.p50", c_pp50, false },
	{ "pg.p99", c_pp99, false },
	{ "errors", c_errors, false },
	{ "wrong", c_wrong, false },
};
#define NCOLS (sizeof(columns) / sizeof(columns[0]))
static const char columns_note[] =
	"b.*: latency per batch, pg.*: per page (a call's latency divided by "
	"its pages), in microseconds; every percentile of both is in the JSON";

/* "4096 bytes (16 tokens)" when every row has that page size. */
static void page_size_str(const struct pcb_report *r, char *buf, size_t len)
{
	if (r->nrows == 0) {
		snprintf(buf, len, "-");
		return;
	}
	for (unsigned i = 1; i < r->nrows; i++) {
		if (r->rows[i].page_bytes != r->rows[0].page_bytes ||
		    r->rows[i].page_tokens != r->rows[0].page_tokens) {
			snprintf(buf, len, "mixed (see rows)");
			return;
		}
	}
	if (r->rows[0].page_tokens)
		snprintf(buf, len, "%" PRIu64 " bytes (%u tokens)",
			 r->rows[0].page_bytes, r->rows[0].page_tokens);
	else
		snprintf(buf, len, "%" PRIu64 " bytes", r->rows[0].page_bytes);
}

static double gib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

/* --------------------------------------------------------------- console */

int pcb_report_console(const struct pcb_report *r, FILE *out)
{
	size_t width[NCOLS];
	char cell[CELL], ps[96], version[64], host[128], cpu[128], started[32];

	page_size_str(r, ps, sizeof(ps));
	pcb_printable(version, sizeof(version), r->version);
	pcb_printable(host, sizeof(host), r->host);
	pcb_printable(cpu, sizeof(cpu), r->cpu);
	pcb_printable(started, sizeof(started), r->started);
	fprintf(out, "peercache-bench %s on %s (%s, %u CPUs, %.1f GiB)\n",
		version, host, cpu, r->cpus, gib(r->mem_bytes));
	fprintf(out, "started %s, page size %s; %s\n", started, ps,
		columns_note);
	for (size_t c = 0; c < NCOLS; c++) {
		width[c] = strlen(columns[c].head);
		for (unsigned i = 0; i < r->nrows; i++) {
			columns[c].cell(&r->rows[i], cell);
			if (strlen(cell) > width[c])
				width[c] = strlen(cell);
		}
	}
	fputs("  ", out);
	for (size_t c = 0; c < NCOLS; c++)
		fprintf(out, columns[c].left ? "%-*s%s" : "%*s%s",
			(int)width[c], columns[c].head,
			c + 1 < NCOLS ? "  " : "\n");
	for (unsigned i = 0; i < r->nrows; i++) {
		fputs(r->rows[i].peak ? "* " : "  ", out);
		for (size_t c = 0; c < NCOLS; c++) {
			columns[c].cell(&r->rows[i], cell);
			fprintf(out, columns[c].left ? "%-*s%s" : "%*s%s",
				(int)width[c], cell, c + 1 < NCOLS ? "  " : "\n");
		}
	}
	if (r->nrows)
		fputs("rows marked * are the peaks of their series (most "
		      "pages/s)\n",
		      out);
	return finish(out);
}

/* ------------------------------------------------------------------ JSON */

static void json_str(FILE *out, const char *s)
{
	struct pc_wbuf b;
	pc_wbuf_init(&b, 0);
	pc_json_str(&b, s, strlen(s));
	if (b.failed) {
		fprintf(stderr, "peercache-bench: out of memory writing a "
			"report string\n");
		fputs("null", out);
	} else {
		fwrite(b.data, 1, b.len, out);
	}
	pc_wbuf_free(&b);
}

/* lead, then "key": "val" */
static void json_member(FILE *out, const char *lead, const char *key,
			const char *val)
{
	fprintf(out, "%s\"%s\": ", lead, key);
	json_str(out, val);
}

/* The shortest %g that reads back as the same double. */
static void json_dbl(FILE *out, double v)
{
	char buf[40];

	v = fin(v);
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	fputs(buf, out);
}

/* lead, then "key": v */
static void json_dbl_member(FILE *out, const char *lead, const char *key,
			    double v)
{
	fprintf(out, "%s\"%s\": ", lead, key);
	json_dbl(out, v);
}

static void json_lat(FILE *out, const char *name, const struct pcb_lat *l)
{
	const char *sep = "";

	fprintf(out, ",\n      \"%s\": {", name);
#define X(f)                                \
	json_dbl_member(out, sep, #f, l->f); \
	sep = ", ";
	PCB_LAT_DBLS(X)
#undef X
	fputc('}', out);
}

static void json_row(FILE *out, const struct pcb_row *w)
{
	const char *sep = "\n      ";

	fputs("    {", out);
#define X(f)                        \
	json_member(out, sep, #f, w->f); \
	sep = ", ";
	PCB_ROW_STRS(X)
#undef X
	sep = ",\n      ";
#define X(f)                                               \
	fprintf(out, "%s\"" #f "\": %u", sep, w->f); \
	sep = ", ";
	PCB_ROW_UINTS(X)
#undef X
	sep = ",\n      ";
#define X(f)                                                          \
	fprintf(out, "%s\"" #f "\": %" PRIu64, sep, (uint64_t)w->f); \
	sep = ", ";
	PCB_ROW_U64S(X)
#undef X
	sep = ",\n      ";
#define X(f)                                \
	json_dbl_member(out, sep, #f, w->f); \
	sep = ", ";
	PCB_ROW_DBLS(X)
#undef X
	json_lat(out, "batch_lat", &w->batch_lat);
	json_lat(out, "page_lat", &w->page_lat);
	fprintf(out, ",\n      \"peak\": %s}", w->peak ? "true" : "false");
}

int pcb_report_json(const struct pcb_report *r, FILE *out)
{
	fputs("{\n  \"tool\": \"peercache-bench\",\n  \"format\": 1", out);
	json_member(out, ",\n  ", "version", r->version);
	json_member(out, ",\n  ", "build", r->build);
	json_member(out, ",\n  \"host\": {", "name", r->host);
	json_member(out, ", ", "kernel", r->kernel);
	json_member(out, ", ", "cpu", r->cpu);
	fprintf(out, ", \"cpus\": %u, \"mem_bytes\": %" PRIu64 "}", r->cpus,
		r->mem_bytes);
	json_member(out, ",\n  ", "started", r->started);
	json_member(out, ",\n  ", "command", r->command);
	fputs(",\n  \"settings\": {", out);
	for (unsigned i = 0; i < r->nsettings; i++) {
		fputs(i ? ",\n    " : "\n    ", out);
		json_str(out, r->settings[i].key);
		fputs(": ", out);
		json_str(out, r->settings[i].val);
	}
	fputs(r->nsettings ? "\n  },\n  \"rows\": [" : "},\n  \"rows\": [", out);
	for (unsigned i = 0; i < r->nrows; i++) {
		fputs(i ? ",\n" : "\n", out);
		json_row(out, &r->rows[i]);
	}
	fputs(r->nrows ? "\n  ]\n}\n" : "]\n}\n", out);
	return finish(out);
}

/* -------------------------------------------------------------- Markdown */

/* Text safe in a Markdown table cell or list item. */
static void md_text(FILE *out, const char *s)
{
	for (; *s; s++) {
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			fputc(' ', out);
		else if (strchr("\\`*_|<>[]#", *s))
			fprintf(out, "\\%c", *s);
		else
			fputc(*s, out);
	}
}

int pcb_report_markdown(const struct pcb_report *r, FILE *out)
{
	char cell[CELL], ps[96];

	page_size_str(r, ps, sizeof(ps));
	fputs("# peercache-bench report\n\n", out);
	fputs("## Host and build\n\n- host: ", out);
	md_text(out, r->host);
	fputs("\n- kernel: ", out);
	md_text(out, r->kernel);
	fputs("\n- cpu: ", out);
	md_text(out, r->cpu);
	fprintf(out, " (%u online)\n- memory: %.1f GiB\n- version: ", r->cpus,
		gib(r->mem_bytes));
	md_text(out, r->version);
	fputs("\n- build: ", out);
	md_text(out, r->build);
	fputs("\n- started: ", out);
	md_text(out, r->started);
	fputs("\n- page size: ", out);
	md_text(out, ps);
	fputs("\n- command: `", out);
	for (const char *s = r->command; *s; s++)
		fputc(*s == '`' || (unsigned char)*s < 0x20 ? '\'' : *s, out);
	fputs("`\n", out);
	if (r->nsettings) {
		fputs("\n## Settings\n\n| setting | value |\n|---|---|\n", out);
		for (unsigned i = 0; i < r->nsettings; i++) {
			fputs("| ", out);
			md_text(out, r->settings[i].key);
			fputs(" | ", out);
			md_text(out, r->settings[i].val);
			fputs(" |\n", out);
		}
	}
	fprintf(out, "\n## Results\n\n%s; the peak row of each series "
		     "(most pages/s) is in bold.\n\n|",
		columns_note);
	for (size_t c = 0; c < NCOLS; c++)
		fprintf(out, " %s |", columns[c].head);
	fputs("\n|", out);
	for (size_t c = 0; c < NCOLS; c++)
		fputs(columns[c].left ? "---|" : "---:|", out);
	fputc('\n', out);
	for (unsigned i = 0; i < r->nrows; i++) {
		const char *b = r->rows[i].peak ? "**" : "";

		fputc('|', out);
		for (size_t c = 0; c < NCOLS; c++) {
			columns[c].cell(&r->rows[i], cell);
			fprintf(out, " %s", b);
			md_text(out, cell);
			fprintf(out, "%s |", b);
		}
		fputc('\n', out);
	}
	return finish(out);
}

/* ------------------------------------------------------------------ HTML */

static void html_text(FILE *out, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", out); break;
		case '<': fputs("&lt;", out); break;
		case '>': fputs("&gt;", out); break;
		case '"': fputs("&quot;", out); break;
		case '\'': fputs("&#39;", out); break;
		default:
			if ((unsigned char)*s < 0x20 || *s == 0x7f)
				fputc(' ', out);
			else
				fputc(*s, out);
		}
	}
}

static const char *const palette[] = {
	"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
	"#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
};
#define NPALETTE (sizeof(palette) / sizeof(palette[0]))

/* Chart geometry (SVG user units = CSS pixels). */
#define CH_W 900
#define CH_L 90   /* plot area left */
#define CH_R 560  /* plot area right; the legend is to its right */
#define CH_T 20   /* plot area top */
#define CH_B 300  /* plot area bottom */
#define CH_PAD 20 /* keeps the end points off the axes */

static double row_pages_s(const struct pcb_row *w) { return w->pages_s; }
static double row_p99(const struct pcb_row *w) { return w->batch_lat.p99_us; }

/* 1, 2 or 5 times a power of ten, at least x (> 0). */
static double nice_step(double x)
{
	double e = pow(10, floor(log10(x)));
	double f = x / e;

	return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

static void si(char *buf, size_t len, double v)
{
	if (v >= 1e9)
		snprintf(buf, len, "%.3gG", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, len, "%.3gM", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, len, "%.3gk", v / 1e3);
	else
		snprintf(buf, len, "%.3g", v);
}

static double chart_log2(unsigned conc)
{
	return log2(conc ? (double)conc : 1.0);
}

/* series[i]: the index (0..) of row i's series, in order of first row. */
static unsigned number_series(const struct pcb_report *r, unsigned *series)
{
	unsigned n = 0;

	for (unsigned i = 0; i < r->nrows; i++) {
		series[i] = n;
		for (unsigned j = 0; j < i; j++) {
			if (pcb_same_series(&r->rows[j], &r->rows[i])) {
				series[i] = series[j];
				break;
			}
		}
		if (series[i] == n)
			n++;
	}
	return n;
}

static void html_chart(FILE *out, const struct pcb_report *r,
		       const unsigned *series, unsigned nseries,
		       const unsigned *order, const char *id,
		       const char *ylabel, double (*value)(const struct pcb_row *))
{
	double x0 = 0, x1 = 0, ymax = 0, step, top;
	unsigned h = CH_B + 60, nticks, xstep;
	char label[160], num[48];

	if (CH_T + 20 * nseries + 20 > h)
		h = CH_T + 20 * nseries + 20;
	fprintf(out, "<svg id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
		     "width=\"%d\" height=\"%u\" viewBox=\"0 0 %d %u\" role=\"img\">\n",
		id, CH_W, h, CH_W, h);
	fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%u\" fill=\"#fff\"/>\n",
		CH_W, h);
	for (unsigned i = 0; i < r->nrows; i++) {
		double lx = chart_log2(r->rows[i].concurrency);
		double v = fin(value(&r->rows[i]));

		if (i == 0 || lx < x0)
			x0 = lx;
		if (i == 0 || lx > x1)
			x1 = lx;
		if (v > ymax)
			ymax = v;
	}
	x0 = floor(x0);
	x1 = ceil(x1);
	if (x1 <= x0) { /* one concurrency: centre it */
		x0 -= 1;
		x1 += 1;
	}
	if (ymax <= 0)
		ymax = 1;
	step = nice_step(ymax / 5);
	nticks = (unsigned)ceil(ymax / step - 1e-9);
	if (nticks == 0)
		nticks = 1;
	top = step * nticks;
#define PX(lx) (CH_L + CH_PAD + ((lx) - x0) / (x1 - x0) * (CH_R - CH_L - 2 * CH_PAD))
#define PY(v) (CH_B - (v) / top * (CH_B - CH_T))
	/* y axis: grid lines and labels */
	for (unsigned t = 0; t <= nticks; t++) {
		double y = PY(step * t);
		si(num, sizeof(num), step * t);
		fprintf(out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
			     "stroke=\"%s\"/>"
			     "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
			CH_L, y, CH_R, y, t ? "#e4e4e4" : "#333", CH_L - 6, y + 4,
			num);
	}
	/* x axis: powers of two, at most about ten labels */
	xstep = (unsigned)ceil((x1 - x0 + 1) / 10);
	if (xstep == 0)
		xstep = 1;
	fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n",
		CH_L, CH_T, CH_L, CH_B);
	for (double k = x0; k <= x1 + 1e-9; k += xstep) {
		double x = PX(k);
		fprintf(out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
			     "stroke=\"#333\"/><text x=\"%.1f\" y=\"%d\" "
			     "text-anchor=\"middle\">%.0f</text>\n",
			x, CH_B, x, CH_B + 5, x, CH_B + 20, exp2(k));
	}
	fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
		     "concurrency (calls in flight, log2 scale)</text>\n",
		(CH_L + CH_R) / 2, CH_B + 42);
	fprintf(out, "<text transform=\"translate(18 %d) rotate(-90)\" "
		     "text-anchor=\"middle\">%s</text>\n",
		(CH_T + CH_B) / 2, ylabel);
	if (r->nrows == 0)
		fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
			     "no rows</text>\n",
			(CH_L + CH_R) / 2, (CH_T + CH_B) / 2);
	for (unsigned s = 0; s < nseries; s++) {
		const char *colour = palette[s % NPALETTE];
		const char *dash = s >= NPALETTE ? " stroke-dasharray=\"6 3\"" : "";
		const struct pcb_row *first = NULL;

		fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" "
			     "stroke-width=\"2\"%s points=\"",
			colour, dash);
		for (unsigned k = 0; k < r->nrows; k++) {
			const struct pcb_row *w = &r->rows[order[k]];
			if (series[order[k]] != s)
				continue;
			fprintf(out, "%s%.1f,%.1f", first ? " " : "",
				PX(chart_log2(w->concurrency)),
				PY(fmax(fin(value(w)), 0)));
			if (!first)
				first = w;
		}
		fputs("\"/>\n", out);
		pcb_series_label(first, label, sizeof(label));
		for (unsigned k = 0; k < r->nrows; k++) {
			const struct pcb_row *w = &r->rows[order[k]];
			double v = fin(value(w));
			if (series[order[k]] != s)
				continue;
			fprintf(out, "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" "
				     "r=\"%d\" fill=\"%s\" stroke=\"%s\" "
				     "data-series=\"",
				PX(chart_log2(w->concurrency)), PY(fmax(v, 0)),
				w->peak ? 7 : 5, colour, colour);
			html_text(out, label);
			fprintf(out, "\" data-x=\"%u\" data-y=\"%.17g\"><title>",
				w->concurrency, v);
			html_text(out, label);
			fprintf(out, ": concurrency %u, %s %.6g%s</title></circle>\n",
				w->concurrency, ylabel, v, w->peak ? " (peak)" : "");
		}
		/* legend entry */
		fprintf(out, "<line x1=\"%d\" y1=\"%u\" x2=\"%d\" y2=\"%u\" "
			     "stroke=\"%s\" stroke-width=\"3\"%s/>"
			     "<text x=\"%d\" y=\"%u\">",
			CH_R + 20, CH_T + 20 * s + 6, CH_R + 44, CH_T + 20 * s + 6,
			colour, dash, CH_R + 50, CH_T + 20 * s + 10);
		html_text(out, label);
		fputs("</text>\n", out);
	}
#undef PX
#undef PY
	fputs("</svg>\n", out);
}

static void html_kv(FILE *out, const char *k, const char *v)
{
	fputs("<tr><th>", out);
	html_text(out, k);
	fputs("</th><td>", out);
	html_text(out, v);
	fputs("</td></tr>\n", out);
}

static const char html_style[] =
	"body{font-family:sans-serif;margin:2em;color:#222}"
	"table{border-collapse:collapse;margin:1em 0}"
	"th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}"
	"table.kv th,table.kv td,td.l,th.l{text-align:left}"
	"tr.peak td{font-weight:bold}"
	"svg{display:block;margin:1em 0}"
	"svg text{font-family:sans-serif;font-size:12px;fill:#222}"
	"code{white-space:pre-wrap}";

int pcb_report_html(const struct pcb_report *r, FILE *out)
{
	char cell[CELL], buf[256];
	unsigned *series = calloc(r->nrows ? r->nrows : 1, sizeof(*series));
	unsigned *order = calloc(r->nrows ? r->nrows : 1, sizeof(*order));
	unsigned nseries;

	if (!series || !order) {
		free(series);
		free(order);
		return -ENOMEM;
	}
	nseries = number_series(r, series);
	/* rows by concurrency (stable), so each polyline runs left to right */
	for (unsigned i = 0; i < r->nrows; i++) {
		unsigned k = i;
		while (k > 0 && r->rows[order[k - 1]].concurrency >
					r->rows[i].concurrency) {
			order[k] = order[k - 1];
			k--;
		}
		order[k] = i;
	}
	fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
	      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src "
	      "'none'; style-src 'unsafe-inline'\">\n<title>peercache-bench: ",
	      out);
	html_text(out, r->host);
	fputs(" ", out);
	html_text(out, r->started);
	fprintf(out, "</title>\n<style>%s</style></head><body>\n"
		     "<h1>peercache-bench report</h1>\n<h2>Host and build</h2>\n"
		     "<table class=\"kv\">\n",
		html_style);
	html_kv(out, "host", r->host);
	html_kv(out, "kernel", r->kernel);
	snprintf(buf, sizeof(buf), "%s (%u online)", r->cpu, r->cpus);
	html_kv(out, "cpu", buf);
	snprintf(buf, sizeof(buf), "%.1f GiB", gib(r->mem_bytes));
	html_kv(out, "memory", buf);
	html_kv(out, "version", r->version);
	html_kv(out, "build", r->build);
	html_kv(out, "started", r->started);
	page_size_str(r, buf, sizeof(buf));
	html_kv(out, "page size", buf);
	fputs("<tr><th>command</th><td><code>", out);
	html_text(out, r->command);
	fputs("</code></td></tr>\n</table>\n", out);
	if (r->nsettings) {
		fputs("<h2>Settings</h2>\n<table class=\"kv\">\n", out);
		for (unsigned i = 0; i < r->nsettings; i++)
			html_kv(out, r->settings[i].key, r->settings[i].val);
		fputs("</table>\n", out);
	}
	fputs("<h2>Throughput against concurrency</h2>\n", out);
	html_chart(out, r, series, nseries, order, "chart-throughput",
		   "pages/s", row_pages_s);
	fputs("<h2>p99 latency per batch against concurrency</h2>\n", out);
	html_chart(out, r, series, nseries, order, "chart-p99",
		   "p99 per batch (\xc2\xb5s)", row_p99);
	fprintf(out, "<h2>Rows</h2>\n<p>%s; the peak row of each series "
		     "(most pages/s) is in bold.</p>\n<div style=\"overflow-x:auto\">"
		     "<table class=\"rows\">\n<tr>",
		columns_note);
	for (size_t c = 0; c < NCOLS; c++)
		fprintf(out, "<th%s>%s</th>",
			columns[c].left ? " class=\"l\"" : "", columns[c].head);
	fputs("</tr>\n", out);
	for (unsigned i = 0; i < r->nrows; i++) {
		fputs(r->rows[i].peak ? "<tr class=\"peak\">" : "<tr>", out);
		for (size_t c = 0; c < NCOLS; c++) {
			columns[c].cell(&r->rows[i], cell);
			fputs(columns[c].left ? "<td class=\"l\">" : "<td>", out);
			html_text(out, cell);
			fputs("</td>", out);
		}
		fputs("</tr>\n", out);
	}
	fputs("</table></div>\n</body></html>\n", out);
	free(series);
	free(order);
	return finish(out);
}

/* ----------------------------------------------------------------- files */

int pcb_report_write_files(const struct pcb_report *r, const char *prefix,
			   char *err, size_t errlen)
{
	static const struct {
		const char *ext;
		int (*write)(const struct pcb_report *r, FILE *out);
	} forms[] = {
		{ ".json", pcb_report_json },
		{ ".md", pcb_report_markdown },
		{ ".html", pcb_report_html },
	};
	char path[4096];

	for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
		FILE *f;
		int rc;

		if ((size_t)snprintf(path, sizeof(path), "%s%s", prefix,
				     forms[i].ext) >= sizeof(path)) {
			snprintf(err, errlen, "%s%s: path too long", prefix,
				 forms[i].ext);
			return -ENAMETOOLONG;
		}
		f = fopen(path, "w");
		if (!f) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-rc));
			return rc;
		}
		errno = 0;
		rc = forms[i].write(r, f);
		if (fclose(f) != 0 && rc == 0)
			rc = errno ? -errno : -EIO;
		if (rc < 0) {
			snprintf(err, errlen, "%s: write failed: %s", path,
				 strerror(-rc));
			return rc;
		}
	}
	return 0;
}
