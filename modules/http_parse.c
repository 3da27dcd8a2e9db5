/*
 * modules/http_parse.c — the HTTP/1.x request-head parser (see http_parse.h).
 *
 * Owns: nothing; no allocation, no globals but constant tables. Any thread.
 *
 * Shape: two phases per line. The line scanner walks bytes left to right,
 * rejecting a byte that may not appear in that kind of line, a CR not
 * followed by LF, or a byte past the limit, at the byte that breaks the rule.
 * Only a complete line is then split into its parts. Because the scanner
 * decides from the bytes already seen and the splitter runs only on complete
 * lines, a prefix of the input answers 0 or the full input's answer (the
 * invariant the fuzz target checks). Checks that need the whole head
 * (Transfer-Encoding vs Content-Length) run at the blank line, after every
 * field has been seen, for the same reason.
 *
 * Strictness, on purpose: this endpoint serves monitoring tools and browsers,
 * not arbitrary clients, so anything ambiguous is a 400 rather than a guess
 * (request smuggling lives in parsers that guess). Accepted leniencies: bare
 * LF line endings, obs-text (bytes >= 0x80) in field values.
 */
#include "modules/http_parse.h"

#include <stdint.h>
#include <string.h>

#define HTTP_NEED 0 /* incomplete: need more bytes */

/* A complete line: content is [start, end), the next line starts at next. */
struct http_line {
	size_t start;
	size_t end;
	size_t next;
};

/* What the header fields said, gathered for the checks at the blank line. */
struct http_fields {
	bool cl_seen;     /* a Content-Length field was seen */
	uint64_t cl;      /* its value (all of them agree, else 400) */
	bool te_seen;     /* a Transfer-Encoding field was seen */
	bool conn_close;  /* Connection lists "close" */
	bool conn_keep;   /* Connection lists "keep-alive" */
};

static bool http_is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

/* RFC 9110 tchar: the characters of a method or a field name. */
static bool http_is_tchar(unsigned char c)
{
	if (http_is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return true;
	return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/*
 * Bytes allowed inside a line (terminators aside). The request line is
 * printable ASCII and SP only: its parts are a token, a target (whose
 * non-ASCII must be percent-encoded) and a version; rejecting everything else
 * here also turns away TLS handshakes and binary noise at their first byte.
 * Field values may carry HTAB and obs-text; names are checked as tokens later.
 */
static bool http_line_char(unsigned char c, bool field)
{
	if (c >= 0x20 && c < 0x7f)
		return true;
	return field && (c == '\t' || c >= 0x80);
}

/*
 * Find the end of the line starting at buf[at]. A byte at an index >= limit
 * is over the limit and answers `over`; terminator bytes count only when
 * eol_counts. Returns 1 with *ln filled, HTTP_NEED, or a -status.
 */
static int http_scan_line(const char *buf, size_t len, size_t at, size_t limit,
			  bool eol_counts, int over, bool field,
			  struct http_line *ln)
{
	for (size_t i = at; i < len; i++) {
		unsigned char c = (unsigned char)buf[i];
		bool eol = c == '\r' || c == '\n';
		if (i >= limit && (eol_counts || !eol))
			return over;
		if (!eol) {
			if (!http_line_char(c, field))
				return -400;
			continue;
		}
		ln->start = at;
		ln->end = i;
		if (c == '\n') {
			ln->next = i + 1;
			return 1;
		}
		/* A bare CR is a line break to some parsers and data to others:
		 * that disagreement is how requests get smuggled. */
		if (i + 1 == len)
			return HTTP_NEED;
		if (buf[i + 1] != '\n')
			return -400;
		if (eol_counts && i + 1 >= limit)
			return over;
		ln->next = i + 2;
		return 1;
	}
	return HTTP_NEED;
}

/* Case-insensitive compare of s[0..n) with a lower-case literal. */
static bool http_ieq(const char *s, size_t n, const char *lit)
{
	if (n != strlen(lit))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 'A' && c <= 'Z')
			c = (unsigned char)(c - 'A' + 'a');
		if (c != (unsigned char)lit[i])
			return false;
	}
	return true;
}

/*
 * Split a complete request line l[0..n): METHOD SP target SP HTTP/1.x.
 * The scanner has already limited l to printable ASCII and SP.
 */
static int http_parse_start(const char *l, size_t n, struct http_request *rq)
{
	/* The HTTP/2 connection preface opens with a request line that would
	 * otherwise be a 400 (asterisk-form); 505 tells the client why. */
	static const char h2_preface[] = "PRI * HTTP/2.0";
	if (n == sizeof(h2_preface) - 1 && memcmp(l, h2_preface, n) == 0)
		return -505;

	size_t i = 0;
	while (i < n && http_is_tchar((unsigned char)l[i]))
		i++;
	if (i == 0 || i >= sizeof(rq->method_name) || i == n || l[i] != ' ')
		return -400;
	memcpy(rq->method_name, l, i);
	rq->method_name[i] = '\0';
	if (i == 3 && memcmp(l, "GET", 3) == 0)
		rq->method = HTTP_GET;
	else if (i == 4 && memcmp(l, "HEAD", 4) == 0)
		rq->method = HTTP_HEAD;
	else
		rq->method = HTTP_OTHER;

	size_t t = ++i;
	while (i < n && l[i] != ' ')
		i++;
	/* Origin-form only: absolute-form is for proxies and '*' for
	 * OPTIONS, neither of which this endpoint is. An empty target (two
	 * spaces) fails here too. */
	if (i == t || l[t] != '/')
		return -400;
	if (i == n)
		return -400; /* no version: an HTTP/0.9 request */
	const char *target = l + t;
	size_t target_len = i - t;

	/* Exactly "HTTP/" DIGIT "." DIGIT, case-sensitive (RFC 9112 2.3). A
	 * trailing or doubled space makes the length wrong: 400. */
	const char *v = l + i + 1;
	if (n - (i + 1) != 8 || memcmp(v, "HTTP/", 5) != 0 ||
	    !http_is_digit((unsigned char)v[5]) || v[6] != '.' ||
	    !http_is_digit((unsigned char)v[7]))
		return -400;
	if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
		return -505;
	rq->version_minor = v[7] - '0';

	/* Percent-encoding is left alone: the router matches exact paths, and
	 * decoding here would let "/%6detrics" alias "/metrics". */
	const char *q = memchr(target, '?', target_len);
	rq->path = target;
	rq->path_len = q ? (size_t)(q - target) : target_len;
	rq->query = q ? q + 1 : target + target_len;
	rq->query_len = q ? target_len - rq->path_len - 1 : 0;
	return 0;
}

/* Content-Length: 1*DIGIT (RFC 9110 8.6), no sign, no list, no overflow. */
static int http_parse_length(const char *v, size_t n, uint64_t *out)
{
	uint64_t x = 0;
	if (n == 0)
		return -400;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		if (!http_is_digit(c))
			return -400;
		if (x > (UINT64_MAX - (c - '0')) / 10)
			return -400;
		x = x * 10 + (c - '0');
	}
	*out = x;
	return 0;
}

/* Connection: a comma-separated list of options; only close and keep-alive
 * mean anything here. Empty list elements are allowed (RFC 9110 5.6.1). */
static void http_parse_connection(const char *v, size_t n,
				  struct http_fields *f)
{
	size_t i = 0;
	while (i < n) {
		size_t s = i;
		while (i < n && v[i] != ',')
			i++;
		size_t e = i;
		while (s < e && (v[s] == ' ' || v[s] == '\t'))
			s++;
		while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
			e--;
		if (http_ieq(v + s, e - s, "close"))
			f->conn_close = true;
		else if (http_ieq(v + s, e - s, "keep-alive"))
			f->conn_keep = true;
		i++; /* past the comma (or the end) */
	}
}

/* Split a complete, non-empty field line l[0..n): name ":" OWS value OWS. */
static int http_parse_field(const char *l, size_t n, struct http_fields *f)
{
	size_t i = 0;
	while (i < n && http_is_tchar((unsigned char)l[i]))
		i++;
	/* No whitespace between name and colon (RFC 9112 5.1: a server MUST
	 * reject it), no empty name, no line without a colon. */
	if (i == 0 || i == n || l[i] != ':')
		return -400;
	size_t name_len = i++;
	while (i < n && (l[i] == ' ' || l[i] == '\t'))
		i++;
	size_t e = n;
	while (e > i && (l[e - 1] == ' ' || l[e - 1] == '\t'))
		e--;
	const char *v = l + i;
	size_t vlen = e - i;

	if (http_ieq(l, name_len, "content-length")) {
		uint64_t x;
		if (http_parse_length(v, vlen, &x) < 0)
			return -400;
		/* Two lengths that disagree mean two parsers on the path may
		 * frame the body differently. Repeats of one value are benign. */
		if (f->cl_seen && f->cl != x)
			return -400;
		f->cl_seen = true;
		f->cl = x;
	} else if (http_ieq(l, name_len, "transfer-encoding")) {
		f->te_seen = true;
	} else if (http_ieq(l, name_len, "connection")) {
		http_parse_connection(v, vlen, f);
	}
	return 0;
}

int http_parse_request(const char *buf, size_t len,
		       const struct http_limits *lim, struct http_request *req)
{
	static const struct http_limits dflt = HTTP_LIMITS_DEFAULT;
	if (!lim)
		lim = &dflt;
	size_t line_max = lim->max_request_line < HTTP_LIMIT_CEIL
				  ? lim->max_request_line
				  : HTTP_LIMIT_CEIL;
	size_t hdr_max = lim->max_header_bytes < HTTP_LIMIT_CEIL
				 ? lim->max_header_bytes
				 : HTTP_LIMIT_CEIL;

	struct http_request rq;
	memset(&rq, 0, sizeof(rq));
	struct http_line ln;
	int ret = http_scan_line(buf, len, 0, line_max, false, -414, false, &ln);
	if (ret <= 0)
		return ret;
	ret = http_parse_start(buf, ln.end, &rq);
	if (ret < 0)
		return ret;

	struct http_fields f;
	memset(&f, 0, sizeof(f));
	size_t at = ln.next;
	size_t hdr_limit = at + hdr_max;
	for (;;) {
		if (at == len)
			return HTTP_NEED;
		unsigned char c = (unsigned char)buf[at];
		if (c == '\n')
			break;
		if (c == '\r') {
			if (at + 1 == len)
				return HTTP_NEED;
			if (buf[at + 1] != '\n')
				return -400;
			break;
		}
		/* Decided at the first byte of the line, so a head that has
		 * run out of fields is refused before the field arrives. */
		if (at >= hdr_limit || rq.header_count >= lim->max_headers)
			return -431;
		/* obs-fold (RFC 9112 5.2: a server may reject it), or
		 * whitespace between the request line and the first field. */
		if (c == ' ' || c == '\t')
			return -400;
		ret = http_scan_line(buf, len, at, hdr_limit, true, -431, true,
				     &ln);
		if (ret <= 0)
			return ret;
		ret = http_parse_field(buf + ln.start, ln.end - ln.start, &f);
		if (ret < 0)
			return ret;
		rq.header_count++;
		at = ln.next;
	}
	at += buf[at] == '\r' ? 2 : 1; /* the blank line */

	/* Transfer-Encoding is refused outright: the endpoint takes no
	 * bodies, and chunked framing is the classic smuggling surface. With
	 * a Content-Length too, the request is ambiguous: RFC 9112 6.1 says
	 * to treat it as an error. */
	if (f.te_seen)
		return f.cl_seen ? -400 : -501;
	rq.has_body = f.cl_seen && f.cl > 0;
	if (rq.version_minor == 1)
		rq.keep_alive = !f.conn_close;
	else
		rq.keep_alive = f.conn_keep && !f.conn_close;

	/* at <= 2 * HTTP_LIMIT_CEIL + 4 by the clamps above: fits an int. */
	*req = rq;
	return (int)at;
}

static const struct {
	int status;
	const char *text;
} http_status_table[] = {
	{ 200, "OK" },
	{ 204, "No Content" },
	{ 301, "Moved Permanently" },
	{ 304, "Not Modified" },
	{ 400, "Bad Request" },
	{ 403, "Forbidden" },
	{ 404, "Not Found" },
	{ 405, "Method Not Allowed" },
	{ 408, "Request Timeout" },
	{ 413, "Content Too Large" },
	{ 414, "URI Too Long" },
	{ 431, "Request Header Fields Too Large" },
	{ 500, "Internal Server Error" },
	{ 501, "Not Implemented" },
	{ 503, "Service Unavailable" },
	{ 505, "HTTP Version Not Supported" },
};

const char *http_status_text(int status)
{
	for (size_t i = 0; i < sizeof(http_status_table) /
				       sizeof(http_status_table[0]);
	     i++) {
		if (http_status_table[i].status == status)
			return http_status_table[i].text;
	}
	return "Unknown";
}
