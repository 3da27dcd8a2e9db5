/*
 * common/config.c — the table-driven configuration engine (see config.h).
 *
 * Owns: nothing global. All state lives in the caller's settings struct; the
 * only heap memory is the char * of STRING fields, which this file allocates
 * on set and releases in pc_cfg_free (or when a string is set again).
 * Threads: main thread only, before any reactor starts; no locks needed.
 * Invariants:
 *   - a failed set leaves the field exactly as it was (parse first, store last);
 *   - after pc_cfg_defaults (even a failed one) every STRING field is NULL or
 *     heap-owned, so pc_cfg_free is always safe; after a successful one it is
 *     never NULL (a NULL def means ""), so readers need no NULL checks;
 *   - every error is a single line: user text is shown through cfg_show(),
 *     which escapes non-printable bytes and cuts long values with "...";
 *   - SECRET values never appear in dumps or error messages.
 * Limits: key names CFG_NAME_MAX, file lines CFG_LINE_MAX bytes and
 * CFG_FILE_LINES_MAX lines, values and paths shown in errors CFG_SHOW_MAX and
 * CFG_PATH_SHOW_MAX bytes.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define CFG_NAME_MAX 64          /* longest key name, normalized, with NUL */
#define CFG_LINE_MAX 4096        /* longest config file line, newline excluded */
#define CFG_FILE_LINES_MAX 65536 /* a config file is hand-written; more is a mistake */
#define CFG_SHOW_MAX 64          /* bytes of a value echoed in an error */
#define CFG_PATH_SHOW_MAX 256    /* bytes of a file path echoed in an error */
#define CFG_ENV_PREFIX "PEERCACHE_"
#define CFG_DEFAULT_ORIGIN "built-in default"

static const char cfg_size_allowed[] =
	"a whole number with an optional unit b, k/kb/kib, m/mb/mib, g/gb/gib, "
	"t/tb/tib";
static const char cfg_duration_allowed[] =
	"a number with an optional unit us, ms, s, m, h; a bare number is seconds";

/* Where an error line goes and what it starts with. */
struct cfg_errctx {
	const char *origin;
	char *err;
	size_t errlen;
};

struct cfg_unit {
	const char *name;
	uint64_t mult;
};

/* ---- error helpers ---------------------------------------------------- */

PC_PRINTF(3, 4)
static void cfg_err(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/*
 * Render untrusted text for an error line: bytes outside printable ASCII
 * become \xNN (a raw newline or terminal escape must never reach a log;
 * '\\' too, so the escapes are unambiguous), and whatever does not fit in
 * len - 4 bytes becomes "...". Size buf for the longest text worth showing.
 */
static const char *cfg_show(const char *v, char *buf, size_t len)
{
	PC_ASSERT(len >= 8);
	size_t cap = len - 4, o = 0;
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\';
		size_t need = plain ? 1 : 4;
		if (o + need > cap) {
			memcpy(buf + o, "...", 4);
			return buf;
		}
		if (plain)
			buf[o++] = (char)*p;
		else
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
	}
	buf[o] = '\0';
	return buf;
}

/* "<origin>: <key>: '<value>' <problem> (allowed: <allowed>)" */
static int cfg_bad_value(const struct cfg_errctx *e, const struct pc_cfg_key *k,
			 const char *value, const char *problem,
			 const char *allowed)
{
	char shown[CFG_SHOW_MAX + 4];
	/* A rejected password is still a password: do not echo it to logs. */
	const char *v = (k->flags & PC_CFG_SECRET) ? "***"
			: cfg_show(value, shown, sizeof(shown));
	cfg_err(e->err, e->errlen, "%s: %s: '%s' %s (allowed: %s)", e->origin,
		k->name, v, problem, allowed);
	return -EINVAL;
}

/* ---- value parsers ---------------------------------------------------- */

int pc_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};
	for (size_t i = 0; i < PC_ARRAY_LEN(yes); i++) {
		if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
			*out = strcasecmp(s, yes[i]) == 0;
			return 0;
		}
	}
	return -EINVAL;
}

/* Leading decimal digits into *out; returns chars consumed or -ERANGE. */
static int cfg_digits(const char **sp, uint64_t limit, uint64_t *out)
{
	const char *s = *sp;
	uint64_t v = 0;
	for (; *s >= '0' && *s <= '9'; s++) {
		uint64_t d = (uint64_t)(*s - '0');
		if (v > (limit - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	int n = (int)PC_MIN(s - *sp, (long)INT32_MAX);
	*sp = s;
	*out = v;
	return n;
}

int pc_parse_int(const char *s, int64_t *out)
{
	bool neg = *s == '-';
	if (*s == '-' || *s == '+')
		s++;
	uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	uint64_t mag;
	int n = cfg_digits(&s, limit, &mag);
	if (n < 0) {
		/* Keep scanning so "99999999999999999999x" is junk, not range. */
		while (*s >= '0' && *s <= '9')
			s++;
		return *s ? -EINVAL : -ERANGE;
	}
	if (n == 0 || *s)
		return -EINVAL;
	/* -2^63 has no positive counterpart; negate in unsigned arithmetic. */
	*out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
	return 0;
}

static const char *cfg_skip_blank(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

static const struct cfg_unit *cfg_unit_find(const struct cfg_unit *u,
					    const char *name)
{
	for (; u->name; u++)
		if (strcasecmp(u->name, name) == 0)
			return u;
	return NULL;
}

int pc_parse_size(const char *s, uint64_t *out)
{
	static const struct cfg_unit units[] = {
		{"", 1},           {"b", 1},
		{"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
		{"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
		{"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
		{"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
		{NULL, 0},
	};
	uint64_t n;
	int r = cfg_digits(&s, UINT64_MAX, &n);
	if (r <= 0) /* no digits (empty, "-1", ".5") or an overflowing number */
		return r == 0 ? -EINVAL : -ERANGE;
	const struct cfg_unit *u = cfg_unit_find(units, cfg_skip_blank(s));
	if (!u)
		return -EINVAL;
	if (__builtin_mul_overflow(n, u->mult, out))
		return -ERANGE;
	return 0;
}

/*
 * Durations accept a fraction ("1.5s") because the Python PeerCache took float
 * seconds. The value is computed exactly in microseconds from up to 9
 * fraction digits, then rounded to the nearest millisecond (halves up); a
 * non-zero input never rounds to 0 ms, so "250us" is 1 ms, not "disabled".
 */
int pc_parse_duration_ms(const char *s, uint64_t *out)
{
	static const struct cfg_unit units[] = {
		{"", 1000000}, {"us", 1},           {"ms", 1000},
		{"s", 1000000}, {"m", 60000000ull}, {"h", 3600000000ull},
		{NULL, 0},
	};
	uint64_t ip = 0, frac = 0, scale = 1;
	bool tiny = false; /* non-zero digits beyond the 9th fraction digit */
	int r = cfg_digits(&s, UINT64_MAX, &ip);
	if (r < 0)
		return -ERANGE;
	int ndigits = r;
	if (*s == '.') {
		for (s++; *s >= '0' && *s <= '9'; s++, ndigits++) {
			if (scale < 1000000000ull) {
				frac = frac * 10 + (uint64_t)(*s - '0');
				scale *= 10;
			} else if (*s != '0') {
				tiny = true;
			}
		}
	}
	const struct cfg_unit *u = cfg_unit_find(units, cfg_skip_blank(s));
	if (ndigits == 0 || !u)
		return -EINVAL;
	uint64_t us;
	/* frac < 1e9 and mult <= 3.6e9, so frac * mult fits in 64 bits. */
	uint64_t fprod = frac * u->mult;
	tiny = tiny || fprod % scale;
	if (__builtin_mul_overflow(ip, u->mult, &us) ||
	    __builtin_add_overflow(us, fprod / scale, &us))
		return -ERANGE;
	uint64_t ms = us / 1000 + (us % 1000 >= 500);
	if (ms == 0 && (us || tiny))
		ms = 1;
	*out = ms;
	return 0;
}

void pc_format_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *const names[] = {"tb", "gb", "mb", "kb"};
	for (size_t i = 0; i < PC_ARRAY_LEN(names) && bytes; i++) {
		uint64_t unit = 1ull << (10 * (4 - i));
		if (bytes % unit == 0) {
			snprintf(buf, len, "%llu%s",
				 (unsigned long long)(bytes / unit), names[i]);
			return;
		}
	}
	snprintf(buf, len, "%llu", (unsigned long long)bytes);
}

/* Largest unit that is exact, so the text parses back to the same value. */
static void cfg_format_duration(uint64_t ms, char *buf, size_t len)
{
	static const struct cfg_unit units[] = {
		{"h", 3600000}, {"m", 60000}, {"s", 1000}, {NULL, 0},
	};
	for (const struct cfg_unit *u = units; u->name && ms; u++) {
		if (ms % u->mult == 0) {
			snprintf(buf, len, "%llu%s",
				 (unsigned long long)(ms / u->mult), u->name);
			return;
		}
	}
	snprintf(buf, len, "%llums", (unsigned long long)ms);
}

/* ---- per-type apply / dump -------------------------------------------- */

static void *cfg_field(const struct pc_cfg_key *k, void *settings)
{
	return (char *)settings + k->offset;
}

static const void *cfg_cfield(const struct pc_cfg_key *k, const void *settings)
{
	return (const char *)settings + k->offset;
}

static int cfg_apply_bool(const struct pc_cfg_key *k, void *f, const char *v,
			  const struct cfg_errctx *e)
{
	bool b;
	if (pc_parse_bool(v, &b) < 0)
		return cfg_bad_value(e, k, v, "is not a boolean",
				     "true/false, yes/no, on/off, 1/0");
	*(bool *)f = b;
	return 0;
}

static int cfg_apply_int(const struct pc_cfg_key *k, void *f, const char *v,
			 const struct cfg_errctx *e)
{
	char allowed[64];
	snprintf(allowed, sizeof(allowed), "%lld..%lld", (long long)k->min,
		 (long long)k->max);
	int64_t n;
	int r = pc_parse_int(v, &n);
	if (r == -EINVAL)
		return cfg_bad_value(e, k, v, "is not an integer", allowed);
	if (r < 0 || n < k->min || n > k->max)
		return cfg_bad_value(e, k, v, "is out of range", allowed);
	*(int64_t *)f = n;
	return 0;
}

/* SIZE and DURATION: unsigned values with bounds shown in human units. */
static int cfg_apply_unsigned(const struct pc_cfg_key *k, void *f,
			      const char *v, const struct cfg_errctx *e)
{
	bool size = k->type == PC_CFG_SIZE;
	void (*fmt)(uint64_t, char *, size_t) =
		size ? pc_format_size : cfg_format_duration;
	uint64_t lo = k->min > 0 ? (uint64_t)k->min : 0;
	uint64_t hi = k->max > 0 ? (uint64_t)k->max : 0;
	uint64_t n;
	int r = size ? pc_parse_size(v, &n) : pc_parse_duration_ms(v, &n);
	if (r == -EINVAL)
		return cfg_bad_value(e, k, v, size ? "is not a size"
					      : "is not a duration",
				     size ? cfg_size_allowed
					  : cfg_duration_allowed);
	if (r < 0 || n < lo || n > hi) {
		char a[32], b[32], allowed[80];
		fmt(lo, a, sizeof(a));
		fmt(hi, b, sizeof(b));
		snprintf(allowed, sizeof(allowed), "%s..%s", a, b);
		return cfg_bad_value(e, k, v, "is out of range", allowed);
	}
	*(uint64_t *)f = n;
	return 0;
}

static int cfg_apply_string(const struct pc_cfg_key *k, void *f, const char *v,
			    const struct cfg_errctx *e)
{
	char allowed[64];
	size_t len = strlen(v);
	if (len > (uint64_t)k->max) {
		snprintf(allowed, sizeof(allowed), "at most %lld bytes",
			 (long long)k->max);
		return cfg_bad_value(e, k, v, "is too long", allowed);
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)v[i];
		if (c < 0x20 || c == 0x7f)
			return cfg_bad_value(e, k, v,
					     "contains a control character",
					     "printable text, no tabs or newlines");
	}
	char *copy = strdup(v);
	if (!copy) {
		cfg_err(e->err, e->errlen, "%s: %s: out of memory", e->origin,
			k->name);
		return -ENOMEM;
	}
	free(*(char **)f);
	*(char **)f = copy;
	return 0;
}

/* "a, b, c" for errors or "a|b|c" for help; cut with "..." if it is long. */
static void cfg_join_choices(const struct pc_cfg_key *k, const char *sep,
			     char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = '\0';
	for (const char *const *c = k->choices; *c; c++) {
		int n = snprintf(buf + o, len - o, "%s%s", o ? sep : "", *c);
		if (n < 0 || (size_t)n >= len - o) {
			if (len >= 4)
				memcpy(buf + len - 4, "...", 4);
			return;
		}
		o += (size_t)n;
	}
}

static int cfg_apply_enum(const struct pc_cfg_key *k, void *f, const char *v,
			  const struct cfg_errctx *e)
{
	for (int i = 0; k->choices[i]; i++) {
		if (strcasecmp(v, k->choices[i]) == 0) {
			*(int *)f = i;
			return 0;
		}
	}
	char allowed[256];
	cfg_join_choices(k, ", ", allowed, sizeof(allowed));
	return cfg_bad_value(e, k, v, "is not allowed", allowed);
}

static void cfg_dump_bool(const struct pc_cfg_key *k, const void *f, FILE *out)
{
	fputs(*(const bool *)f ? "true" : "false", out);
}

static void cfg_dump_int(const struct pc_cfg_key *k, const void *f, FILE *out)
{
	fprintf(out, "%lld", (long long)*(const int64_t *)f);
}

static void cfg_dump_unsigned(const struct pc_cfg_key *k, const void *f,
			      FILE *out)
{
	char buf[32];
	if (k->type == PC_CFG_SIZE)
		pc_format_size(*(const uint64_t *)f, buf, sizeof(buf));
	else
		cfg_format_duration(*(const uint64_t *)f, buf, sizeof(buf));
	fputs(buf, out);
}

/* Quote only when the file parser would otherwise change the value. */
static bool cfg_needs_quotes(const char *s)
{
	size_t len = strlen(s);
	return len == 0 || s[0] == '"' || isspace((unsigned char)s[0]) ||
	       isspace((unsigned char)s[len - 1]) || strchr(s, '#');
}

static void cfg_dump_string(const struct pc_cfg_key *k, const void *f,
			    FILE *out)
{
	const char *s = *(char *const *)f;
	if (!s)
		s = "";
	if (k->flags & PC_CFG_SECRET) {
		fputs(*s ? "***" : "\"\"", out);
		return;
	}
	bool quote = cfg_needs_quotes(s);
	if (quote)
		fputc('"', out);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (quote && (c == '"' || c == '\\'))
			fputc('\\', out);
		/* Set can't store control bytes; guard direct writes anyway. */
		fputc(c < 0x20 || c == 0x7f ? '?' : c, out);
	}
	if (quote)
		fputc('"', out);
}

static void cfg_dump_enum(const struct pc_cfg_key *k, const void *f, FILE *out)
{
	int i = *(const int *)f, n = 0;
	while (k->choices[n])
		n++;
	fputs(i >= 0 && i < n ? k->choices[i] : "?", out);
}

struct cfg_type_ops {
	const char *metavar; /* --help placeholder; NULL: built from choices */
	int (*apply)(const struct pc_cfg_key *k, void *field, const char *v,
		     const struct cfg_errctx *e);
	void (*dump)(const struct pc_cfg_key *k, const void *field, FILE *out);
};

static const struct cfg_type_ops cfg_types[] = {
	[PC_CFG_BOOL] = {"[BOOL]", cfg_apply_bool, cfg_dump_bool},
	[PC_CFG_INT] = {"N", cfg_apply_int, cfg_dump_int},
	[PC_CFG_SIZE] = {"SIZE", cfg_apply_unsigned, cfg_dump_unsigned},
	[PC_CFG_DURATION] = {"DURATION", cfg_apply_unsigned, cfg_dump_unsigned},
	[PC_CFG_STRING] = {"STR", cfg_apply_string, cfg_dump_string},
	[PC_CFG_ENUM] = {NULL, cfg_apply_enum, cfg_dump_enum},
};

/* ---- key lookup --------------------------------------------------------- */

/* Lowercase, '-' -> '_'. -ENAMETOOLONG if it does not fit CFG_NAME_MAX. */
static int cfg_normalize(const char *in, size_t n, char *out)
{
	if (n >= CFG_NAME_MAX)
		return -ENAMETOOLONG;
	for (size_t i = 0; i < n; i++)
		out[i] = in[i] == '-' ? '_' : (char)tolower((unsigned char)in[i]);
	out[n] = '\0';
	return 0;
}

static const struct pc_cfg_key *cfg_find_norm(const struct pc_cfg_table *t,
					      const char *norm)
{
	for (size_t i = 0; i < t->n; i++)
		if (strcmp(t->keys[i].name, norm) == 0)
			return &t->keys[i];
	return NULL;
}

const struct pc_cfg_key *pc_cfg_find(const struct pc_cfg_table *t,
				     const char *name)
{
	char norm[CFG_NAME_MAX];
	if (cfg_normalize(name, strlen(name), norm) < 0)
		return NULL;
	return cfg_find_norm(t, norm);
}

/* Levenshtein distance; both strings are shorter than CFG_NAME_MAX. */
static size_t cfg_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), row[CFG_NAME_MAX + 1];
	PC_ASSERT(la < CFG_NAME_MAX && lb < CFG_NAME_MAX);
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t sub = diag + (a[i - 1] != b[j - 1]);
			row[j] = PC_MIN(PC_MIN(row[j - 1] + 1, up + 1), sub);
			diag = up;
		}
	}
	return row[lb];
}

static int cfg_unknown_key(const struct pc_cfg_table *t, const char *name,
			   const struct cfg_errctx *e)
{
	char norm[CFG_NAME_MAX], shown[CFG_SHOW_MAX + 4];
	const char *best = NULL;
	if (cfg_normalize(name, strlen(name), norm) == 0) {
		size_t limit = PC_MAX((size_t)2, strlen(norm) / 3), best_d = 0;
		for (size_t i = 0; i < t->n; i++) {
			size_t d = cfg_distance(norm, t->keys[i].name);
			if (d <= limit && (!best || d < best_d)) {
				best = t->keys[i].name;
				best_d = d;
			}
		}
	}
	cfg_err(e->err, e->errlen, "%s: unknown key '%s'%s%s%s", e->origin,
		cfg_show(name, shown, sizeof(shown)),
		best ? "; did you mean '" : "", best ? best : "",
		best ? "'?" : "");
	return -ENOENT;
}

/* Offer an unknown name to the table's alias hook; -ENOENT if it has none
 * or the name is not an alias either. */
static int cfg_alias(const struct pc_cfg_table *t, void *settings,
		     const char *name, const char *value,
		     const struct cfg_errctx *e)
{
	char norm[CFG_NAME_MAX];
	if (!t->alias || cfg_normalize(name, strlen(name), norm) < 0)
		return -ENOENT;
	return t->alias(settings, norm, value, e->origin, e->err, e->errlen);
}

int pc_cfg_set(const struct pc_cfg_table *t, void *settings, const char *name,
	       const char *value, const char *origin, char *err, size_t errlen)
{
	struct cfg_errctx e = {origin, err, errlen};
	const struct pc_cfg_key *k = pc_cfg_find(t, name);
	if (!k) {
		int r = cfg_alias(t, settings, name, value, &e);
		return r == -ENOENT ? cfg_unknown_key(t, name, &e) : r;
	}
	return cfg_types[k->type].apply(k, cfg_field(k, settings), value, &e);
}

/* ---- defaults, free ----------------------------------------------------- */

/* A table bug should fail the unit tests, not surface at a user's start-up. */
static const char *cfg_check_key(const struct pc_cfg_table *t, size_t i)
{
	const struct pc_cfg_key *k = &t->keys[i];
	if (!k->name || !*k->name || strlen(k->name) >= CFG_NAME_MAX ||
	    strspn(k->name, "abcdefghijklmnopqrstuvwxyz0123456789_") !=
		    strlen(k->name))
		return "name must be short snake_case";
	if ((unsigned)k->type >= PC_ARRAY_LEN(cfg_types))
		return "unknown type";
	for (size_t j = 0; j < i; j++)
		if (strcmp(t->keys[j].name, k->name) == 0)
			return "duplicate name";
	if (k->min > k->max)
		return "min > max";
	if ((k->type == PC_CFG_SIZE || k->type == PC_CFG_DURATION) && k->min < 0)
		return "negative min";
	if (k->type == PC_CFG_STRING && k->max <= 0)
		return "a string needs a max length";
	if (k->type == PC_CFG_ENUM && (!k->choices || !k->choices[0]))
		return "an enum needs choices";
	if (k->type != PC_CFG_STRING && !k->def)
		return "missing default";
	return NULL;
}

int pc_cfg_defaults(const struct pc_cfg_table *t, void *settings, char *err,
		    size_t errlen)
{
	struct cfg_errctx e = {CFG_DEFAULT_ORIGIN, err, errlen};
	/* settings may be uninitialised: never free what we did not allocate. */
	for (size_t i = 0; i < t->n; i++)
		if (t->keys[i].type == PC_CFG_STRING)
			*(char **)cfg_field(&t->keys[i], settings) = NULL;
	for (size_t i = 0; i < t->n; i++) {
		const struct pc_cfg_key *k = &t->keys[i];
		const char *why = cfg_check_key(t, i);
		if (why) {
			cfg_err(err, errlen, "%s: %s: bad key table entry: %s",
				e.origin, k->name ? k->name : "(null)", why);
			return -EINVAL;
		}
		int r = cfg_types[k->type].apply(k, cfg_field(k, settings),
						 k->def ? k->def : "", &e);
		if (r < 0)
			return r;
	}
	return 0;
}

bool pc_cfg_differs(const struct pc_cfg_key *k, const void *a, const void *b)
{
	const void *fa = cfg_cfield(k, a), *fb = cfg_cfield(k, b);
	switch (k->type) {
	case PC_CFG_BOOL:
		return *(const bool *)fa != *(const bool *)fb;
	case PC_CFG_INT:
		return *(const int64_t *)fa != *(const int64_t *)fb;
	case PC_CFG_SIZE:
	case PC_CFG_DURATION:
		return *(const uint64_t *)fa != *(const uint64_t *)fb;
	case PC_CFG_ENUM:
		return *(const int *)fa != *(const int *)fb;
	case PC_CFG_STRING: {
		const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
		return strcmp(sa ? sa : "", sb ? sb : "") != 0;
	}
	}
	return false;
}

void pc_cfg_free(const struct pc_cfg_table *t, void *settings)
{
	for (size_t i = 0; i < t->n; i++) {
		if (t->keys[i].type != PC_CFG_STRING)
			continue;
		char **p = cfg_field(&t->keys[i], settings);
		free(*p);
		*p = NULL;
	}
}

/* ---- config file ------------------------------------------------------- */

/* One line without its newline. 1: line, 0: EOF, -E2BIG: too long,
 * -EILSEQ: NUL byte, -EIO: read error. */
static int cfg_read_line(FILE *f, char *buf, size_t cap)
{
	size_t n = 0;
	int c;
	while ((c = getc(f)) != EOF && c != '\n') {
		if (c == '\0')
			return -EILSEQ;
		if (n + 1 >= cap)
			return -E2BIG;
		buf[n++] = (char)c;
	}
	buf[n] = '\0';
	if (ferror(f))
		return -EIO;
	return c == EOF && n == 0 ? 0 : 1;
}

static void cfg_rtrim(char *s, char *end)
{
	while (end > s && isspace((unsigned char)end[-1]))
		end--;
	*end = '\0';
}

static char *cfg_skip_space(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	return s;
}

/* Unquote a "..." value in place; p points at the opening quote. */
static const char *cfg_unquote(char *p, char **value)
{
	char *o = p, *s = p + 1;
	*value = o;
	for (; *s != '"'; s++) {
		if (!*s)
			return "unterminated quoted value";
		if (*s == '\\') {
			s++;
			if (*s != '"' && *s != '\\')
				return "bad escape in quoted value (only \\\" and \\\\)";
		}
		*o++ = *s;
	}
	*o = '\0';
	s = cfg_skip_space(s + 1);
	if (*s && *s != '#')
		return "unexpected text after quoted value";
	return NULL;
}

/* Split "key = value # comment" in place. Returns NULL, or a problem text;
 * *key is NULL for a blank or comment-only line. */
static const char *cfg_split_line(char *line, char **key, char **value)
{
	cfg_rtrim(line, line + strlen(line)); /* also drops a CRLF's '\r' */
	char *p = cfg_skip_space(line);
	*key = NULL;
	if (!*p || *p == '#')
		return NULL;
	char *start = p;
	while (*p && *p != '=' && !isspace((unsigned char)*p))
		p++;
	char *key_end = p;
	p = cfg_skip_space(p);
	if (*p != '=' || key_end == start)
		return "expected 'key = value'";
	*key_end = '\0';
	*key = start;
	p = cfg_skip_space(p + 1);
	if (*p == '"')
		return cfg_unquote(p, value);
	*value = p;
	/* '#' starts a comment only after whitespace, so "a#b" stays a value
	 * and "key =   # note" is an empty value (q[-1] is at worst the '='). */
	for (char *q = p; *q; q++) {
		if (*q == '#' && isspace((unsigned char)q[-1])) {
			cfg_rtrim(p, q);
			break;
		}
	}
	return NULL;
}

static int cfg_file_line(const struct pc_cfg_table *t, void *settings,
			 char *line, const char *origin, char *err,
			 size_t errlen)
{
	char *key, *value;
	const char *problem = cfg_split_line(line, &key, &value);
	if (problem) {
		cfg_err(err, errlen, "%s: %s", origin, problem);
		return -EINVAL;
	}
	if (!key)
		return 0;
	return pc_cfg_set(t, settings, key, value, origin, err, errlen);
}

static int cfg_file_lines(const struct pc_cfg_table *t, void *settings,
			  FILE *f, const char *path, char *err, size_t errlen)
{
	char line[CFG_LINE_MAX + 2], shown[CFG_PATH_SHOW_MAX + 4];
	char origin[sizeof(shown) + 16];
	_Static_assert(CFG_LINE_MAX == 4096, "update the E2BIG message");
	cfg_show(path, shown, sizeof(shown));
	for (unsigned lineno = 1;; lineno++) {
		snprintf(origin, sizeof(origin), "%s:%u", shown, lineno);
		int r = cfg_read_line(f, line, CFG_LINE_MAX + 1);
		if (r == 0)
			return 0;
		if (lineno > CFG_FILE_LINES_MAX) {
			cfg_err(err, errlen, "%s: too many lines (max %d)",
				origin, CFG_FILE_LINES_MAX);
			return -E2BIG;
		}
		if (r < 0) {
			cfg_err(err, errlen, "%s: %s", origin,
				r == -E2BIG    ? "line is longer than 4096 bytes"
				: r == -EILSEQ ? "line contains a NUL byte"
					       : "read error");
			return r;
		}
		r = cfg_file_line(t, settings, line, origin, err, errlen);
		if (r < 0)
			return r;
	}
}

int pc_cfg_load_file(const struct pc_cfg_table *t, void *settings,
		     const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		int r = -errno;
		char shown[CFG_PATH_SHOW_MAX + 4];
		cfg_err(err, errlen, "cannot read config file '%s': %s",
			cfg_show(path, shown, sizeof(shown)), strerror(-r));
		return r;
	}
	int r = cfg_file_lines(t, settings, f, path, err, errlen);
	fclose(f);
	return r;
}

/* ---- environment ------------------------------------------------------- */

static bool cfg_listed(const char *const *list, const char *name, bool norm)
{
	char a[CFG_NAME_MAX], b[CFG_NAME_MAX];
	if (norm && cfg_normalize(name, strlen(name), a) < 0)
		return false;
	for (; list && *list; list++) {
		if (!norm && strcmp(*list, name) == 0)
			return true;
		if (norm && cfg_normalize(*list, strlen(*list), b) == 0 &&
		    strcmp(a, b) == 0)
			return true;
	}
	return false;
}

int pc_cfg_load_env(const struct pc_cfg_table *t, void *settings,
		    char *const *envp, const char *const *ignore,
		    void (*warn)(const char *var, void *arg), void *warn_arg,
		    char *err, size_t errlen)
{
	const size_t plen = strlen(CFG_ENV_PREFIX);
	char var[CFG_NAME_MAX + 16], origin[CFG_NAME_MAX + 32];
	for (; envp && *envp; envp++) {
		const char *eq = strchr(*envp, '=');
		if (!eq || strncmp(*envp, CFG_ENV_PREFIX, plen) != 0)
			continue;
		size_t n = PC_MIN((size_t)(eq - *envp), sizeof(var) - 1);
		memcpy(var, *envp, n);
		var[n] = '\0';
		if (cfg_listed(ignore, var, false))
			continue;
		/* A name that got cut above cannot be a key: it warns. */
		const struct pc_cfg_key *k =
			n == (size_t)(eq - *envp) ? pc_cfg_find(t, var + plen)
						  : NULL;
		snprintf(origin, sizeof(origin), "environment %s", var);
		if (!k && n == (size_t)(eq - *envp)) {
			struct cfg_errctx e = {origin, err, errlen};
			int r = cfg_alias(t, settings, var + plen, eq + 1, &e);
			if (r < 0 && r != -ENOENT)
				return r;
			if (r == 0)
				continue;
		}
		if (!k) {
			if (warn)
				warn(var, warn_arg);
			continue;
		}
		int r = pc_cfg_set(t, settings, k->name, eq + 1, origin, err,
				   errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

/* ---- command line ------------------------------------------------------ */

static bool cfg_is_option(const char *arg)
{
	return arg && strncmp(arg, "--", 2) == 0 && arg[2];
}

/* "--no-<bool>": the negated key, or NULL. */
static const struct pc_cfg_key *cfg_negated(const struct pc_cfg_table *t,
					    const char *norm)
{
	if (strncmp(norm, "no_", 3) != 0)
		return NULL;
	const struct pc_cfg_key *k = cfg_find_norm(t, norm + 3);
	return k && k->type == PC_CFG_BOOL ? k : NULL;
}

/* Handle argv[*i]; advances *i past any value it consumes. */
static int cfg_one_arg(const struct pc_cfg_table *t, void *settings,
		       char *const *argv, int argc, int *i,
		       const char *const *skip, const struct cfg_errctx *e)
{
	const char *arg = argv[*i];
	char shown[CFG_SHOW_MAX + 4], norm[CFG_NAME_MAX], name[CFG_SHOW_MAX];
	if (!cfg_is_option(arg)) {
		cfg_err(e->err, e->errlen, "%s: unexpected argument '%s'",
			e->origin, cfg_show(arg, shown, sizeof(shown)));
		return -EINVAL;
	}
	const char *eq = strchr(arg, '=');
	size_t nlen = (eq ? (size_t)(eq - arg) : strlen(arg)) - 2;
	snprintf(name, sizeof(name), "%.*s", (int)PC_MIN(nlen, sizeof(name) - 1),
		 arg + 2);
	const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
	bool have_next = next && !cfg_is_option(next);
	if (cfg_normalize(arg + 2, nlen, norm) < 0)
		return cfg_unknown_key(t, name, e);
	if (cfg_listed(skip, norm, true)) {
		*i += !eq && have_next;
		return 0;
	}
	const struct pc_cfg_key *k = cfg_find_norm(t, norm);
	if (!k && !cfg_negated(t, norm)) {
		const char *v = eq ? eq + 1 : have_next ? next : NULL;
		int r = cfg_alias(t, settings, norm, v, e);
		if (r == -ENOENT)
			return cfg_unknown_key(t, name, e);
		*i += !eq && have_next;
		return r;
	}
	if (!k) {
		k = cfg_negated(t, norm);
		if (eq) {
			cfg_err(e->err, e->errlen, "%s: --%s takes no value",
				e->origin, cfg_show(name, shown, sizeof(shown)));
			return -EINVAL;
		}
		return cfg_apply_bool(k, cfg_field(k, settings), "false", e);
	}
	const char *value = eq ? eq + 1 : have_next ? next : NULL;
	if (!value && k->type == PC_CFG_BOOL)
		value = "true";
	if (!value) {
		cfg_err(e->err, e->errlen, "%s: --%s needs a value", e->origin,
			cfg_show(name, shown, sizeof(shown)));
		return -EINVAL;
	}
	*i += !eq && have_next;
	return cfg_types[k->type].apply(k, cfg_field(k, settings), value, e);
}

int pc_cfg_parse_args(const struct pc_cfg_table *t, void *settings, int argc,
		      char *const *argv, const char *const *skip, char *err,
		      size_t errlen)
{
	struct cfg_errctx e = {"command line", err, errlen};
	for (int i = 1; i < argc; i++) {
		int r = cfg_one_arg(t, settings, argv, argc, &i, skip, &e);
		if (r < 0)
			return r;
	}
	return 0;
}

/* ---- help and dump ------------------------------------------------------ */

/* Help text past this column is not aligned: one long enum must not push
 * every other line's help off the screen. */
#define CFG_HELP_COL_MAX 40

static void cfg_help_left(const struct pc_cfg_key *k, char *buf, size_t len)
{
	char meta[128], dashed[CFG_NAME_MAX];
	const char *mv = cfg_types[k->type].metavar;
	if (!mv) {
		cfg_join_choices(k, "|", meta, sizeof(meta));
		mv = meta;
	}
	size_t n = strlen(k->name);
	PC_ASSERT(n < sizeof(dashed));
	for (size_t i = 0; i <= n; i++)
		dashed[i] = k->name[i] == '_' ? '-' : k->name[i];
	snprintf(buf, len, "--%s %s", dashed, mv);
}

void pc_cfg_print_help(const struct pc_cfg_table *t, FILE *out)
{
	char left[256];
	int width = 0;
	for (size_t i = 0; i < t->n; i++) {
		cfg_help_left(&t->keys[i], left, sizeof(left));
		width = PC_MAX(width, (int)strlen(left));
	}
	width = PC_MIN(width, CFG_HELP_COL_MAX);
	for (size_t i = 0; i < t->n; i++) {
		const struct pc_cfg_key *k = &t->keys[i];
		cfg_help_left(k, left, sizeof(left));
		fprintf(out, "  %-*s  %s", width, left, k->help ? k->help : "");
		if (k->def && *k->def)
			fprintf(out, " [default: %s]", k->def);
		fputc('\n', out);
	}
}

void pc_cfg_format(const struct pc_cfg_key *k, const void *settings,
		   char *buf, size_t len)
{
	PC_ASSERT(len > 0);
	FILE *f = fmemopen(buf, len, "w");
	if (!f) {
		snprintf(buf, len, "?");
		return;
	}
	cfg_types[k->type].dump(k, cfg_cfield(k, settings), f);
	fclose(f);
	buf[len - 1] = '\0'; /* fmemopen writes no NUL into a full buffer */
}

void pc_cfg_each(const struct pc_cfg_table *t, const void *settings,
		 void (*fn)(void *arg, const struct pc_cfg_key *k,
			    const char *value),
		 void *arg)
{
	char value[PC_CFG_TEXT_MAX];
	for (size_t i = 0; i < t->n; i++) {
		pc_cfg_format(&t->keys[i], settings, value, sizeof(value));
		fn(arg, &t->keys[i], value);
	}
}

static void cfg_dump_line(void *arg, const struct pc_cfg_key *k,
			  const char *value)
{
	fprintf(arg, "%s = %s\n", k->name, value);
}

void pc_cfg_dump(const struct pc_cfg_table *t, const void *settings, FILE *out)
{
	pc_cfg_each(t, settings, cfg_dump_line, out);
}

const char *pc_opt_value(int argc, char **argv, int *i, const char *name,
			 bool *missing)
{
	size_t n = strlen(name);
	const char *a = argv[*i];
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] != '\0')
		return NULL;
	if (*i + 1 >= argc) {
		*missing = true;
		return NULL;
	}
	return argv[++*i];
}

/* ---- the sample configuration ----------------------------------------- */

#define CFG_SAMPLE_WIDTH 78

/* text as "# " comment lines of at most CFG_SAMPLE_WIDTH columns, broken
 * at spaces (a longer word stays whole); '\n' in text starts a new line. */
static void cfg_comment(const char *text, FILE *out)
{
	const char *p = text;
	while (*p) {
		size_t room = CFG_SAMPLE_WIDTH - 2, n = strcspn(p, "\n");
		size_t cut = n;
		if (n > room) {
			cut = room;
			while (cut > 0 && p[cut] != ' ')
				cut--;
			if (cut == 0) /* one long word */
				cut = strcspn(p, " \n");
		}
		if (cut)
			fprintf(out, "# %.*s\n", (int)cut, p);
		else
			fputs("#\n", out);
		p += cut;
		if (*p == ' ' || *p == '\n')
			p++;
	}
}

/* "allowed: ..." for the key's type, or "" when the help says it all. */
static void cfg_allowed(const struct pc_cfg_key *k, char *buf, size_t len)
{
	char a[32], b[32], list[256];
	buf[0] = '\0';
	switch (k->type) {
	case PC_CFG_INT:
		snprintf(buf, len, "allowed: %lld..%lld", (long long)k->min,
			 (long long)k->max);
		break;
	case PC_CFG_SIZE:
		pc_format_size((uint64_t)k->min, a, sizeof(a));
		pc_format_size((uint64_t)k->max, b, sizeof(b));
		snprintf(buf, len, "allowed: %s..%s", a, b);
		break;
	case PC_CFG_DURATION:
		cfg_format_duration((uint64_t)k->min, a, sizeof(a));
		cfg_format_duration((uint64_t)k->max, b, sizeof(b));
		snprintf(buf, len, "allowed: %s..%s", k->min ? a : "0", b);
		break;
	case PC_CFG_ENUM:
		cfg_join_choices(k, ", ", list, sizeof(list));
		snprintf(buf, len, "one of: %s", list);
		break;
	case PC_CFG_BOOL:
	case PC_CFG_STRING:
		break;
	}
}

void pc_cfg_print_sample(const struct pc_cfg_table *t, const char *intro,
			 FILE *out)
{
	if (intro)
		cfg_comment(intro, out);
	const struct pc_cfg_section *sec = t->sections;
	for (size_t i = 0; i < t->n; i++) {
		const struct pc_cfg_key *k = &t->keys[i];
		if (sec && sec->first_key && strcmp(sec->first_key, k->name) == 0) {
			fprintf(out, "\n# ==== %s\n", sec->title);
			if (sec->note)
				cfg_comment(sec->note, out);
			sec++;
		}
		char allowed[320], line[1024];
		cfg_allowed(k, allowed, sizeof(allowed));
		snprintf(line, sizeof(line), "%s%s%s%s", k->help ? k->help : "",
			 *allowed ? " (" : "", allowed, *allowed ? ")" : "");
		fputc('\n', out);
		cfg_comment(line, out);
		const char *def = k->def ? k->def : "";
		if (cfg_needs_quotes(def) && *def)
			fprintf(out, "#%s = \"%s\"\n", k->name, def);
		else
			fprintf(out, "#%s =%s%s\n", k->name, *def ? " " : "", def);
	}
}
