/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the configuration parser (daemon/base/config.c) over libinih.
 * The bytes are a configuration file; config_load() must accept it or name
 * the line and the reason, and what it accepts must validate or be refused
 * with a message. The first line may instead be a `--set SECTION.KEY=VALUE`
 * override, the other way keys reach the parser.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config cfg;
	char err[CONFIG_ERR_MAX];

	if (g_fd < 0) {
		log_init(LOG_ERR, false);
		g_fd = memfd_create("fuzz-config", MFD_CLOEXEC);
		if (g_fd < 0) {
			abort();
		}
		snprintf(g_path, sizeof(g_path), "/proc/self/fd/%d", g_fd);
	}
	config_defaults(&cfg);
	/* One override: everything up to the first newline, when it has '='. */
	const uint8_t *nl = memchr(data, '\n', size < 512 ? size : 512);
	if (nl && memchr(data, '=', (size_t)(nl - data)) && size && data[0] == '-') {
		char arg[512];
		size_t n = (size_t)(nl - data) - 1;
		memcpy(arg, data + 1, n);
		arg[n] = '\0';
		err[0] = '\0';
		if (config_set_option(&cfg, arg, err, sizeof(err)) < 0 && !err[0]) {
			abort(); /* refused without a reason */
		}
	}
	if (ftruncate(g_fd, 0) < 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size) {
		abort();
	}
	err[0] = '\0';
	if (config_load(&cfg, g_path, err, sizeof(err)) < 0) {
		if (!err[0]) {
			abort();
		}
		return 0;
	}
	err[0] = '\0';
	if (config_validate(&cfg, err, sizeof(err)) < 0) {
		if (!err[0]) {
			abort();
		}
		return 0;
	}
	/* Accepted: printing it must work too (rdmaxd --check-config). */
	FILE *out = fopen("/dev/null", "w");
	if (out) {
		config_print(&cfg, out);
		fclose(out);
	}
	return 0;
}
