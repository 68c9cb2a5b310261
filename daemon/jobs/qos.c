/* SPDX-License-Identifier: MIT */
/*
 * The traffic-class scheduler: which waiting job gets the next transfer
 * credit. Deficit round robin over the classes, so that while both have
 * work waiting each class gets bytes in proportion to its weight and none
 * starves (every weight is at least 1); round robin over the clients of a
 * class, so that a client marking everything `latency` gets only its share
 * among the latency clients. Owns no memory and never calls back: flows
 * and waiters are embedded in the engine's clients and jobs.
 */
#include "qos.h"

#include <errno.h>
#include <stddef.h>

static const char *const g_class_names[QOS_CLASS_MAX] = {
	[QOS_LATENCY] = "latency",
	[QOS_BULK] = "bulk",
};

const char *qos_class_name(int cls)
{
	return cls >= 0 && cls < QOS_CLASS_MAX ? g_class_names[cls] : "unknown";
}

int qos_class_from_wire(uint32_t wire, enum qos_class dflt, enum qos_class *ret_cls)
{
	switch (wire) {
	case 0:
		*ret_cls = dflt;
		return 0;
	case 1:
		*ret_cls = QOS_LATENCY;
		return 0;
	case 2:
		*ret_cls = QOS_BULK;
		return 0;
	default:
		return -EINVAL;
	}
}

void qos_sched_init(struct qos_sched *s)
{
	for (int c = 0; c < QOS_CLASS_MAX; c++) {
		list_init(&s->active[c]);
		s->deficit[c] = 0;
		s->n_waiting[c] = 0;
		s->picks[c] = 0;
		s->charged[c] = 0;
	}
	s->cur = 0;
}

void qos_flow_init(struct qos_flow *flow, enum qos_class cls)
{
	list_init(&flow->link);
	list_init(&flow->waiters);
	flow->cls = (uint8_t)cls;
}

void qos_waiter_init(struct qos_waiter *w)
{
	list_init(&w->link);
	w->flow = NULL;
}

void qos_wait(struct qos_sched *s, struct qos_flow *flow, struct qos_waiter *w)
{
	if (w->flow) {
		return;
	}
	if (list_empty(&flow->waiters)) {
		list_add_tail(&s->active[flow->cls], &flow->link);
	}
	list_add_tail(&flow->waiters, &w->link);
	w->flow = flow;
	s->n_waiting[flow->cls]++;
}

void qos_unwait(struct qos_sched *s, struct qos_waiter *w)
{
	struct qos_flow *flow = w->flow;

	if (!flow) {
		return;
	}
	list_del(&w->link);
	w->flow = NULL;
	s->n_waiting[flow->cls]--;
	if (list_empty(&flow->waiters)) {
		list_del(&flow->link);
	}
}

static bool serves(const struct qos_sched *s, uint32_t c, unsigned eligible)
{
	return (eligible & (1u << c)) && !list_empty(&s->active[c]);
}

struct qos_waiter *qos_pick(struct qos_sched *s, const uint32_t weight[QOS_CLASS_MAX],
			    uint64_t quantum, unsigned eligible)
{
	bool any = false;

	for (uint32_t c = 0; c < QOS_CLASS_MAX; c++) {
		if (list_empty(&s->active[c])) {
			s->deficit[c] = 0; /* an idle class saves no credit for later */
		}
		any = any || serves(s, c, eligible);
	}
	if (!any) {
		return NULL;
	}
	/*
	 * A class keeps the turn while it has deficit left; then the next class
	 * with work gets its quantum. A charge never exceeds one chunk, so one
	 * quantum (weight >= 1 chunk) always brings a class back above zero: at
	 * most one full turn of the classes before a pick.
	 */
	for (uint32_t turns = 0; turns <= 2 * QOS_CLASS_MAX; turns++) {
		uint32_t c = s->cur;
		if (serves(s, c, eligible) && s->deficit[c] > 0) {
			struct qos_flow *flow =
				container_of(s->active[c].next, struct qos_flow, link);
			struct qos_waiter *w =
				container_of(flow->waiters.next, struct qos_waiter, link);
			list_del(&flow->link);
			list_add_tail(&s->active[c], &flow->link);
			s->picks[c]++;
			return w;
		}
		s->cur = (c + 1) % QOS_CLASS_MAX;
		if (serves(s, s->cur, eligible)) {
			uint64_t q = (uint64_t)(weight[s->cur] ? weight[s->cur] : 1) * quantum;
			s->deficit[s->cur] += (int64_t)(q > INT64_MAX / 4 ? INT64_MAX / 4 : q);
		}
	}
	/* Only after charges larger than a quantum: serve the current class anyway. */
	for (uint32_t c = 0; c < QOS_CLASS_MAX; c++) {
		if (serves(s, c, eligible)) {
			s->cur = c;
			s->deficit[c] = 1;
			return qos_pick(s, weight, quantum, 1u << c);
		}
	}
	return NULL;
}

void qos_charge(struct qos_sched *s, enum qos_class cls, uint64_t bytes)
{
	if ((unsigned)cls >= QOS_CLASS_MAX) {
		return;
	}
	s->deficit[cls] -= (int64_t)(bytes > INT64_MAX / 4 ? INT64_MAX / 4 : bytes);
	s->charged[cls] += bytes;
}
