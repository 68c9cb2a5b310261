/* SPDX-License-Identifier: MIT */
/*
 * Bookkeeping behind librdmax's receive path: the FIFO of events that
 * arrived while the application was waiting for something else, and the
 * multiset of outstanding job ids. Plain data structures: this file never
 * touches the socket and never blocks.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define EVQ_MIN_CAP  16
#define JOBS_MIN_CAP 64

/*
 * The power-of-two capacity a table of elem-byte entries grows to from cap
 * (min when it has none) to hold want entries, want at most SIZE_MAX / 2;
 * 0 when its bytes would not fit in a size_t.
 */
static size_t grown_cap(size_t cap, size_t min, size_t want, size_t elem)
{
	if (cap == 0) {
		cap = min;
	}
	while (cap < want) {
		cap *= 2;
	}
	return cap > SIZE_MAX / elem ? 0 : cap;
}

void client_evq_free(struct client_evq *q)
{
	if (!q) {
		return;
	}
	/* Payloads of messages nobody took are still the queue's. */
	for (size_t i = 0; i < q->len; i++) {
		free((void *)q->ev[(q->head + i) & (q->cap - 1)].payload);
	}
	free(q->ev);
	q->ev = NULL;
	q->cap = 0;
	q->head = 0;
	q->len = 0;
}

int client_evq_reserve(struct client_evq *q, size_t extra)
{
	if (extra > SIZE_MAX / 2 - q->len) {
		return -ENOMEM;
	}
	size_t need = q->len + extra;
	if (need <= q->cap) {
		return 0;
	}
	size_t cap = grown_cap(q->cap, EVQ_MIN_CAP, need, sizeof(*q->ev));
	if (cap == 0) {
		return -ENOMEM;
	}
	struct rdmax_event *ev = malloc(cap * sizeof(*ev));
	if (!ev) {
		return -ENOMEM;
	}
	/* Unwrap the ring so the oldest event lands at index 0. */
	for (size_t i = 0; i < q->len; i++) {
		ev[i] = q->ev[(q->head + i) & (q->cap - 1)];
	}
	free(q->ev);
	q->ev = ev;
	q->cap = cap;
	q->head = 0;
	return 0;
}

struct rdmax_event *client_evq_push(struct client_evq *q)
{
	struct rdmax_event *e = &q->ev[(q->head + q->len) & (q->cap - 1)];
	q->len++;
	memset(e, 0, sizeof(*e));
	return e;
}

struct rdmax_event *client_evq_at(const struct client_evq *q, size_t i)
{
	return &q->ev[(q->head + i) & (q->cap - 1)];
}

void client_evq_remove(struct client_evq *q, size_t i, struct rdmax_event *ret_event)
{
	size_t mask = q->cap - 1;

	*ret_event = q->ev[(q->head + i) & mask];
	/* Close the gap from whichever end is nearer. */
	if (i < q->len / 2) {
		for (size_t k = i; k > 0; k--) {
			q->ev[(q->head + k) & mask] = q->ev[(q->head + k - 1) & mask];
		}
		q->head = (q->head + 1) & mask;
	} else {
		for (size_t k = i; k + 1 < q->len; k++) {
			q->ev[(q->head + k) & mask] = q->ev[(q->head + k + 1) & mask];
		}
	}
	q->len--;
	if (q->len == 0) {
		q->head = 0;
	}
}

size_t client_evq_pop(struct client_evq *q, struct rdmax_event *out, size_t max)
{
	size_t n = q->len < max ? q->len : max;

	for (size_t i = 0; i < n; i++) {
		out[i] = q->ev[(q->head + i) & (q->cap - 1)];
	}
	q->len -= n;
	q->head = q->len ? (q->head + n) & (q->cap - 1) : 0;
	return n;
}

static size_t job_hash(uint64_t job_id, size_t mask)
{
	/* Callers often use small sequential ids: mix the bits (splitmix64 finaliser). */
	uint64_t x = job_id;
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (size_t)x & mask;
}

static void jobs_insert(struct client_job_slot *slots, size_t cap, uint64_t job_id, uint64_t seq)
{
	size_t mask = cap - 1;
	size_t i = job_hash(job_id, mask);

	while (slots[i].seq != 0) {
		i = (i + 1) & mask;
	}
	slots[i].job_id = job_id;
	slots[i].seq = seq;
}

void client_jobs_free(struct client_jobs *s)
{
	if (!s) {
		return;
	}
	free(s->slots);
	s->slots = NULL;
	s->cap = 0;
	s->len = 0;
}

int client_jobs_reserve(struct client_jobs *s, size_t extra)
{
	if (extra > SIZE_MAX / 4 - s->len) {
		return -ENOMEM;
	}
	size_t need = s->len + extra;
	/* Keep the load at most one half so probe runs stay short. */
	if (need * 2 <= s->cap) {
		return 0;
	}
	size_t cap = grown_cap(s->cap, JOBS_MIN_CAP, need * 2, sizeof(*s->slots));
	if (cap == 0) {
		return -ENOMEM;
	}
	struct client_job_slot *slots = calloc(cap, sizeof(*slots));
	if (!slots) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->cap; i++) {
		if (s->slots[i].seq != 0) {
			jobs_insert(slots, cap, s->slots[i].job_id, s->slots[i].seq);
		}
	}
	free(s->slots);
	s->slots = slots;
	s->cap = cap;
	return 0;
}

void client_jobs_add(struct client_jobs *s, uint64_t job_id, uint64_t seq)
{
	jobs_insert(s->slots, s->cap, job_id, seq);
	s->len++;
}

static bool jobs_find(const struct client_jobs *s, uint64_t job_id, size_t *ret_index)
{
	if (s->len == 0) {
		return false;
	}
	size_t mask = s->cap - 1;
	for (size_t i = job_hash(job_id, mask); s->slots[i].seq != 0; i = (i + 1) & mask) {
		if (s->slots[i].job_id == job_id) {
			*ret_index = i;
			return true;
		}
	}
	return false;
}

bool client_jobs_has(const struct client_jobs *s, uint64_t job_id)
{
	size_t i;
	return jobs_find(s, job_id, &i);
}

bool client_jobs_take(struct client_jobs *s, uint64_t job_id, uint64_t *ret_seq)
{
	size_t mask = s->cap - 1;
	size_t hole;

	if (!jobs_find(s, job_id, &hole)) {
		return false;
	}
	*ret_seq = s->slots[hole].seq;
	/*
	 * Backward-shift deletion: pull later members of the probe run into
	 * the hole unless their home slot lies cyclically in (hole, j].
	 */
	for (size_t j = (hole + 1) & mask; s->slots[j].seq != 0; j = (j + 1) & mask) {
		size_t home = job_hash(s->slots[j].job_id, mask);
		if (((j - home) & mask) >= ((j - hole) & mask)) {
			s->slots[hole] = s->slots[j];
			hole = j;
		}
	}
	s->slots[hole].seq = 0;
	s->slots[hole].job_id = 0;
	s->len--;
	return true;
}

void client_copy_text(char *dst, size_t dst_size, const char *src)
{
	if (dst_size == 0) {
		return;
	}
	size_t n = src ? strnlen(src, dst_size) : 0;
	if (n == dst_size) {
		n = dst_size - 1;
		/* Back off over continuation bytes so no character is cut in half. */
		while (n > 0 && ((unsigned char)src[n] & 0xc0) == 0x80) {
			n--;
		}
	}
	if (n) {
		memcpy(dst, src, n);
	}
	dst[n] = '\0';
}

int client_err_from_status(int status)
{
	if (status == 0) {
		return 0;
	}
	/* Keep clear of -1100 and below (library-only codes such as DISCONNECTED). */
	if (status < 0 || status >= -RDMAX_E_DISCONNECTED - RDMAX_ERR_BASE) {
		return RDMAX_E_INTERNAL;
	}
	return -(RDMAX_ERR_BASE + status);
}
