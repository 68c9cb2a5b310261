/* SPDX-License-Identifier: MIT */
/*
 * Daemon logging: the level filter, the choice of output (plain stderr for a
 * terminal, "<N>" prefixed stderr under systemd, or the journal's native
 * protocol when stderr is the journal stream) and per-callsite rate limits.
 *
 * Each stderr line is built in one buffer and written with one write() call,
 * so lines of concurrent processes sharing stderr never interleave mid-line.
 * Control characters in messages (which quote user strings) are replaced, so
 * a client name cannot forge log lines. This module never allocates, never
 * exits and leaves errno as it found it, so it is safe on every error path.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include "util.h"

/* Longest message text; with the prefix a line stays below PIPE_BUF, so pipes keep it whole. */
#define LOG_TEXT_MAX 2048

static int g_level = LOG_INFO;
static enum log_target g_target = LOG_TARGET_PLAIN;

static const char *const g_level_names[] = {
	[LOG_EMERG] = "emerg", [LOG_ALERT] = "alert",     [LOG_CRIT] = "crit",
	[LOG_ERR] = "err",     [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
	[LOG_INFO] = "info",   [LOG_DEBUG] = "debug",
};

/* What people read in plain lines: "error", not syslog's "err". */
static const char *const g_level_labels[] = {
	[LOG_EMERG] = "emergency", [LOG_ALERT] = "alert",     [LOG_CRIT] = "critical",
	[LOG_ERR] = "error",       [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
	[LOG_INFO] = "info",       [LOG_DEBUG] = "debug",
};

/* True when $JOURNAL_STREAM names the device and inode of our stderr (systemd.exec(5)). */
static bool stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	int end = 0;

	if (!env || sscanf(env, "%llu:%llu%n", &dev, &ino, &end) != 2 || env[end] != '\0') {
		return false;
	}
	if (fstat(STDERR_FILENO, &st) < 0) {
		return false;
	}
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static enum log_target detect_target(void)
{
	if (stderr_is_journal()) {
		return LOG_TARGET_JOURNAL;
	}
	/* Under systemd stderr goes to the journal via a socket or a file, never a terminal. */
	if (!isatty(STDERR_FILENO) && (getenv("INVOCATION_ID") || getenv("NOTIFY_SOCKET"))) {
		return LOG_TARGET_PREFIX;
	}
	return LOG_TARGET_PLAIN;
}

void log_init(int max_level, bool auto_target)
{
	log_set_level(max_level);
	g_target = auto_target ? detect_target() : LOG_TARGET_PLAIN;
}

void log_set_level(int max_level)
{
	if (max_level < LOG_ERR) {
		max_level = LOG_ERR;
	}
	if (max_level > LOG_DEBUG) {
		max_level = LOG_DEBUG;
	}
	g_level = max_level;
}

int log_get_level(void)
{
	return g_level;
}

void log_set_target(enum log_target target)
{
	if ((unsigned)target < LOG_TARGET_MAX) {
		g_target = target;
	}
}

enum log_target log_get_target(void)
{
	return g_target;
}

int log_level_parse(const char *name)
{
	static const struct {
		const char *name;
		int level;
	} aliases[] = {{"error", LOG_ERR}, {"warn", LOG_WARNING}};

	if (!name) {
		return -EINVAL;
	}
	if (name[0] >= '0' + LOG_ERR && name[0] <= '0' + LOG_DEBUG && name[1] == '\0') {
		return name[0] - '0';
	}
	for (int level = LOG_ERR; level <= LOG_DEBUG; level++) {
		if (strcmp(name, g_level_names[level]) == 0) {
			return level;
		}
	}
	for (size_t i = 0; i < ARRAY_SIZE(aliases); i++) {
		if (strcmp(name, aliases[i].name) == 0) {
			return aliases[i].level;
		}
	}
	return -EINVAL;
}

const char *log_level_name(int level)
{
	if (level < 0 || (size_t)level >= ARRAY_SIZE(g_level_names)) {
		return "unknown";
	}
	return g_level_names[level];
}

static void write_all(const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDERR_FILENO, buf, len);

		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			return; /* nowhere left to report it */
		}
		buf += n;
		len -= (size_t)n;
	}
}

/* Format the message; cut it with "..." when too long and defuse control characters. */
static void format_text(char *text, size_t size, const char *fmt, va_list ap)
{
	int n = vsnprintf(text, size, fmt, ap);
	size_t len;

	if (n < 0) {
		snprintf(text, size, "(unformattable log message '%s')", fmt);
	} else if ((size_t)n >= size) {
		memcpy(text + size - 4, "...", 4);
	}
	len = strlen(text);
	while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) {
		text[--len] = '\0';
	}
	for (char *p = text; *p; p++) {
		if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f) {
			*p = '?';
		}
	}
}

static void emit(int prio, const char *suffix, const char *fmt, va_list ap)
{
	char text[LOG_TEXT_MAX];
	char line[LOG_TEXT_MAX + 128];
	int len;

	format_text(text, sizeof(text), fmt, ap);
	if ((unsigned)prio >= ARRAY_SIZE(g_level_labels)) {
		prio = LOG_ERR;
	}

	switch (g_target) {
	case LOG_TARGET_JOURNAL:
		if (sd_journal_send("MESSAGE=%s%s", text, suffix, "PRIORITY=%d", prio,
				    "SYSLOG_IDENTIFIER=rdmaxd", NULL) >= 0) {
			return;
		}
		/* journald refused the datagram (too big, gone): stderr still reaches it. */
		/* fall through */
	case LOG_TARGET_PREFIX:
		len = snprintf(line, sizeof(line), "<%d>%s%s\n", prio, text, suffix);
		break;
	case LOG_TARGET_PLAIN:
	default:
		len = snprintf(line, sizeof(line), "rdmaxd[%ld]: %s: %s%s\n", (long)getpid(),
			       g_level_labels[prio], text, suffix);
		break;
	}
	if (len < 0) {
		return;
	}
	if ((size_t)len >= sizeof(line)) {
		len = sizeof(line) - 1;
		line[len - 1] = '\n';
	}
	write_all(line, (size_t)len);
}

void log_msg(int prio, const char *fmt, ...)
{
	int saved_errno = errno;
	va_list ap;

	if (prio > g_level) {
		return;
	}
	va_start(ap, fmt);
	emit(prio, "", fmt, ap);
	va_end(ap);
	errno = saved_errno;
}

void log_ratelimited(struct log_ratelimit *rl, int prio, const char *fmt, ...)
{
	int saved_errno = errno;
	char suffix[64] = "";
	uint64_t now;
	va_list ap;

	/* Filtered lines do not count: turning on debug must not start with a squashed burst. */
	if (prio > g_level) {
		return;
	}
	now = now_ms();
	if (now - rl->window_start_ms >= LOG_RATELIMIT_INTERVAL_MS) {
		rl->window_start_ms = now;
		rl->printed = 0;
	}
	if (rl->printed >= LOG_RATELIMIT_BURST) {
		if (rl->squashed < UINT32_MAX) {
			rl->squashed++;
		}
		return;
	}
	rl->printed++;
	if (rl->squashed) {
		snprintf(suffix, sizeof(suffix), " (squashed %u similar messages)", rl->squashed);
		rl->squashed = 0;
	}
	va_start(ap, fmt);
	emit(prio, suffix, fmt, ap);
	va_end(ap);
	errno = saved_errno;
}
