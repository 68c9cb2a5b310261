/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of daemon/log.c: level names, the output target chosen from the
 * environment, the exact line formats (stderr captured in a temporary file),
 * sanitising, rate limiting counts, and that concurrent writers never split
 * a line.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

Suite *log_suite(void);

/* stderr redirected into a temporary file for the duration of a test step. */
struct capture {
	char path[64];
	int fd;
	int saved_stderr;
};

static void capture_start(struct capture *c)
{
	snprintf(c->path, sizeof(c->path), "/tmp/rdmaxd-log-test-XXXXXX");
	c->fd = mkstemp(c->path);
	ck_assert_int_ge(c->fd, 0);
	c->saved_stderr = dup(STDERR_FILENO);
	ck_assert_int_ge(c->saved_stderr, 0);
	ck_assert_int_eq(dup2(c->fd, STDERR_FILENO), STDERR_FILENO);
}

/* Restore stderr and return what was written (caller frees). */
static char *capture_end(struct capture *c)
{
	struct stat st;
	char *buf;

	ck_assert_int_eq(dup2(c->saved_stderr, STDERR_FILENO), STDERR_FILENO);
	close(c->saved_stderr);
	ck_assert_int_eq(fstat(c->fd, &st), 0);
	buf = calloc(1, (size_t)st.st_size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(pread(c->fd, buf, (size_t)st.st_size, 0), st.st_size);
	close(c->fd);
	unlink(c->path);
	return buf;
}

static size_t count_lines(const char *s)
{
	size_t n = 0;

	for (; *s; s++) {
		n += *s == '\n';
	}
	return n;
}

START_TEST(level_names)
{
	ck_assert_int_eq(log_level_parse("err"), LOG_ERR);
	ck_assert_int_eq(log_level_parse("error"), LOG_ERR);
	ck_assert_int_eq(log_level_parse("warning"), LOG_WARNING);
	ck_assert_int_eq(log_level_parse("warn"), LOG_WARNING);
	ck_assert_int_eq(log_level_parse("notice"), LOG_NOTICE);
	ck_assert_int_eq(log_level_parse("info"), LOG_INFO);
	ck_assert_int_eq(log_level_parse("debug"), LOG_DEBUG);
	ck_assert_int_eq(log_level_parse("3"), LOG_ERR);
	ck_assert_int_eq(log_level_parse("7"), LOG_DEBUG);

	static const char *const bad[] = {"", "2", "8", "37", "Info", "debug ", "crit", "verbose"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(log_level_parse(bad[i]) == -EINVAL, "'%s' accepted", bad[i]);
	}
	ck_assert_int_eq(log_level_parse(NULL), -EINVAL);

	for (int level = LOG_ERR; level <= LOG_DEBUG; level++) {
		ck_assert_int_eq(log_level_parse(log_level_name(level)), level);
	}
	ck_assert_str_eq(log_level_name(LOG_WARNING), "warning");
	ck_assert_str_eq(log_level_name(42), "unknown");
	ck_assert_str_eq(log_level_name(-1), "unknown");

	log_set_level(LOG_NOTICE);
	ck_assert_int_eq(log_get_level(), LOG_NOTICE);
	log_set_level(99);
	ck_assert_int_eq(log_get_level(), LOG_DEBUG);
	log_set_level(0);
	ck_assert_int_eq(log_get_level(), LOG_ERR);
}
END_TEST

START_TEST(plain_format_and_level_filter)
{
	struct capture c;
	char want[256];
	char *out;

	log_init(LOG_INFO, false);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PLAIN);
	capture_start(&c);
	log_warn("connect() to '%s' failed: %s", "10.0.0.1", "Connection refused");
	log_err("boom %d", 3);
	log_info("ready");
	log_debug("not shown");
	out = capture_end(&c);
	snprintf(want, sizeof(want),
		 "rdmaxd[%ld]: warning: connect() to '10.0.0.1' failed: Connection refused\n"
		 "rdmaxd[%ld]: error: boom 3\n"
		 "rdmaxd[%ld]: info: ready\n",
		 (long)getpid(), (long)getpid(), (long)getpid());
	ck_assert_str_eq(out, want);
	free(out);

	log_set_level(LOG_DEBUG);
	capture_start(&c);
	log_debug("now shown");
	out = capture_end(&c);
	snprintf(want, sizeof(want), "rdmaxd[%ld]: debug: now shown\n", (long)getpid());
	ck_assert_str_eq(out, want);
	free(out);
}
END_TEST

START_TEST(prefix_format)
{
	struct capture c;
	char *out;

	log_init(LOG_DEBUG, false);
	log_set_target(LOG_TARGET_PREFIX);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PREFIX);
	log_set_target(LOG_TARGET_MAX); /* ignored */
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PREFIX);
	capture_start(&c);
	log_err("e");
	log_warn("w");
	log_notice("n");
	log_info("i");
	log_debug("d");
	out = capture_end(&c);
	ck_assert_str_eq(out, "<3>e\n<4>w\n<5>n\n<6>i\n<7>d\n");
	free(out);
}
END_TEST

START_TEST(target_from_environment)
{
	struct capture c;
	struct stat st;
	char stream[64];

	/* stderr is a file here, never a terminal. */
	capture_start(&c);
	unsetenv("JOURNAL_STREAM");
	unsetenv("INVOCATION_ID");
	unsetenv("NOTIFY_SOCKET");
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PLAIN);

	setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PREFIX);
	unsetenv("INVOCATION_ID");
	setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PREFIX);

	/* JOURNAL_STREAM counts only when it names our stderr. */
	ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
	snprintf(stream, sizeof(stream), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", stream, 1);
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_JOURNAL);
	snprintf(stream, sizeof(stream), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino + 1);
	setenv("JOURNAL_STREAM", stream, 1);
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PREFIX);
	setenv("JOURNAL_STREAM", "garbage", 1);
	unsetenv("NOTIFY_SOCKET");
	log_init(LOG_INFO, true);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PLAIN);

	/* Without auto the environment is ignored. */
	setenv("INVOCATION_ID", "x", 1);
	log_init(LOG_INFO, false);
	ck_assert_int_eq(log_get_target(), LOG_TARGET_PLAIN);
	unsetenv("INVOCATION_ID");
	unsetenv("JOURNAL_STREAM");
	free(capture_end(&c));
}
END_TEST

START_TEST(control_characters_and_truncation)
{
	struct capture c;
	char big[8192];
	char *out;
	size_t len;

	log_init(LOG_INFO, false);
	log_set_target(LOG_TARGET_PREFIX);
	capture_start(&c);
	/* A quoted client string must not be able to start a forged line. */
	log_info("client '%s' said hi\n", "evil\n<0>forged\x1b[31m");
	out = capture_end(&c);
	ck_assert_str_eq(out, "<6>client 'evil?<0>forged?[31m' said hi\n");
	free(out);

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	capture_start(&c);
	log_info("%s", big);
	out = capture_end(&c);
	len = strlen(out);
	ck_assert_uint_eq(count_lines(out), 1);
	ck_assert_uint_lt(len, 4096); /* below PIPE_BUF: one atomic write */
	ck_assert_uint_gt(len, 1000);
	ck_assert_int_eq(strncmp(out + len - 4, "...\n", 4), 0);
	free(out);
}
END_TEST

START_TEST(errno_is_preserved)
{
	struct capture c;

	log_init(LOG_INFO, false);
	capture_start(&c);
	errno = EADDRINUSE;
	log_err("bind() failed");
	ck_assert_int_eq(errno, EADDRINUSE);
	errno = EAGAIN;
	log_debug("filtered");
	ck_assert_int_eq(errno, EAGAIN);
	free(capture_end(&c));
}
END_TEST

START_TEST(rate_limit_counts)
{
	struct log_ratelimit rl = {0};
	struct capture c;
	char *out, *last;

	log_init(LOG_INFO, false);
	log_set_target(LOG_TARGET_PREFIX);
	capture_start(&c);
	for (int i = 0; i < LOG_RATELIMIT_BURST + 15; i++) {
		log_ratelimited(&rl, LOG_WARNING, "drop %d", i);
	}
	out = capture_end(&c);
	ck_assert_uint_eq(count_lines(out), LOG_RATELIMIT_BURST);
	ck_assert_ptr_nonnull(strstr(out, "<4>drop 0\n"));
	ck_assert_ptr_null(strstr(out, "squashed"));
	ck_assert_uint_eq(rl.printed, LOG_RATELIMIT_BURST);
	ck_assert_uint_eq(rl.squashed, 15);
	free(out);

	/* Messages below the level neither print nor count. */
	log_ratelimited(&rl, LOG_DEBUG, "debug");
	ck_assert_uint_eq(rl.squashed, 15);

	/* The window has passed: the next line reports the squashed count, once. */
	rl.window_start_ms = now_ms() - LOG_RATELIMIT_INTERVAL_MS;
	capture_start(&c);
	for (int i = 0; i < LOG_RATELIMIT_BURST + 2; i++) {
		log_ratelimited(&rl, LOG_WARNING, "again %d", i);
	}
	out = capture_end(&c);
	ck_assert_uint_eq(count_lines(out), LOG_RATELIMIT_BURST);
	ck_assert_int_eq(strncmp(out, "<4>again 0 (squashed 15 similar messages)\n", 42), 0);
	last = strstr(out, "again 1\n");
	ck_assert_ptr_nonnull(last);
	ck_assert_ptr_null(strstr(last, "squashed"));
	ck_assert_uint_eq(rl.squashed, 2);
	free(out);

	/* Separate call sites have separate budgets. */
	struct log_ratelimit other = {0};
	capture_start(&c);
	log_ratelimited(&other, LOG_ERR, "other");
	out = capture_end(&c);
	ck_assert_str_eq(out, "<3>other\n");
	free(out);
}
END_TEST

START_TEST(concurrent_writers_keep_lines_whole)
{
	enum { WRITERS = 4, LINES = 300, TEXT = 1500 };
	int pipefd[2];
	pid_t pids[WRITERS];
	char *all;
	size_t used = 0, cap = (size_t)WRITERS * LINES * (TEXT + 16) + 1;
	ssize_t n;
	size_t lines = 0;

	ck_assert_int_eq(pipe(pipefd), 0);
	for (int w = 0; w < WRITERS; w++) {
		pids[w] = fork();
		ck_assert_int_ge(pids[w], 0);
		if (pids[w] == 0) {
			char text[TEXT + 1];

			close(pipefd[0]);
			dup2(pipefd[1], STDERR_FILENO);
			memset(text, 'a' + w, TEXT);
			text[TEXT] = '\0';
			log_init(LOG_INFO, false);
			log_set_target(LOG_TARGET_PREFIX);
			for (int i = 0; i < LINES; i++) {
				log_info("%s", text);
			}
			_exit(0);
		}
	}
	close(pipefd[1]);
	all = malloc(cap);
	ck_assert_ptr_nonnull(all);
	while ((n = read(pipefd[0], all + used, cap - 1 - used)) > 0) {
		used += (size_t)n;
	}
	close(pipefd[0]);
	all[used] = '\0';
	for (int w = 0; w < WRITERS; w++) {
		int status;

		ck_assert_int_eq(waitpid(pids[w], &status, 0), pids[w]);
		ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	/* Every line is "<6>" and TEXT copies of one writer's letter. */
	for (char *p = all; *p;) {
		char *nl = strchr(p, '\n');

		ck_assert_ptr_nonnull(nl);
		ck_assert_int_eq((int)(nl - p), TEXT + 3);
		ck_assert_int_eq(strncmp(p, "<6>", 3), 0);
		for (char *q = p + 3; q < nl; q++) {
			/* Not ck_assert per byte: each costs a message to check's parent. */
			if (*q != p[3]) {
				ck_abort_msg("line %zu mixes writers at byte %td", lines, q - p);
			}
		}
		lines++;
		p = nl + 1;
	}
	ck_assert_uint_eq(lines, WRITERS * LINES);
	free(all);
}
END_TEST

/* Messages quote client bytes: what reaches a protobuf string must be UTF-8. */
START_TEST(utf8_sanitize_replaces_bad_bytes)
{
	const struct {
		const char *in, *out;
		size_t replaced;
	} cases[] = {
		{"plain ascii", "plain ascii", 0},
		{"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
		 "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 0},
		{"bad\xff\xfe", "bad??", 2},
		{"cut \xc3", "cut ?", 1},              /* truncated sequence at the end */
		{"over\xc0\xaf", "over??", 2},         /* overlong '/' */
		{"sur\xed\xa0\x80", "sur???", 3},      /* UTF-16 surrogate */
		{"big\xf4\x90\x80\x80", "big????", 4}, /* past U+10FFFF */
		{"\xe2\x82x", "??x", 2},               /* a lead byte without its continuation */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[64];
		snprintf(buf, sizeof(buf), "%s", cases[i].in);
		ck_assert_uint_eq(utf8_sanitize(buf), cases[i].replaced);
		ck_assert_str_eq(buf, cases[i].out);
	}
}
END_TEST

Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("log");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, level_names);
	tcase_add_test(tc, plain_format_and_level_filter);
	tcase_add_test(tc, prefix_format);
	tcase_add_test(tc, target_from_environment);
	tcase_add_test(tc, control_characters_and_truncation);
	tcase_add_test(tc, errno_is_preserved);
	tcase_add_test(tc, utf8_sanitize_replaces_bad_bytes);
	tcase_add_test(tc, rate_limit_counts);
	tcase_add_test(tc, concurrent_writers_keep_lines_whole);
	suite_add_tcase(s, tc);
	return s;
}
