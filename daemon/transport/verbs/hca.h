/* SPDX-License-Identifier: MIT */
/*
 * RDMA devices (HCAs) the verbs transport uses: per device one protection
 * domain, one completion queue shared by every QP of the device (with a
 * completion channel on the loop), one shared receive queue whose receives
 * WRITE_WITH_IMM and two-sided SENDs (message frames) consume, each with its
 * own registered buffer, async events and port state. The module has no
 * policy: completions and events go to the callbacks its user installs.
 */
#ifndef RDMAXD_HCA_H
#define RDMAXD_HCA_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "log.h"
#include "region.h"
#include "verbs.h"

/* wr_id of an SRQ receive: this bit plus its buffer's index; send WRs never set it. */
#define HCA_RECV_TAG (UINT64_C(1) << 63)
/* Bytes of each receive buffer: the largest SEND a peer may post to us. */
#define HCA_RECV_BYTES 4096
#define HCA_MAX_PORTS  8
/* Largest CQ asked for; devices with less get their maximum. */
#define HCA_CQ_MAX 65536
/* Receives kept posted on each SRQ. */
#define HCA_SRQ_DEPTH 1024

struct hca;

struct hca_callbacks {
	/* A send-queue completion (success or error). */
	void (*send_wc)(void *ctx, struct hca *hca, const struct ibv_wc *wc);
	/* A WRITE_WITH_IMM landed carrying imm (host order). */
	void (*imm)(void *ctx, struct hca *hca, uint32_t imm);
	/*
	 * A SEND of len (<= HCA_RECV_BYTES) bytes landed on QP qp_num; buf is
	 * reposted after the call returns.
	 */
	void (*recv)(void *ctx, struct hca *hca, uint32_t qp_num, const uint8_t *buf, uint32_t len);
	/* An async event about a QP (qp_num) or the whole device (qp_num 0). */
	void (*async)(void *ctx, struct hca *hca, enum ibv_event_type type, uint32_t qp_num);
	/* Called after a batch of the above from a loop callback. */
	void (*progress)(void *ctx);
	void *ctx;
};

/* Vendor ids of the kernel's software devices (Soft-RoCE, soft-iWARP). */
#define HCA_VENDOR_RXE 0xffffffu
#define HCA_VENDOR_SIW 0x626d74u /* "bmt" */

struct hca_table;

struct hca {
	uint32_t index;          /* position in the table; index of region->transport_data */
	char name[32];           /* device name, e.g. "mlx5_0" */
	struct ibv_context *ctx; /* librdmacm's context, the one its ids report */
	struct ibv_device_attr attr;
	uint8_t n_ports;
	enum ibv_port_state port_state[HCA_MAX_PORTS + 1]; /* by port number */
	uint64_t max_msg_sz; /* largest message of one WR (smallest over the ports) */
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	uint32_t cq_size;     /* CQEs the CQ holds */
	uint32_t cq_reserved; /* CQEs promised to the SRQ and to QPs */
	struct ibv_srq *srq;
	uint32_t srq_depth;
	uint32_t srq_posted; /* receives currently on the SRQ */
	uint8_t *recv_buf;   /* srq_depth buffers of HCA_RECV_BYTES */
	struct ibv_mr *recv_mr;
	uint32_t *recv_free; /* indices of buffers not on the SRQ */
	uint32_t n_recv_free;
	uint32_t cq_events; /* notifications not yet acked */
	bool armed;         /* the CQ will notify its next completion */
	bool backlog;       /* the last poll stopped at its budget */
	bool dead;          /* fatal device, CQ or SRQ error: no new work */
	bool dmabuf;        /* ibv_reg_dmabuf_mr() works here */
	/*
	 * The kernel does the NIC's work (rxe, siw): a post call runs the QP's
	 * protocol processing, and can take milliseconds under load.
	 */
	bool software;
	uv_poll_t comp_poll;
	uv_poll_t async_poll;
	uint32_t open_handles; /* loop handles not yet closed */
	bool closing;          /* hca_table_close() started closing them */
	struct hca_table *table;
	uint64_t n_wc;   /* completions seen */
	uint64_t n_imm;  /* immediates landed */
	uint64_t n_recv; /* SENDs received */
};

struct hca_table {
	uv_loop_t *loop;
	struct hca_callbacks cb;
	struct hca *hcas[REGION_MAX_DEVICES];
	uint32_t n;
	uint32_t handles; /* libuv handles of all devices not yet closed */
	bool busy;        /* the user busy-polls: completion events need no re-arm */
	uint64_t *events; /* where completion events are counted (NULL: nowhere) */
	struct log_ratelimit rl;
};

void hca_table_init(struct hca_table *table, uv_loop_t *loop, const struct hca_callbacks *cb);

/*
 * Set up a device for the transport: PD, completion channel, CQ, SRQ (filled
 * with receives), async event fd, and loop handles for both fds.
 * \return 0, -ENODEV when no port is active or the device lacks an SRQ,
 *         RDMAX_E_RESOURCE_EXHAUSTED when the table is full, or -errno
 */
int hca_open(struct hca_table *table, struct ibv_context *ctx, struct hca **ret_hca);

/* The table's device for an rdma_cm id's context, or NULL. */
struct hca *hca_find(struct hca_table *table, const struct ibv_context *ctx);

/*
 * Poll the CQ for at most budget completions and hand them to the callbacks;
 * refills the SRQ with the buffers they released. Returns the number handled (hca->backlog tells
 * whether the budget ran out).
 */
int hca_poll(struct hca *hca, int budget);

/*
 * Arm the CQ when it is not armed, then poll again (a completion that came
 * before the arm raises no event). For the user that stops busy-polling.
 */
void hca_arm(struct hca *hca);

/* Promise n CQEs of the CQ to a new QP; RDMAX_E_RESOURCE_EXHAUSTED when full. */
int hca_reserve_cqes(struct hca *hca, uint32_t n);
void hca_release_cqes(struct hca *hca, uint32_t n);

/* True when some port of the device is ACTIVE and the device is usable. */
bool hca_usable(const struct hca *hca);

/* True when `name` is selected by the [verbs] devices value ("auto" or a list). */
bool hca_selected(const char *devices, const char *name);

/* Close the loop handles (the table's handles count drops to 0 when done). */
void hca_table_close(struct hca_table *table);

/* Free every verbs resource; only after the handles closed and all QPs are gone. */
void hca_table_free(struct hca_table *table);

#endif
