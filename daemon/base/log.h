/* SPDX-License-Identifier: MIT */
/*
 * Daemon logging. Priorities are syslog's (LOG_ERR .. LOG_DEBUG). Output goes
 * to stderr with a "<N>" priority prefix (sd-daemon style) when running under
 * systemd or when asked, plain "rdmaxd[pid]: level: text" otherwise.
 */
#ifndef RDMAXD_LOG_H
#define RDMAXD_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

/* Output format of log lines. */
enum log_target {
	LOG_TARGET_PLAIN,   /* "rdmaxd[pid]: warning: text" for people at a terminal */
	LOG_TARGET_PREFIX,  /* "<4>text" for systemd's stderr capture */
	LOG_TARGET_JOURNAL, /* journald native protocol with structured fields */
	LOG_TARGET_MAX,     /* terminator */
};

/* Set up logging; target is chosen from $JOURNAL_STREAM when auto is true. */
void log_init(int max_level, bool auto_target);
void log_set_level(int max_level);
int log_get_level(void);
void log_set_target(enum log_target target);
enum log_target log_get_target(void);
/* Parse "err|warning|notice|info|debug" (or 3..7); returns the level or -EINVAL. */
int log_level_parse(const char *name);
const char *log_level_name(int level);

void log_msg(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)    log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)   log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...)   log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)  log_msg(LOG_DEBUG, __VA_ARGS__)

/*
 * Rate limit for data-path messages: at most `burst` lines per `interval_ms`;
 * the next line after a quiet period says how many were squashed.
 */
struct log_ratelimit {
	uint64_t window_start_ms; /* start of the current window */
	uint32_t printed;         /* lines printed in the window */
	uint32_t squashed;        /* lines dropped since the last printed one */
};

#define LOG_RATELIMIT_INTERVAL_MS 5000
#define LOG_RATELIMIT_BURST       10

void log_ratelimited(struct log_ratelimit *rl, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
