/*
 * bench/tool/node_spawn.c — a peercached of the tool's own: `serve` and
 * `drive` given `-- ARGS` start one with ARGS (e.g. --peers or
 * --discovery-addr: it joins the cluster), use its Unix socket, and stop it
 * when they end.
 *
 * Owns: the child process (its own process group, so a Ctrl-C at the
 * terminal reaches the tool, which then stops the node after its own clean
 * up; PR_SET_PDEATHSIG stops it if the tool dies) and a private directory
 * for its socket (unless ARGS name one) and log.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tool.h"

/* The peercached to run: $PEERCACHED, next to this binary (installed),
 * the build tree's, else from PATH. */
static void node_binary(char *out, size_t len)
{
	const char *env = getenv("PEERCACHED");
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return;
	}
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		self[n] = '\0';
		char *slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			static const char *const rel[] = {
				"peercached", "../../server/peercached"};
			for (size_t i = 0; i < 2; i++) {
				int w = snprintf(out, len, "%s/%s", self,
						 rel[i]);
				if (w > 0 && (size_t)w < len &&
				    access(out, X_OK) == 0)
					return;
			}
		}
	}
	snprintf(out, len, "peercached");
}

static const char *socket_arg(int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "--socket=", 9))
			return argv[i] + 9;
		if (!strcmp(argv[i], "--socket") && i + 1 < argc)
			return argv[i + 1];
	}
	return NULL;
}

static void log_tail(const struct pcb_spawned *sp)
{
	char buf[2048];
	int fd = open(sp->log, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	off_t end = lseek(fd, 0, SEEK_END);
	lseek(fd, end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1
						: 0, SEEK_SET);
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n > 0) {
		buf[n] = '\0';
		fprintf(stderr, "--- the end of %s:\n%s---\n", sp->log, buf);
	}
}

int pcb_node_spawn(int argc, char **argv, unsigned timeout_ms,
		   struct pcb_spawned *sp)
{
	*sp = (struct pcb_spawned){.pid = -1};
	snprintf(sp->dir, sizeof(sp->dir), "/tmp/peercache-bench.XXXXXX");
	if (!mkdtemp(sp->dir)) {
		fprintf(stderr, "peercache-bench: cannot make a directory for "
			"the node: %s\n", strerror(errno));
		return -1;
	}
	snprintf(sp->log, sizeof(sp->log), "%s/peercached.log", sp->dir);
	const char *sock = socket_arg(argc, argv);
	if (sock && *sock)
		snprintf(sp->socket, sizeof(sp->socket), "%s", sock);
	else
		snprintf(sp->socket, sizeof(sp->socket), "%s/peercached.sock",
			 sp->dir);
	char bin[PATH_MAX];
	node_binary(bin, sizeof(bin));
	char **args = calloc((size_t)argc + 4, sizeof(char *));
	if (!args)
		return -1;
	int k = 0;
	args[k++] = bin;
	for (int i = 0; i < argc; i++)
		args[k++] = argv[i];
	if (!sock) {
		args[k++] = "--socket";
		args[k++] = sp->socket;
	}
	args[k] = NULL;
	int logfd = open(sp->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			 0644);
	if (logfd < 0) {
		fprintf(stderr, "peercache-bench: %s: %s\n", sp->log,
			strerror(errno));
		free(args);
		return -1;
	}
	pid_t parent = getpid();
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(1);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		signal(SIGPIPE, SIG_DFL);
		execvp(bin, args);
		dprintf(STDERR_FILENO, "cannot run %s: %s\n", bin,
			strerror(errno));
		_exit(127);
	}
	close(logfd);
	free(args);
	if (pid < 0) {
		fprintf(stderr, "peercache-bench: fork: %s\n", strerror(errno));
		return -1;
	}
	sp->pid = pid;
	fprintf(stderr, "peercache-bench: started %s (pid %d, log %s)\n", bin,
		(int)pid, sp->log);
	/* Ready when it answers node.info on its socket. */
	for (unsigned waited = 0; waited < timeout_ms && !pcb_stop;
	     waited += 100) {
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			sp->pid = -1;
			fprintf(stderr, "peercache-bench: the node exited "
				"(status %d) before it was ready\n",
				WIFEXITED(st) ? WEXITSTATUS(st) : 128 +
					WTERMSIG(st));
			log_tail(sp);
			return -1;
		}
		struct pcb_node_info ni;
		char why[256];
		if (access(sp->socket, F_OK) == 0 &&
		    pcb_node_info(sp->socket, false, NULL, 1000, &ni, why,
				  sizeof(why)) == 0) {
			fprintf(stderr, "peercache-bench: node %s ready at %s\n",
				ni.id, sp->socket);
			return 0;
		}
		usleep(100000);
	}
	fprintf(stderr, "peercache-bench: the node did not answer on %s "
		"within %u ms\n", sp->socket, timeout_ms);
	log_tail(sp);
	pcb_node_reap(sp);
	return -1;
}

void pcb_node_reap(struct pcb_spawned *sp)
{
	if (sp->pid > 0) {
		kill(sp->pid, SIGTERM);
		int st = 0;
		pid_t r = 0;
		for (int i = 0; i < 300 && (r = waitpid(sp->pid, &st, WNOHANG))
						   == 0; i++)
			usleep(50000);
		if (r == 0) {
			fprintf(stderr, "peercache-bench: the node ignored "
				"SIGTERM for 15 s; killing it\n");
			kill(sp->pid, SIGKILL);
			waitpid(sp->pid, &st, 0);
		}
		bool clean = r == sp->pid && WIFEXITED(st) &&
			     WEXITSTATUS(st) == 0;
		fprintf(stderr, "peercache-bench: node stopped%s\n",
			clean ? "" : " (not cleanly: its log is kept)");
		sp->pid = -1;
		if (!clean)
			return;
	}
	if (sp->dir[0]) {
		unlink(sp->log);
		if (!strncmp(sp->socket, sp->dir, strlen(sp->dir)))
			unlink(sp->socket);
		rmdir(sp->dir);
	}
}
