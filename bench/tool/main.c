/*
 * bench/tool/main.c — peercache-bench: the command line, the page shape
 * options, the manifest, and the helpers serve and drive share (tool.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/secret.h"
#include "tool.h"

volatile sig_atomic_t pcb_stop;

static void on_signal(int sig)
{
	(void)sig;
	pcb_stop = 1;
}

void pcb_catch_signals(void)
{
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* An inherited "ignore" would reap our children behind waitpid. */
	signal(SIGCHLD, SIG_DFL);
}

int pcb_parse_u64(const char *opt, const char *v, uint64_t min, uint64_t max,
		  uint64_t *out)
{
	uint64_t x;
	if (pc_parse_size(v, &x) < 0 || x < min || x > max) {
		fprintf(stderr, "peercache-bench: %s takes a number from "
			"%" PRIu64 " to %" PRIu64 " (k, m, g suffixes work): "
			"%s\n", opt, min, max, v);
		return -1;
	}
	*out = x;
	return 0;
}

int pcb_parse_ms(const char *opt, const char *v, uint64_t *out)
{
	uint64_t ms;
	if (pc_parse_duration_ms(v, &ms) < 0 || ms > 24ull * 3600 * 1000) {
		fprintf(stderr, "peercache-bench: %s takes a duration up to "
			"24h, e.g. 10s or 500ms: %s\n", opt, v);
		return -1;
	}
	*out = ms;
	return 0;
}

int pcb_parse_prefix(const char *v)
{
	size_t n = strlen(v);
	bool ok = n >= 1 && n <= 128;
	for (size_t i = 0; i < n && ok; i++)
		ok = (unsigned char)v[i] > ' ' && v[i] != 0x7f;
	if (!ok)
		fprintf(stderr, "peercache-bench: --prefix takes 1 to 128 "
			"bytes without spaces or control characters (keys "
			"must suit memcached too): %s\n", v);
	return ok ? 0 : -1;
}

int pcb_read_secret(const char *path, char *buf, size_t len)
{
	char why[512];
	if (pc_secret_read_file(path, buf, len, NULL, why, sizeof(why)) < 0) {
		fprintf(stderr, "peercache-bench: --secret-file: %s\n", why);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------- shape */

void pcb_shape_default(struct pcb_shape *s)
{
	*s = (struct pcb_shape){
		.layout = "mha",
		.page_tokens = 64,
		/* MHA: Llama-3-8B (32 layers, 8 KV heads of 128, bf16);
		 * MLA: DeepSeek-V3 (61 layers, 512 + 64 per token, bf16). */
		.layers = 0, /* 0: the layout's model */
		.kv_heads = 8,
		.head_dim = 128,
		.kv_lora_rank = 512,
		.rope_dim = 64,
		.dtype_bytes = 2,
		.tp = 1,
	};
}

int pcb_shape_option(struct pcb_shape *s, int argc, char **argv, int *i)
{
	static const struct {
		const char *name;
		size_t off;
		uint64_t max;
	} u[] = {
		{"--page-size", offsetof(struct pcb_shape, page_tokens), 1 << 20},
		{"--layers", offsetof(struct pcb_shape, layers), 4096},
		{"--kv-heads", offsetof(struct pcb_shape, kv_heads), 4096},
		{"--head-dim", offsetof(struct pcb_shape, head_dim), 65536},
		{"--kv-lora-rank", offsetof(struct pcb_shape, kv_lora_rank), 65536},
		{"--rope-dim", offsetof(struct pcb_shape, rope_dim), 65536},
		{"--dtype-bytes", offsetof(struct pcb_shape, dtype_bytes), 16},
		{"--tp", offsetof(struct pcb_shape, tp), 4096},
	};
	bool missing = false;
	const char *v;
	uint64_t x;
	if ((v = pc_opt_value(argc, argv, i, "--layout", &missing))) {
		if (strcmp(v, "mha") && strcmp(v, "mla")) {
			fprintf(stderr, "peercache-bench: --layout is mha or "
				"mla: %s\n", v);
			return -1;
		}
		s->layout = v;
		return 1;
	}
	if ((v = pc_opt_value(argc, argv, i, "--bytes-per-token",
			       &missing))) {
		if (pcb_parse_u64("--bytes-per-token", v, 1, 1ull << 30, &x))
			return -1;
		s->bytes_per_token = x;
		return 1;
	}
	if ((v = pc_opt_value(argc, argv, i, "--page-bytes", &missing))) {
		if (pcb_parse_u64("--page-bytes", v, 64, 1ull << 32, &x))
			return -1;
		s->page_bytes = x;
		return 1;
	}
	for (size_t k = 0; k < sizeof(u) / sizeof(u[0]) && !missing; k++)
		if ((v = pc_opt_value(argc, argv, i, u[k].name, &missing))) {
			if (pcb_parse_u64(u[k].name, v, 1, u[k].max, &x))
				return -1;
			*(unsigned *)((char *)s + u[k].off) = (unsigned)x;
			return 1;
		}
	if (missing) {
		fprintf(stderr, "peercache-bench: %s needs a value\n",
			argv[*i]);
		return -1;
	}
	return 0;
}

int pcb_shape_resolve(const struct pcb_shape *s, uint64_t *page_bytes,
		      unsigned *page_tokens)
{
	if (s->page_bytes) {
		*page_bytes = s->page_bytes;
		*page_tokens = 0;
		return 0;
	}
	uint64_t bpt = s->bytes_per_token;
	bool mla = strcmp(s->layout, "mla") == 0;
	if (!bpt) {
		uint64_t layers = s->layers ? s->layers : mla ? 61 : 32;
		if (mla) {
			/* MLA's latent cache is replicated on every TP rank. */
			bpt = layers * (s->kv_lora_rank + s->rope_dim) *
			      s->dtype_bytes;
		} else {
			if (s->kv_heads % s->tp) {
				fprintf(stderr, "peercache-bench: --kv-heads "
					"%u is not divisible by --tp %u\n",
					s->kv_heads, s->tp);
				return -EINVAL;
			}
			bpt = 2ull * layers * (s->kv_heads / s->tp) *
			      s->head_dim * s->dtype_bytes;
		}
	}
	uint64_t b = bpt * s->page_tokens;
	if (b < 64 || b > (1ull << 32)) {
		fprintf(stderr, "peercache-bench: a page of %u tokens x %"
			PRIu64 " bytes is %" PRIu64 " bytes; pages are 64 B "
			"to 4 GiB\n", s->page_tokens, bpt, b);
		return -EINVAL;
	}
	*page_bytes = b;
	*page_tokens = s->page_tokens;
	return 0;
}

void pcb_shape_help(FILE *out)
{
	fputs(
"Page shape (a page holds --page-size tokens of every layer, SGLang's\n"
"page_first layout; bytes per token from the model unless given):\n"
"  --layout mha|mla        MHA: 2 x layers x kv-heads/tp x head-dim x dtype;\n"
"                          MLA: layers x (kv-lora-rank + rope-dim) x dtype\n"
"                          [mha]\n"
"  --page-size TOKENS      tokens per page [64]\n"
"  --layers N              [32 for mha (Llama-3-8B), 61 for mla (DeepSeek-V3)]\n"
"  --kv-heads N            [8]      --head-dim N      [128]\n"
"  --kv-lora-rank N        [512]    --rope-dim N      [64]\n"
"  --dtype-bytes N         [2]      --tp N            [1] (splits MHA heads)\n"
"  --bytes-per-token B     instead of the model's figure\n"
"  --page-bytes B          raw pages of B bytes (tokens/s is then not known)\n",
	      out);
}

/* ---------------------------------------------------------- manifest */

int pcb_manifest_key(char *buf, size_t len, const char *prefix)
{
	int n = snprintf(buf, len, "%s/manifest", prefix);
	return n < 0 || (size_t)n >= len ? -1 : n;
}

int pcb_driver_key(char *buf, size_t len, const char *prefix, unsigned id)
{
	int n = snprintf(buf, len, "%s/driver/%u", prefix, id);
	return n < 0 || (size_t)n >= len ? -1 : n;
}

#define MANIFEST_MAGIC "peercache-bench manifest 1\n"

void pcb_manifest_page(const struct pcb_manifest *m, uint8_t *page)
{
	memset(page, 0, PCB_MANIFEST_BYTES);
	snprintf((char *)page, PCB_MANIFEST_BYTES,
		 MANIFEST_MAGIC "pages %" PRIu64 "\npage_bytes %" PRIu64
		 "\npage_tokens %u\nseed %" PRIu64 "\nlayout %s\nnode %s\n",
		 m->pages, m->page_bytes, m->page_tokens, m->seed, m->layout,
		 m->node);
}

int pcb_manifest_parse(const uint8_t *page, struct pcb_manifest *m)
{
	char text[PCB_MANIFEST_BYTES];
	memcpy(text, page, sizeof(text));
	text[sizeof(text) - 1] = '\0';
	if (strncmp(text, MANIFEST_MAGIC, strlen(MANIFEST_MAGIC)) != 0)
		return -EINVAL;
	*m = (struct pcb_manifest){0};
	char *save = NULL;
	for (char *l = strtok_r(text + strlen(MANIFEST_MAGIC), "\n", &save);
	     l; l = strtok_r(NULL, "\n", &save)) {
		char *v = strchr(l, ' ');
		if (!v)
			continue;
		*v++ = '\0';
		if (!strcmp(l, "pages"))
			m->pages = strtoull(v, NULL, 10);
		else if (!strcmp(l, "page_bytes"))
			m->page_bytes = strtoull(v, NULL, 10);
		else if (!strcmp(l, "page_tokens"))
			m->page_tokens = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(l, "seed"))
			m->seed = strtoull(v, NULL, 10);
		else if (!strcmp(l, "layout"))
			snprintf(m->layout, sizeof(m->layout), "%s", v);
		else if (!strcmp(l, "node"))
			snprintf(m->node, sizeof(m->node), "%s", v);
	}
	return m->pages && m->page_bytes >= 64 ? 0 : -EINVAL;
}

/* ------------------------------------------------------------ compare */

int pcb_compare_main(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "-h") ||
			  !strcmp(argv[1], "--help"))) {
		puts("usage: peercache-bench compare A.json B.json\n"
		     "\n"
		     "The rows of two drive reports side by side, matched by\n"
		     "target, via, op, mode, batch and concurrency, with the\n"
		     "ratios B/A of pages/s, GB/s and p99 batch latency, and\n"
		     "the min/median/max of the pages/s ratio. Exit status 1\n"
		     "when no row matches.");
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr, "usage: peercache-bench compare A.json "
			"B.json\n");
		return 2;
	}
	struct pcb_report a = {0}, b = {0};
	char err[512];
	if (pcb_report_load_json(argv[1], &a, err, sizeof(err)) < 0) {
		fprintf(stderr, "peercache-bench compare: %s\n", err);
		return 1;
	}
	if (pcb_report_load_json(argv[2], &b, err, sizeof(err)) < 0) {
		fprintf(stderr, "peercache-bench compare: %s\n", err);
		pcb_report_free(&a);
		return 1;
	}
	int ret = pcb_compare(&a, &b, argv[1], argv[2], stdout);
	if (ret == -ENOENT)
		fprintf(stderr, "peercache-bench compare: no row of %s "
			"matches one of %s (same target, via, op, mode, "
			"batch and concurrency)\n", argv[2], argv[1]);
	pcb_report_free(&a);
	pcb_report_free(&b);
	return ret < 0 ? 1 : 0;
}

/* --------------------------------------------------------------- main */

static void usage(FILE *out)
{
	fputs(
"usage: peercache-bench COMMAND [OPTIONS]\n"
"\n"
"Benchmark a PeerCache cluster the way SGLang uses it, and side by side\n"
"with redis or memcached.\n"
"\n"
"Commands:\n"
"  serve     publish a working set of KV pages through the local node and\n"
"            keep it published (republished when the membership changes)\n"
"            until Ctrl-C\n"
"  drive     drive get, exists, set or a mix at a sweep of concurrencies\n"
"            and write the reports (console, JSON, Markdown, HTML)\n"
"  compare   A.json B.json: the rows of two runs side by side, with ratios\n"
"\n"
"'peercache-bench COMMAND --help' describes each command's options.\n"
"A typical run, the producer on host A and a consumer on host B:\n"
"  A$ peercache-bench serve --layout mha --page-size 64 --drivers 1\n"
"  B$ peercache-bench drive --op get --concurrencies 1,2,4,8 --report run1\n"
"\n"
"Exit status: 0 done; 1 a failure (the message says which); 2 usage.\n",
	      out);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") ||
	    !strcmp(cmd, "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(cmd, "--version")) {
		printf("peercache-bench %s (%s)\n", PEERCACHE_VERSION,
		       PEERCACHE_GIT_REV);
		return 0;
	}
	if (!strcmp(cmd, "serve"))
		return pcb_serve_main(argc - 1, argv + 1);
	if (!strcmp(cmd, "drive"))
		return pcb_drive_main(argc - 1, argv + 1);
	if (!strcmp(cmd, "compare"))
		return pcb_compare_main(argc - 1, argv + 1);
	fprintf(stderr, "peercache-bench: unknown command: %s (see "
		"'peercache-bench --help')\n", cmd);
	return 2;
}
