/* SPDX-License-Identifier: MIT */
/*
 * Traffic classes and the scheduler that shares the daemon's transfer
 * credits between them ([qos], docs/architecture.md "Traffic classes").
 * A pure data structure: it never issues anything itself. The engine asks
 * qos_pick() which waiting job gets the next chunk: deficit round robin
 * over the classes (quantum = weight * chunk bytes), round robin over the
 * clients (flows) inside a class, first come first served among the jobs of
 * one client in one class.
 */
#ifndef RDMAXD_QOS_H
#define RDMAXD_QOS_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"

/* A job's traffic class. Values match [qos] default_class in config.c. */
enum qos_class {
	QOS_LATENCY,   /* small, latency-sensitive transfers */
	QOS_BULK,      /* throughput transfers */
	QOS_CLASS_MAX, /* terminator */
};

/* "latency", "bulk"; "unknown" otherwise. */
const char *qos_class_name(int cls);
/*
 * The class of a protocol traffic_class value (0: `dflt`, 1: latency,
 * 2: bulk); -EINVAL for any other value.
 */
int qos_class_from_wire(uint32_t wire, enum qos_class dflt, enum qos_class *ret_cls);

/* The work one client has waiting in one class. */
struct qos_flow {
	struct list_node link;    /* in sched->active[cls] while it has waiters */
	struct list_node waiters; /* struct qos_waiter, first come first served */
	uint8_t cls;
};

/* Embedded in what waits (a job) for a credit. */
struct qos_waiter {
	struct list_node link;
	struct qos_flow *flow; /* NULL: not waiting */
};

struct qos_sched {
	struct list_node active[QOS_CLASS_MAX]; /* flows with waiters, in round-robin order */
	int64_t deficit[QOS_CLASS_MAX];    /* bytes the class may still be granted this round */
	uint32_t cur;                      /* the class being served */
	uint32_t n_waiting[QOS_CLASS_MAX]; /* waiters of each class */
	uint64_t picks[QOS_CLASS_MAX];     /* grants, for metrics and tests */
	uint64_t charged[QOS_CLASS_MAX];   /* bytes issued under grants */
};

void qos_sched_init(struct qos_sched *s);
void qos_flow_init(struct qos_flow *flow, enum qos_class cls);
void qos_waiter_init(struct qos_waiter *w);

/* w waits in flow (at the tail); nothing when it already waits. */
void qos_wait(struct qos_sched *s, struct qos_flow *flow, struct qos_waiter *w);
/* w stops waiting; nothing when it does not wait. */
void qos_unwait(struct qos_sched *s, struct qos_waiter *w);
static inline bool qos_waiting(const struct qos_waiter *w)
{
	return w->flow != NULL;
}

/*
 * The waiter that gets the next credit among the classes whose bit is set
 * in `eligible` (bit 1 << class), or NULL when none of them has a waiter.
 * Its flow moves to the tail of its class (round robin over clients); the
 * waiter stays waiting: the caller unwaits it and charges what it issued.
 * weight[] >= 1, quantum > 0 bytes (the chunk size).
 */
struct qos_waiter *qos_pick(struct qos_sched *s, const uint32_t weight[QOS_CLASS_MAX],
			    uint64_t quantum, unsigned eligible);
/* A granted waiter of class cls issued bytes. */
void qos_charge(struct qos_sched *s, enum qos_class cls, uint64_t bytes);

#endif
