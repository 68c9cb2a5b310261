/* SPDX-License-Identifier: MIT */
/* Small helpers shared by daemon modules: time, random ids, list macros. */
#ifndef RDMAXD_UTIL_H
#define RDMAXD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_SIZE(a)                   (sizeof(a) / sizeof((a)[0]))
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif
#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

/* Monotonic clock in milliseconds / nanoseconds. */
uint64_t now_ms(void);
uint64_t now_ns(void);

/* Cryptographically random bytes (getrandom); aborts only if the kernel cannot supply them. */
void random_bytes(void *buf, size_t len);
uint64_t random_u64(void);

/* Copy a string into a fixed buffer; returns -ENAMETOOLONG when it does not fit. */
int copy_string(char *dst, size_t dst_size, const char *src);

/*
 * Make s valid UTF-8 in place: every byte that does not belong to a well-formed
 * sequence (overlong forms, surrogates and code points past U+10FFFF included)
 * becomes '?'. Returns how many bytes were replaced. Text that reaches a
 * protobuf `string` field goes through this, so client bytes are never echoed
 * as they came.
 */
size_t utf8_sanitize(char *s);

/* True when name is one of the entries of a comma-separated list ("a,b", no blanks). */
bool name_in_list(const char *list, const char *name);

/* Intrusive doubly linked list (circular, with a head node). */
struct list_node {
	struct list_node *next;
	struct list_node *prev;
};

static inline void list_init(struct list_node *head)
{
	head->next = head;
	head->prev = head;
}

static inline int list_empty(const struct list_node *head)
{
	return head->next == head;
}

static inline void list_add_tail(struct list_node *head, struct list_node *node)
{
	node->prev = head->prev;
	node->next = head;
	head->prev->next = node;
	head->prev = node;
}

static inline void list_del(struct list_node *node)
{
	node->prev->next = node->next;
	node->next->prev = node->prev;
	node->next = node;
	node->prev = node;
}

/* Append every node of src to dst, in order, leaving src empty. */
static inline void list_move_all(struct list_node *dst, struct list_node *src)
{
	if (list_empty(src)) {
		return;
	}
	src->next->prev = dst->prev;
	dst->prev->next = src->next;
	src->prev->next = dst;
	dst->prev = src->prev;
	list_init(src);
}

#define list_for_each_safe(pos, tmp, head)                                                         \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                           \
	     (pos) = (tmp), (tmp) = (pos)->next)

/*
 * Little-endian fields of wire formats, at any alignment. Spelled out byte by
 * byte, without loops: the compiler merges each into a single load or store
 * on little-endian hosts (a loop it does not unroll costs some 400
 * instructions per frame header).
 */
static inline void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get_le64(const uint8_t *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

#endif
