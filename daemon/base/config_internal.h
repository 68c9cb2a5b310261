/* SPDX-License-Identifier: MIT */
/*
 * Private to base/config: the table of every configuration key (config_keys.c)
 * and the types it is written in, walked by config.c's parser and printers.
 */
#ifndef RDMAXD_CONFIG_INTERNAL_H
#define RDMAXD_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* How a value is written in the file and stored in struct config. */
enum key_type {
	KEY_PATH,      /* absolute path in a char array */
	KEY_NAME,      /* node name in a char array; empty means the host name */
	KEY_ADDR,      /* numeric IPv4 or IPv6 address in a char array */
	KEY_DEVICES,   /* "auto" or comma-separated device names in a char array */
	KEY_PIN,       /* "CLIENT=DEV[+DEV...]" rules, blank-separated, in a char array */
	KEY_TEXT,      /* printable ASCII without blanks, quotes, ';' or '#', in a char array */
	KEY_CPUS,      /* CPU list ("0-3,6") in a char array; empty: not pinned */
	KEY_UINT,      /* decimal unsigned integer (uint16_t, uint32_t or uint64_t) */
	KEY_SIZE,      /* unsigned integer with optional K/M/G/T suffix */
	KEY_MODE,      /* octal permission bits in a uint32_t */
	KEY_LEVEL,     /* log level name in an int */
	KEY_TRANSPORT, /* enum config_transport */
	KEY_GPU_REG,   /* enum config_gpu_registration */
	KEY_ONOFF,     /* off or on in a bool */
	KEY_BOOL,      /* true or false in a bool */
	KEY_CLASS,     /* traffic class name (latency, bulk) in a uint32_t */
	KEY_ISOLATION, /* enum config_isolation */
	KEY_TYPE_MAX,  /* terminator */
};

#define KEY_RELOAD      0x1u /* applied on SIGHUP without a restart */
#define KEY_EMPTY       0x2u /* the empty string is a valid value */
#define KEY_NO_WILDCARD 0x4u /* an address that peers connect to: not 0.0.0.0 or :: */

struct config_key {
	const char *section;
	const char *name;
	enum key_type type;
	size_t offset;    /* of the field in struct config */
	size_t size;      /* of the field */
	uint64_t min;     /* numbers only */
	uint64_t max;     /* numbers: largest value; strings: unused (the field size limits) */
	unsigned flags;   /* KEY_* */
	const char *help; /* what the key does and its unit, for the example file */
};

struct config_section {
	const char *name;
	const char *help;
};

#define FIELD(f) offsetof(struct config, f), sizeof(((struct config *)0)->f)
#define KiB      (UINT64_C(1) << 10)
#define MiB      (UINT64_C(1) << 20)
#define GiB      (UINT64_C(1) << 30)
#define TiB      (UINT64_C(1) << 40)

extern const struct config_section g_sections[];
extern const size_t g_n_sections;
extern const struct config_key g_keys[];
extern const size_t g_n_keys;

#endif
