/* SPDX-License-Identifier: MIT */
/*
 * Configuration: defaults, the INI file, --set overrides, cross-field checks
 * and the printed forms. One table (g_keys, in config_keys.c) names every key with its section,
 * type, range, reload behaviour and help text; parsing, config_set,
 * config_print, config_validate and the shipped example file all walk that
 * table, so a key is never handled in two places.
 *
 * libinih (built with INI_ALLOW_MULTILINE, INI_MAX_LINE 200) reads the file
 * through our own line reader, which counts lines, refuses lines libinih would
 * silently split or read as the continuation of the previous value, and
 * checks section names (libinih never reports a section without keys).
 *
 * This module never opens sockets, never logs (callers log the error text it
 * returns) and never changes the caller's config when loading fails.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fnmatch.h>
#include <ini.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "config_internal.h"
#include "cpu_affinity.h"
#include "log.h"
#include "util.h"

/* libinih's line buffer: longer lines would be split into two lines. */
#define LINE_MAX_CHARS (INI_MAX_LINE - 1)

static const char *const g_transport_names[CONFIG_TRANSPORT_MAX] = {
	[CONFIG_TRANSPORT_AUTO] = "auto",
	[CONFIG_TRANSPORT_TCP] = "tcp",
	[CONFIG_TRANSPORT_VERBS] = "verbs",
};

static const char *const g_class_names[] = {"latency", "bulk"};

static const char *const g_gpu_reg_names[CONFIG_GPU_REG_MAX] = {
	[CONFIG_GPU_REG_AUTO] = "auto",
	[CONFIG_GPU_REG_DMABUF] = "dmabuf",
	[CONFIG_GPU_REG_PEERMEM] = "peermem",
};

static const char *const g_isolation_names[CONFIG_ISOLATION_MAX] = {
	[CONFIG_ISOLATION_SHARED] = "shared",
	[CONFIG_ISOLATION_PER_UID] = "per-uid",
};

static void set_err(char *err, size_t err_size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_size, const char *fmt, ...)
{
	va_list ap;

	if (!err || err_size == 0) {
		return;
	}
	va_start(ap, fmt);
	vsnprintf(err, err_size, fmt, ap);
	va_end(ap);
}

const char *config_transport_name(enum config_transport t)
{
	if ((unsigned)t >= CONFIG_TRANSPORT_MAX) {
		return "unknown";
	}
	return g_transport_names[t];
}

const char *config_class_name(uint32_t cls)
{
	return cls < ARRAY_SIZE(g_class_names) ? g_class_names[cls] : "unknown";
}

const char *config_gpu_registration_name(enum config_gpu_registration r)
{
	if ((unsigned)r >= CONFIG_GPU_REG_MAX) {
		return "unknown";
	}
	return g_gpu_reg_names[r];
}

const char *config_isolation_name(enum config_isolation i)
{
	if ((unsigned)i >= CONFIG_ISOLATION_MAX) {
		return "unknown";
	}
	return g_isolation_names[i];
}

static void *field(struct config *cfg, const struct config_key *k)
{
	return (char *)cfg + k->offset;
}

static const void *cfield(const struct config *cfg, const struct config_key *k)
{
	return (const char *)cfg + k->offset;
}

static uint64_t get_uint(const struct config *cfg, const struct config_key *k)
{
	const void *p = cfield(cfg, k);

	switch (k->size) {
	case sizeof(uint16_t):
		return *(const uint16_t *)p;
	case sizeof(uint32_t):
		return *(const uint32_t *)p;
	default:
		return *(const uint64_t *)p;
	}
}

static void put_uint(struct config *cfg, const struct config_key *k, uint64_t v)
{
	void *p = field(cfg, k);

	switch (k->size) {
	case sizeof(uint16_t):
		*(uint16_t *)p = (uint16_t)v;
		break;
	case sizeof(uint32_t):
		*(uint32_t *)p = (uint32_t)v;
		break;
	default:
		*(uint64_t *)p = v;
		break;
	}
}

static bool is_number(const struct config_key *k)
{
	return k->type == KEY_UINT || k->type == KEY_SIZE || k->type == KEY_MODE;
}

static bool is_string(const struct config_key *k)
{
	return k->type == KEY_PATH || k->type == KEY_NAME || k->type == KEY_ADDR ||
	       k->type == KEY_DEVICES || k->type == KEY_PIN || k->type == KEY_TEXT ||
	       k->type == KEY_CPUS;
}

/*
 * Longest string a key can hold: its field, and the line "name = value" must
 * fit libinih's buffer or config_print would write a file config_load refuses.
 */
static size_t string_max(const struct config_key *k)
{
	size_t line_room = LINE_MAX_CHARS - strlen(k->name) - strlen(" = ");

	return MIN(k->size - 1, line_room);
}

/* "1M" when exact, else plain bytes: what config_print writes and ranges show. */
static void format_size(uint64_t v, char *buf, size_t size)
{
	static const char suffix[] = "TGMK";

	for (int i = 0; i < 4; i++) {
		unsigned shift = 40 - 10 * (unsigned)i;
		uint64_t unit = UINT64_C(1) << shift;

		if (v != 0 && v % unit == 0) {
			snprintf(buf, size, "%llu%c", (unsigned long long)(v >> shift), suffix[i]);
			return;
		}
	}
	snprintf(buf, size, "%llu", (unsigned long long)v);
}

/*
 * Digits with an optional K/M/G/T suffix (powers of 1024) when `suffixes`.
 * strtoull is not used: it skips blanks, accepts signs and wraps "-1".
 */
static int parse_number(const char *s, bool suffixes, uint64_t *ret_v, const char **ret_why)
{
	const char *p = s;
	uint64_t v = 0;
	unsigned shift = 0;

	if (*s == '\0') {
		*ret_why = "empty value";
		return -EINVAL;
	}
	if (*s == '-') {
		*ret_why = "negative numbers are not allowed";
		return -EINVAL;
	}
	if (*s < '0' || *s > '9') {
		*ret_why = "not a number";
		return -EINVAL;
	}
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10) {
			*ret_why = "number too large";
			return -ERANGE;
		}
		v = v * 10 + d;
	}
	if (suffixes && *p != '\0' && p[1] == '\0') {
		switch (*p) {
		case 'K':
		case 'k':
			shift = 10;
			break;
		case 'M':
		case 'm':
			shift = 20;
			break;
		case 'G':
		case 'g':
			shift = 30;
			break;
		case 'T':
		case 't':
			shift = 40;
			break;
		default:
			*ret_why = "unknown size suffix (use K, M, G or T)";
			return -EINVAL;
		}
		p++;
	}
	if (*p != '\0') {
		*ret_why =
			suffixes ? "unexpected text after the number (sizes take one suffix: K, M, "
				   "G or T)"
				 : "unexpected text after the number";
		return -EINVAL;
	}
	if (shift && v > (UINT64_MAX >> shift)) {
		*ret_why = "number too large";
		return -ERANGE;
	}
	*ret_v = v << shift;
	return 0;
}

static int parse_mode(const char *s, uint64_t *ret_v, const char **ret_why)
{
	uint64_t v = 0;

	if (*s == '\0') {
		*ret_why = "empty value";
		return -EINVAL;
	}
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '7') {
			*ret_why = "not an octal mode such as 0660";
			return -EINVAL;
		}
		if (v > 07777) {
			*ret_why = "number too large";
			return -ERANGE;
		}
		v = v * 8 + (unsigned)(*p - '0');
	}
	*ret_v = v;
	return 0;
}

/*
 * Characters that would not survive config_print followed by config_load:
 * libinih strips outer blanks and ends a value at " ;".
 */
static const char *check_text(const char *s)
{
	size_t len = strlen(s);

	for (const char *p = s; *p; p++) {
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			return "control characters are not allowed";
		}
		if (*p == ';' && p > s && (p[-1] == ' ' || p[-1] == '\t')) {
			return "' ;' would start a comment";
		}
	}
	if (len && (s[0] == ' ' || s[len - 1] == ' ')) {
		return "leading or trailing blanks are not allowed";
	}
	return NULL;
}

static bool is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_';
}

static int store_string(struct config *cfg, const struct config_key *k, const char *s,
			const char **ret_why)
{
	if (strlen(s) > string_max(k)) {
		*ret_why = "too long";
		return -ENAMETOOLONG;
	}
	memcpy(field(cfg, k), s, strlen(s) + 1);
	return 0;
}

static void host_name(char *buf, size_t size)
{
	char host[256];

	if (gethostname(host, sizeof(host)) < 0) {
		snprintf(host, sizeof(host), "localhost");
	}
	host[sizeof(host) - 1] = '\0';
	/* The node name is quoted into descriptors and logs: keep it to a safe alphabet. */
	for (char *p = host; *p; p++) {
		if (!is_name_char(*p)) {
			*p = '-';
		}
	}
	if (host[0] == '\0') {
		snprintf(host, sizeof(host), "localhost");
	}
	snprintf(buf, size, "%.*s", (int)(size - 1), host);
}

/*
 * One rule of [verbs] pin at *p: the pattern and the devices ('+'-separated)
 * as spans. Returns 1 and advances *p past it, 0 at the end, or -EINVAL.
 */
static int next_pin_rule(const char **p, const char **ret_pat, size_t *ret_pat_len,
			 const char **ret_devs, size_t *ret_devs_len, const char **ret_why)
{
	const char *s = *p;

	while (*s == ' ' || *s == '\t') {
		s++;
	}
	if (*s == '\0') {
		*p = s;
		return 0;
	}
	const char *pat = s;
	while (*s && *s != '=' && *s != ' ' && *s != '\t') {
		s++;
	}
	if (*s != '=' || s == pat) {
		*ret_why = "expected rules NAME=DEVICE[+DEVICE...] separated by blanks";
		return -EINVAL;
	}
	size_t pat_len = (size_t)(s - pat);
	const char *devs = ++s;
	for (;;) {
		const char *name = s;
		while (is_name_char(*s)) {
			s++;
		}
		if (s == name || (size_t)(s - name) > 63) {
			*ret_why = "a pin rule needs device names of 1 to 63 letters, digits, '.', "
				   "'-' or '_' after '=', joined by '+'";
			return -EINVAL;
		}
		if (*s != '+') {
			break;
		}
		s++;
	}
	if (*s != '\0' && *s != ' ' && *s != '\t') {
		*ret_why = "unexpected character in a pin rule's device list";
		return -EINVAL;
	}
	*ret_pat = pat;
	*ret_pat_len = pat_len;
	*ret_devs = devs;
	*ret_devs_len = (size_t)(s - devs);
	*p = s;
	return 1;
}

int config_pin_check(const char *pin, const char **ret_why)
{
	const char *pat, *devs;
	size_t pat_len, devs_len;
	int ret, n = 0;

	while ((ret = next_pin_rule(&pin, &pat, &pat_len, &devs, &devs_len, ret_why)) > 0) {
		if (pat_len > CONFIG_PIN_NAME_MAX) {
			*ret_why = "a pin rule's client name pattern is longer than 63 characters";
			return -EINVAL;
		}
		if (++n > CONFIG_PIN_RULES_MAX) {
			*ret_why = "more than 32 pin rules";
			return -EINVAL;
		}
	}
	return ret;
}

int config_pin_devices(const char *pin, const char *client_name, char *buf, size_t size)
{
	const char *pat, *devs, *why;
	size_t pat_len, devs_len;
	char pattern[CONFIG_PIN_NAME_MAX + 1];

	while (next_pin_rule(&pin, &pat, &pat_len, &devs, &devs_len, &why) > 0) {
		if (pat_len > CONFIG_PIN_NAME_MAX) {
			continue;
		}
		memcpy(pattern, pat, pat_len);
		pattern[pat_len] = '\0';
		if (fnmatch(pattern, client_name, 0) != 0) {
			continue;
		}
		if (devs_len + 1 > size) {
			return -ENAMETOOLONG;
		}
		for (size_t i = 0; i < devs_len; i++) {
			buf[i] = devs[i] == '+' ? ',' : devs[i];
		}
		buf[devs_len] = '\0';
		return 1;
	}
	return 0;
}

static int parse_devices(struct config *cfg, const struct config_key *k, const char *s,
			 const char **ret_why)
{
	char list[sizeof(cfg->devices)];
	size_t len = 0;
	const char *p = s;

	if (strcmp(s, "auto") == 0) {
		return store_string(cfg, k, s, ret_why);
	}
	if (*s == '\0') {
		*ret_why = "empty value (use auto or device names)";
		return -EINVAL;
	}
	/* Blanks around commas are accepted and dropped: the stored list is "a,b". */
	for (;;) {
		const char *start;
		size_t n;

		while (*p == ' ' || *p == '\t') {
			p++;
		}
		start = p;
		while (is_name_char(*p)) {
			p++;
		}
		n = (size_t)(p - start);
		while (*p == ' ' || *p == '\t') {
			p++;
		}
		if (n == 0 || (*p != ',' && *p != '\0')) {
			*ret_why =
				"expected auto or comma-separated device names (letters, digits, "
				"'.', '-', '_')";
			return -EINVAL;
		}
		if (n > 63) {
			*ret_why = "device name longer than 63 characters";
			return -EINVAL;
		}
		for (size_t i = 0; i < len;) {
			size_t m = strcspn(list + i, ",");

			if (m == n && memcmp(list + i, start, n) == 0) {
				*ret_why = "a device is listed twice";
				return -EINVAL;
			}
			i += m + (list[i + m] == ',');
		}
		if (len + n + 2 > sizeof(list)) {
			*ret_why = "too long";
			return -ENAMETOOLONG;
		}
		if (len) {
			list[len++] = ',';
		}
		memcpy(list + len, start, n);
		len += n;
		list[len] = '\0';
		if (*p == '\0') {
			break;
		}
		p++;
	}
	return store_string(cfg, k, list, ret_why);
}

/*
 * Parse `value` for key k into cfg. On failure *ret_why says why (without the
 * key or value, which the caller adds) and cfg is unchanged.
 */
static int parse_value(struct config *cfg, const struct config_key *k, const char *value,
		       const char **ret_why)
{
	const char *why;
	uint64_t v;
	int r;

	if (is_string(k)) {
		why = check_text(value);
		if (why) {
			*ret_why = why;
			return -EINVAL;
		}
	}
	if (*value == '\0' && !(k->flags & KEY_EMPTY)) {
		*ret_why = "empty value";
		return -EINVAL;
	}

	switch (k->type) {
	case KEY_PATH:
		if (*value != '\0' && *value != '/') {
			*ret_why = "not an absolute path";
			return -EINVAL;
		}
		return store_string(cfg, k, value, ret_why);
	case KEY_NAME: {
		char host[sizeof(cfg->node_name)];

		if (*value == '\0') {
			host_name(host, sizeof(host));
			return store_string(cfg, k, host, ret_why);
		}
		for (const char *p = value; *p; p++) {
			if (!is_name_char(*p)) {
				*ret_why = "only letters, digits, '.', '-' and '_' are allowed";
				return -EINVAL;
			}
		}
		return store_string(cfg, k, value, ret_why);
	}
	case KEY_ADDR: {
		unsigned char addr[sizeof(struct in6_addr)];
		static const unsigned char zero[sizeof(struct in6_addr)];
		int family = strchr(value, ':') ? AF_INET6 : AF_INET;

		if (*value == '\0') {
			return store_string(cfg, k, value, ret_why);
		}
		if (inet_pton(family, value, addr) != 1) {
			*ret_why = "not a numeric IPv4 or IPv6 address";
			return -EINVAL;
		}
		if ((k->flags & KEY_NO_WILDCARD) &&
		    memcmp(addr, zero, family == AF_INET ? 4 : 16) == 0) {
			*ret_why = "peers cannot connect to a wildcard address";
			return -EINVAL;
		}
		return store_string(cfg, k, value, ret_why);
	}
	case KEY_DEVICES:
		return parse_devices(cfg, k, value, ret_why);
	case KEY_TEXT:
		for (const char *p = value; *p; p++) {
			if (*p <= ' ' || *p > '~' || strchr("\"'`;#\\", *p)) {
				*ret_why = "only printable characters without blanks, quotes, ';' "
					   "or '#'";
				return -EINVAL;
			}
		}
		return store_string(cfg, k, value, ret_why);
	case KEY_PIN:
		r = config_pin_check(value, ret_why);
		return r < 0 ? r : store_string(cfg, k, value, ret_why);
	case KEY_CPUS: {
		cpu_set_t set;
		r = cpu_list_parse(value, &set, ret_why);
		return r < 0 ? r : store_string(cfg, k, value, ret_why);
	}
	case KEY_UINT:
	case KEY_SIZE:
	case KEY_MODE:
		r = k->type == KEY_MODE ? parse_mode(value, &v, ret_why)
					: parse_number(value, k->type == KEY_SIZE, &v, ret_why);
		if (r < 0) {
			return r;
		}
		if (v < k->min || v > k->max) {
			*ret_why = "out of range";
			return -ERANGE;
		}
		put_uint(cfg, k, v);
		return 0;
	case KEY_LEVEL:
		r = log_level_parse(value);
		if (r < 0) {
			*ret_why = "expected err, warning, notice, info or debug";
			return r;
		}
		*(int *)field(cfg, k) = r;
		return 0;
	case KEY_TRANSPORT:
		for (int t = 0; t < CONFIG_TRANSPORT_MAX; t++) {
			if (strcmp(value, g_transport_names[t]) == 0) {
				*(enum config_transport *)field(cfg, k) = (enum config_transport)t;
				return 0;
			}
		}
		*ret_why = "expected auto, tcp or verbs";
		return -EINVAL;
	case KEY_ONOFF:
		if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0) {
			*ret_why = "expected off or on";
			return -EINVAL;
		}
		*(bool *)field(cfg, k) = value[1] == 'n';
		return 0;
	case KEY_GPU_REG:
		for (int g = 0; g < CONFIG_GPU_REG_MAX; g++) {
			if (strcmp(value, g_gpu_reg_names[g]) == 0) {
				*(enum config_gpu_registration *)field(cfg, k) =
					(enum config_gpu_registration)g;
				return 0;
			}
		}
		*ret_why = "expected auto, dmabuf or peermem";
		return -EINVAL;
	case KEY_BOOL:
		if (strcmp(value, "true") == 0 || strcmp(value, "false") == 0) {
			*(bool *)field(cfg, k) = value[0] == 't';
			return 0;
		}
		*ret_why = "expected true or false";
		return -EINVAL;
	case KEY_CLASS:
		for (uint32_t c = 0; c < ARRAY_SIZE(g_class_names); c++) {
			if (strcmp(value, g_class_names[c]) == 0) {
				*(uint32_t *)field(cfg, k) = c;
				return 0;
			}
		}
		*ret_why = "expected latency or bulk";
		return -EINVAL;
	case KEY_ISOLATION:
		for (int i = 0; i < CONFIG_ISOLATION_MAX; i++) {
			if (strcmp(value, g_isolation_names[i]) == 0) {
				*(enum config_isolation *)field(cfg, k) = (enum config_isolation)i;
				return 0;
			}
		}
		*ret_why = "expected shared or per-uid";
		return -EINVAL;
	case KEY_TYPE_MAX:
		break;
	}
	*ret_why = "internal error: unknown key type";
	return -EINVAL;
}

static void format_value(const struct config *cfg, const struct config_key *k, char *buf,
			 size_t size)
{
	switch (k->type) {
	case KEY_PATH:
	case KEY_NAME:
	case KEY_ADDR:
	case KEY_DEVICES:
	case KEY_PIN:
	case KEY_TEXT:
	case KEY_CPUS:
		snprintf(buf, size, "%s", (const char *)cfield(cfg, k));
		return;
	case KEY_UINT:
		snprintf(buf, size, "%llu", (unsigned long long)get_uint(cfg, k));
		return;
	case KEY_SIZE:
		format_size(get_uint(cfg, k), buf, size);
		return;
	case KEY_MODE:
		snprintf(buf, size, "%04llo", (unsigned long long)get_uint(cfg, k));
		return;
	case KEY_LEVEL:
		snprintf(buf, size, "%s", log_level_name(*(const int *)cfield(cfg, k)));
		return;
	case KEY_TRANSPORT:
		snprintf(buf, size, "%s",
			 config_transport_name(*(const enum config_transport *)cfield(cfg, k)));
		return;
	case KEY_ONOFF:
		snprintf(buf, size, "%s", *(const bool *)cfield(cfg, k) ? "on" : "off");
		return;
	case KEY_GPU_REG:
		snprintf(buf, size, "%s",
			 config_gpu_registration_name(
				 *(const enum config_gpu_registration *)cfield(cfg, k)));
		return;
	case KEY_BOOL:
		snprintf(buf, size, "%s", *(const bool *)cfield(cfg, k) ? "true" : "false");
		return;
	case KEY_CLASS:
		snprintf(buf, size, "%s", config_class_name(*(const uint32_t *)cfield(cfg, k)));
		return;
	case KEY_ISOLATION:
		snprintf(buf, size, "%s",
			 config_isolation_name(*(const enum config_isolation *)cfield(cfg, k)));
		return;
	case KEY_TYPE_MAX:
		break;
	}
	snprintf(buf, size, "?");
}

/* The accepted values of k, for error messages and the example file. */
static void format_range(const struct config_key *k, char *buf, size_t size)
{
	char lo[24], hi[24];

	switch (k->type) {
	case KEY_UINT:
		snprintf(buf, size, "%llu..%llu", (unsigned long long)k->min,
			 (unsigned long long)k->max);
		return;
	case KEY_SIZE:
		format_size(k->min, lo, sizeof(lo));
		format_size(k->max, hi, sizeof(hi));
		snprintf(buf, size, "%s..%s", lo, hi);
		return;
	case KEY_MODE:
		snprintf(buf, size, "%04llo..%04llo", (unsigned long long)k->min,
			 (unsigned long long)k->max);
		return;
	case KEY_PATH:
	case KEY_NAME:
	case KEY_ADDR:
	case KEY_DEVICES:
	case KEY_PIN:
	case KEY_TEXT:
	case KEY_CPUS:
		snprintf(buf, size, "at most %zu characters", string_max(k));
		return;
	case KEY_LEVEL:
	case KEY_TRANSPORT:
	case KEY_GPU_REG:
	case KEY_ONOFF:
	case KEY_BOOL:
	case KEY_CLASS:
	case KEY_ISOLATION:
	case KEY_TYPE_MAX:
		break;
	}
	buf[0] = '\0';
}

static const struct config_section *find_section_n(const char *name, size_t len)
{
	for (size_t i = 0; i < g_n_sections; i++) {
		if (strlen(g_sections[i].name) == len &&
		    memcmp(g_sections[i].name, name, len) == 0) {
			return &g_sections[i];
		}
	}
	return NULL;
}

static const struct config_key *find_key(const char *section, const char *name)
{
	for (size_t i = 0; i < g_n_keys; i++) {
		if (strcmp(g_keys[i].section, section) == 0 && strcmp(g_keys[i].name, name) == 0) {
			return &g_keys[i];
		}
	}
	return NULL;
}

/* The whole of config_set and of the INI handler; the file loader adds "path:line: ". */
static int set_key(struct config *cfg, const char *section, const char *name, const char *value,
		   char *err, size_t err_size)
{
	const struct config_key *k;
	const char *why = NULL;
	char range[64];
	int r;

	if (*section == '\0') {
		set_err(err, err_size, "key '%s' is outside of any section", name);
		return -EINVAL;
	}
	if (!find_section_n(section, strlen(section))) {
		set_err(err, err_size, "unknown section [%s]", section);
		return -EINVAL;
	}
	if (*name == '\0') {
		set_err(err, err_size, "missing key name before '='");
		return -EINVAL;
	}
	k = find_key(section, name);
	if (!k) {
		set_err(err, err_size, "unknown key '%s' in section [%s]", name, section);
		return -EINVAL;
	}
	r = parse_value(cfg, k, value, &why);
	if (r < 0) {
		format_range(k, range, sizeof(range));
		if (r == -ERANGE || r == -ENAMETOOLONG) {
			set_err(err, err_size, "invalid value '%s' for [%s] %s: %s (%s)", value,
				section, name, why, range);
		} else {
			set_err(err, err_size, "invalid value '%s' for [%s] %s: %s", value, section,
				name, why);
		}
		return -EINVAL;
	}
	return 0;
}

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", "/run/rdmaxd.sock");
	snprintf(cfg->admin_socket_path, sizeof(cfg->admin_socket_path), "%s",
		 "/run/rdmaxd-admin.sock");
	snprintf(cfg->admin_group, sizeof(cfg->admin_group), "%s", "rdmaxd-admin");
	cfg->socket_mode = 0666;
	host_name(cfg->node_name, sizeof(cfg->node_name));
	cfg->log_level = LOG_INFO;

	cfg->transport = CONFIG_TRANSPORT_AUTO;
	snprintf(cfg->listen_addr, sizeof(cfg->listen_addr), "%s", "127.0.0.1");
	cfg->listen_port = 7471;
	cfg->advertise_addr[0] = '\0';

	cfg->auth_key_file[0] = '\0';

	cfg->max_clients = 256;
	cfg->max_message_bytes = 1 * MiB;
	cfg->max_fds_per_message = 4;
	cfg->max_regions = 1024;
	cfg->max_registered_bytes = 64 * GiB;
	cfg->max_outstanding_jobs = 4096;
	cfg->max_jobs_per_submit = 1024;
	cfg->max_connections = 1024;
	cfg->max_imm_counters = 65536;
	cfg->hello_timeout_ms = 5000;
	cfg->per_uid_clients = 64;
	cfg->per_uid_regions = 4096;
	cfg->per_uid_registered_bytes = 256 * GiB;
	cfg->per_uid_outstanding_jobs = 16384;
	cfg->per_uid_imm_counters = 16384;
	cfg->per_uid_mailboxes = 256;
	cfg->per_uid_queued_message_bytes = 16 * MiB;
	cfg->per_uid_peer_connections = 256;
	cfg->admin_max_connections = 64;
	cfg->admin_idle_timeout_ms = 60000;

	cfg->connect_timeout_ms = 3000;
	cfg->connect_retries = 3;
	cfg->retry_backoff_ms = 100;
	cfg->peer_timeout_ms = 10000;
	cfg->idle_timeout_s = 300;
	cfg->handshake_timeout_ms = 3000;
	cfg->max_handshakes = 64;
	cfg->max_handshakes_per_host = 8;
	cfg->max_connections_per_host = 64;
	cfg->reserved_outgoing = 64;
	cfg->min_frame_rate_kib_s = 1024;

	cfg->chunk_bytes = 1 * MiB;
	cfg->busy_poll_us = 1000;
	cfg->tcp_io_threads = 2;
	cfg->tcp_chunk_bytes = 4 * MiB;

	snprintf(cfg->devices, sizeof(cfg->devices), "%s", "auto");
	cfg->rail_retry_ms = 5000;
	cfg->qps_per_peer = 2;
	cfg->inline_threshold = 64;
	cfg->signal_interval = 16;

	cfg->metrics_textfile_dir[0] = '\0';
	cfg->metrics_textfile_interval_s = 15;

	snprintf(cfg->discovery_backend, sizeof(cfg->discovery_backend), "%s", "none");
	snprintf(cfg->discovery_prefix, sizeof(cfg->discovery_prefix), "%s", "/rdmaxd/default/");
	cfg->discovery_ttl_s = 10;

	cfg->gpu_registration = CONFIG_GPU_REG_AUTO;
	cfg->gpu_pool_bytes = 0;

	cfg->qos_enabled = false;
	cfg->qos_weight[0] = 8;
	cfg->qos_weight[1] = 1;
	cfg->qos_default_class = 1; /* bulk */
	cfg->qos_max_in_flight = 32;
	cfg->qos_latency_reserve = 4;
	cfg->qos_lane_linger_ms = 1000;
	cfg->isolation = CONFIG_ISOLATION_SHARED;
	cfg->max_isolation_domains = 256;
}

int config_set(struct config *cfg, const char *section, const char *key, const char *value,
	       char *err, size_t err_size)
{
	return set_key(cfg, section, key, value, err, err_size);
}

int config_set_option(struct config *cfg, const char *arg, char *err, size_t err_size)
{
	char section[32];
	const char *dot = strchr(arg, '.');
	const char *eq = strchr(arg, '=');
	char *key;
	int r;

	if (!dot || !eq || dot > eq || dot == arg || eq == dot + 1 ||
	    (size_t)(dot - arg) >= sizeof(section)) {
		set_err(err, err_size, "expected section.key=value, got '%s'", arg);
		return -EINVAL;
	}
	snprintf(section, sizeof(section), "%.*s", (int)(dot - arg), arg);
	key = strndup(dot + 1, (size_t)(eq - dot - 1));
	if (!key) {
		set_err(err, err_size, "out of memory");
		return -ENOMEM;
	}
	r = set_key(cfg, section, key, eq + 1, err, err_size);
	free(key);
	return r;
}

/* State of one config_load: libinih calls our reader, then our handler, line by line. */
struct load_ctx {
	struct config cfg; /* values being loaded; copied to the caller only on success */
	FILE *file;
	char *buf; /* getline buffer */
	size_t buf_size;
	unsigned line;     /* number of the line last handed to libinih */
	int read_errno;    /* from getline, when reading failed */
	unsigned err_line; /* first error, 0 when none */
	char err[CONFIG_ERR_MAX];
};

static void load_error(struct load_ctx *ctx, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void load_error(struct load_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	if (ctx->err_line) {
		return;
	}
	ctx->err_line = ctx->line;
	va_start(ap, fmt);
	vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
	va_end(ap);
}

/* First of `chars` in s, stopping (like libinih) at an inline comment " ;". */
static const char *find_sep(const char *s, const char *chars)
{
	bool blank_before = false;

	for (; *s; s++) {
		if (strchr(chars, *s) || (blank_before && *s == ';')) {
			return s;
		}
		blank_before = *s == ' ' || *s == '\t';
	}
	return s;
}

/*
 * Checks libinih cannot do for us, on the raw line; returns false when the
 * line is wrong (the error is recorded).
 */
static bool check_line(struct load_ctx *ctx, const char *line)
{
	const char *p = line + strspn(line, " \t");
	const char *end, *rest;

	if (*p == '\0' || *p == ';' || *p == '#') {
		return true;
	}
	if (p != line) {
		/* libinih (INI_ALLOW_MULTILINE) appends an indented line to the previous value. */
		load_error(ctx, "indented line: remove the leading blanks (an indented line "
				"continues the previous value)");
		return false;
	}
	if (*p == '[') {
		end = find_sep(p + 1, "]");
		if (*end != ']') {
			load_error(ctx, "syntax error: section header without ']'");
			return false;
		}
		rest = end + 1 + strspn(end + 1, " \t");
		if (*rest != '\0' && *rest != ';') {
			load_error(ctx, "syntax error: unexpected text after ']'");
			return false;
		}
		if (!find_section_n(p + 1, (size_t)(end - p - 1))) {
			load_error(ctx, "unknown section [%.*s]", (int)(end - p - 1), p + 1);
			return false;
		}
		return true;
	}
	end = find_sep(p, "=:");
	if (*end != '=' && *end != ':') {
		load_error(ctx, "syntax error: expected 'key = value', '[section]' or a comment");
		return false;
	}
	return true;
}

static char *read_line(char *out, int out_size, void *stream)
{
	struct load_ctx *ctx = stream;
	ssize_t n;
	char *line;

	/* Stop at the first error: later lines cannot change the message. */
	if (ctx->err_line) {
		return NULL;
	}
	errno = 0;
	n = getline(&ctx->buf, &ctx->buf_size, ctx->file);
	if (n < 0) {
		ctx->read_errno = ferror(ctx->file) ? (errno ? errno : EIO) : 0;
		return NULL;
	}
	ctx->line++;
	line = ctx->buf;
	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) {
		line[--n] = '\0';
	}
	if (ctx->line == 1 && n >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) {
		line += 3;
		n -= 3;
	}
	if (strlen(line) != (size_t)n) {
		load_error(ctx, "line contains a NUL byte");
		return NULL;
	}
	if (n > out_size - 1) {
		load_error(ctx, "line longer than %d characters", out_size - 1);
		return NULL;
	}
	if (!check_line(ctx, line)) {
		return NULL;
	}
	memcpy(out, line, (size_t)n + 1);
	return out;
}

static int on_key(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *ctx = user;
	char msg[CONFIG_ERR_MAX];

	if (ctx->err_line) {
		return 1;
	}
	if (set_key(&ctx->cfg, section, name, value, msg, sizeof(msg)) < 0) {
		load_error(ctx, "%s", msg);
	}
	/* Errors are ours to count; libinih's return value then only reports syntax errors. */
	return 1;
}

int config_load(struct config *cfg, const char *path, char *err, size_t err_size)
{
	struct load_ctx *ctx;
	int r;

	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		set_err(err, err_size, "out of memory");
		return -ENOMEM;
	}
	ctx->file = fopen(path, "re");
	if (!ctx->file) {
		r = -errno;
		set_err(err, err_size, "cannot open '%s': %s", path, strerror(-r));
		goto out_free_ctx;
	}
	ctx->cfg = *cfg;

	r = ini_parse_stream(read_line, ctx, on_key, ctx);
	if (ctx->read_errno) {
		r = -ctx->read_errno;
		set_err(err, err_size, "cannot read '%s': %s", path, strerror(ctx->read_errno));
		goto out_close_file;
	}
	if (r == -2) {
		r = -ENOMEM;
		set_err(err, err_size, "out of memory");
		goto out_close_file;
	}
	/* check_line mirrors libinih's syntax rules; this catches any line it let through. */
	if (r > 0 && (ctx->err_line == 0 || (unsigned)r < ctx->err_line)) {
		ctx->err_line = (unsigned)r;
		snprintf(ctx->err, sizeof(ctx->err), "syntax error");
	}
	if (ctx->err_line) {
		set_err(err, err_size, "%s:%u: %s", path, ctx->err_line, ctx->err);
		r = -EINVAL;
		goto out_close_file;
	}
	*cfg = ctx->cfg;
	r = 0;

out_close_file:
	fclose(ctx->file);
	free(ctx->buf);
out_free_ctx:
	free(ctx);
	return r;
}

static bool is_wildcard(const char *addr)
{
	unsigned char a[sizeof(struct in6_addr)];
	static const unsigned char zero[sizeof(struct in6_addr)];

	if (inet_pton(AF_INET, addr, a) == 1) {
		return memcmp(a, zero, 4) == 0;
	}
	if (inet_pton(AF_INET6, addr, a) == 1) {
		return memcmp(a, zero, 16) == 0;
	}
	return false;
}

int config_validate(const struct config *cfg, char *err, size_t err_size)
{
	struct config scratch = *cfg;
	char value[512];
	char msg[CONFIG_ERR_MAX];

	if (cfg->log_level < LOG_ERR || cfg->log_level > LOG_DEBUG) {
		set_err(err, err_size, "[daemon] log_level %d is out of range", cfg->log_level);
		return -EINVAL;
	}
	if ((unsigned)cfg->transport >= CONFIG_TRANSPORT_MAX) {
		set_err(err, err_size, "[transport] type %d is unknown", (int)cfg->transport);
		return -EINVAL;
	}
	if (strcmp(cfg->discovery_backend, "none") != 0 &&
	    strcmp(cfg->discovery_backend, "etcd") != 0) {
		set_err(err, err_size, "[discovery] backend must be none or etcd, not '%s'",
			cfg->discovery_backend);
		return -EINVAL;
	}
	if (strcmp(cfg->discovery_backend, "etcd") == 0 && !cfg->discovery_endpoints[0]) {
		set_err(err, err_size, "[discovery] backend = etcd needs endpoints");
		return -EINVAL;
	}
	if (cfg->discovery_prefix[0] != '/') {
		set_err(err, err_size, "[discovery] prefix must start with '/'");
		return -EINVAL;
	}
	if ((unsigned)cfg->isolation >= CONFIG_ISOLATION_MAX) {
		set_err(err, err_size, "[verbs] isolation %d is unknown", (int)cfg->isolation);
		return -EINVAL;
	}
	if ((unsigned)cfg->gpu_registration >= CONFIG_GPU_REG_MAX) {
		set_err(err, err_size, "[gpu] registration %d is unknown",
			(int)cfg->gpu_registration);
		return -EINVAL;
	}
	if (cfg->qos_default_class > 1) {
		set_err(err, err_size, "[qos] default_class %u is unknown", cfg->qos_default_class);
		return -EINVAL;
	}
	if (cfg->qos_latency_reserve >= cfg->qos_max_in_flight) {
		set_err(err, err_size,
			"[qos] latency_reserve (%u) must be less than max_in_flight (%u): bulk "
			"chunks would never be issued",
			cfg->qos_latency_reserve, cfg->qos_max_in_flight);
		return -EINVAL;
	}
	/* A struct filled in by code gets the parser's rules too. */
	for (size_t i = 0; i < g_n_keys; i++) {
		const struct config_key *k = &g_keys[i];

		if (is_string(k) && memchr(cfield(cfg, k), '\0', k->size) == NULL) {
			set_err(err, err_size, "[%s] %s is not terminated", k->section, k->name);
			return -EINVAL;
		}
		format_value(cfg, k, value, sizeof(value));
		if (k->type == KEY_NAME && value[0] == '\0') {
			set_err(err, err_size, "[%s] %s is empty", k->section, k->name);
			return -EINVAL;
		}
		if (set_key(&scratch, k->section, k->name, value, msg, sizeof(msg)) < 0) {
			set_err(err, err_size, "%s", msg);
			return -EINVAL;
		}
	}

	if (cfg->socket_path[0] == '\0' || cfg->admin_socket_path[0] == '\0') {
		set_err(err, err_size, "[daemon] socket and admin_socket must be set");
		return -EINVAL;
	}
	if (strlen(cfg->socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path) ||
	    strlen(cfg->admin_socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		set_err(err, err_size, "[daemon] socket paths must be shorter than %zu bytes",
			sizeof(((struct sockaddr_un *)0)->sun_path));
		return -EINVAL;
	}
	if (strcmp(cfg->socket_path, cfg->admin_socket_path) == 0) {
		set_err(err, err_size, "[daemon] socket and admin_socket are both '%s'",
			cfg->socket_path);
		return -EINVAL;
	}
	if (cfg->auth_key_file[0] != '\0' &&
	    (strcmp(cfg->auth_key_file, cfg->socket_path) == 0 ||
	     strcmp(cfg->auth_key_file, cfg->admin_socket_path) == 0)) {
		set_err(err, err_size, "[auth] key_file '%s' is also a socket path",
			cfg->auth_key_file);
		return -EINVAL;
	}
	if (cfg->tcp_encryption && cfg->auth_key_file[0] == '\0') {
		set_err(err, err_size,
			"[transport] tcp_encryption = on needs [auth] key_file: the TLS key is "
			"derived from it");
		return -EINVAL;
	}
	if (cfg->advertise_addr[0] == '\0' && is_wildcard(cfg->listen_addr)) {
		set_err(err, err_size,
			"[transport] advertise must be set when listen is the wildcard address "
			"'%s'",
			cfg->listen_addr);
		return -EINVAL;
	}
	if (cfg->max_jobs_per_submit > cfg->max_outstanding_jobs) {
		set_err(err, err_size,
			"[limits] max_jobs_per_submit (%u) exceeds max_outstanding_jobs (%u)",
			cfg->max_jobs_per_submit, cfg->max_outstanding_jobs);
		return -EINVAL;
	}
	return 0;
}

void config_print(const struct config *cfg, FILE *out)
{
	const char *section = "";
	char value[512];

	fprintf(out, "; rdmaxd effective configuration\n");
	for (size_t i = 0; i < g_n_keys; i++) {
		const struct config_key *k = &g_keys[i];

		if (strcmp(section, k->section) != 0) {
			section = k->section;
			fprintf(out, "\n[%s]\n", section);
		}
		format_value(cfg, k, value, sizeof(value));
		fprintf(out, "%s =%s%s\n", k->name, value[0] ? " " : "", value);
	}
}

/* Write text as "; " comment lines of at most 79 columns. */
static void print_comment(FILE *out, const char *text)
{
	const size_t width = 77;

	while (*text) {
		size_t len = strlen(text);
		size_t cut = len;

		if (len > width) {
			cut = width;
			while (cut > 0 && text[cut] != ' ') {
				cut--;
			}
			if (cut == 0) {
				cut = strcspn(text, " ");
			}
		}
		fprintf(out, "; %.*s\n", (int)cut, text);
		text += cut;
		while (*text == ' ') {
			text++;
		}
	}
}

void config_print_example(FILE *out)
{
	struct config def;
	const char *section = "";
	char value[512], range[64], text[1024];

	config_defaults(&def);
	/* The shipped file must not carry the host name of the machine that wrote it. */
	def.node_name[0] = '\0';

	fprintf(out, "; SPDX-License-Identifier: MIT\n");
	print_comment(out, "rdmaxd configuration file; see rdmaxd.conf(5).");
	fprintf(out, ";\n");
	print_comment(out,
		      "Every key is listed, commented out, with its default value. "
		      "Lines starting with ';' or '#' are comments; a comment after a value "
		      "starts with ' ;'. Lines must not be indented. Sizes take a K, M, G or T "
		      "suffix (powers of 1024). Any key can also be set on the command line with "
		      "--set section.key=value.");
	fprintf(out, ";\n");
	print_comment(out, "Keys marked 'Applied on reload' take effect when the daemon receives "
			   "SIGHUP; the others need a restart.");
	for (size_t i = 0; i < g_n_keys; i++) {
		const struct config_key *k = &g_keys[i];
		const char *reload =
			k->flags & KEY_RELOAD ? "Applied on reload." : "Needs a restart.";

		if (strcmp(section, k->section) != 0) {
			section = k->section;
			fprintf(out, "\n[%s]\n", section);
			print_comment(out, find_section_n(section, strlen(section))->help);
		}
		format_range(k, range, sizeof(range));
		if (is_number(k)) {
			snprintf(text, sizeof(text), "%s Range: %s. %s", k->help, range, reload);
		} else if (k->type == KEY_PATH || k->type == KEY_NAME || k->type == KEY_DEVICES ||
			   k->type == KEY_PIN || k->type == KEY_TEXT || k->type == KEY_CPUS) {
			snprintf(text, sizeof(text), "%s At most %zu characters. %s", k->help,
				 string_max(k), reload);
		} else {
			snprintf(text, sizeof(text), "%s %s", k->help, reload);
		}
		fprintf(out, "\n");
		print_comment(out, text);
		format_value(&def, k, value, sizeof(value));
		fprintf(out, ";%s =%s%s\n", k->name, value[0] ? " " : "", value);
	}
}

int config_restart_keys(const struct config *old_cfg, const struct config *new_cfg, char *buf,
			size_t buf_size)
{
	char a[512], b[512];
	size_t used = 0;
	int count = 0;

	if (buf && buf_size) {
		buf[0] = '\0';
	}
	for (size_t i = 0; i < g_n_keys; i++) {
		const struct config_key *k = &g_keys[i];

		if (k->flags & KEY_RELOAD) {
			continue;
		}
		format_value(old_cfg, k, a, sizeof(a));
		format_value(new_cfg, k, b, sizeof(b));
		if (strcmp(a, b) == 0) {
			continue;
		}
		if (buf && used < buf_size) {
			int n = snprintf(buf + used, buf_size - used, "%s[%s] %s",
					 count ? ", " : "", k->section, k->name);
			used += n > 0 ? (size_t)n : 0;
		}
		count++;
	}
	return count;
}

void config_apply_reloadable(struct config *cfg, const struct config *next)
{
	for (size_t i = 0; i < g_n_keys; i++) {
		const struct config_key *k = &g_keys[i];

		if (k->flags & KEY_RELOAD) {
			memcpy((char *)cfg + k->offset, (const char *)next + k->offset, k->size);
		}
	}
}
