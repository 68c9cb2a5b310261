/* SPDX-License-Identifier: MIT */
/*
 * The verbs side of GPU memory: what the verbs transport's region hooks call
 * for regions of a GPU kind and for pool slices. Executes gpu_mr_plan() on
 * one device through the verbs.h wrappers: a dma-buf MR, an MR over the
 * daemon's device pointer (nvidia_peermem), or the pool's shared MR.
 *
 * Owns no state and never decides policy (gpu.c does); calls rdma-core only
 * through verbs.h. Failures are logged here because only here are the
 * device and the kernel's errno both known.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "gpu.h"
#include "hca.h"
#include "log.h"
#include "rdmax.h"
#include "verbs.h"

/* What ibv_reg_dmabuf_mr() accepts besides the rights (verbs(7), ib_umem_dmabuf). */
#define DMABUF_ACCESS                                                                              \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |               \
	 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)

/* The named error for a failed GPU registration, and a hint for the log. */
static int gpu_reg_error(int err, bool dmabuf, const char **ret_hint)
{
	switch (-err) {
	case EOPNOTSUPP:
	case EPROTONOSUPPORT:
		*ret_hint = dmabuf ? " (this kernel or NIC driver cannot register dma-bufs)"
				   : " (the NIC driver cannot register peer memory)";
		return RDMAX_E_GPU_NO_DMABUF;
	case EFAULT:
		*ret_hint =
			dmabuf ? ""
			       : " (nvidia_peermem did not claim the GPU memory: is it loaded?)";
		return dmabuf ? RDMAX_E_GPU_NOT_EXPORTABLE : RDMAX_E_GPU_NO_DMABUF;
	case ENOMEM:
	case ENOSPC:
		*ret_hint = " (GPU BAR1 space exhausted, or the locked-memory limit: ulimit -l)";
		return RDMAX_E_GPU_TOO_LARGE;
	case EINVAL:
		*ret_hint = dmabuf ? " (the exporter refused the range: CUDA VMM memory?)" : "";
		return RDMAX_E_GPU_NOT_EXPORTABLE;
	default:
		*ret_hint = "";
		return err;
	}
}

int gpu_verbs_reg_mr(struct region *region, struct hca *hca, struct ibv_pd *pd, uint64_t iova,
		     int access, struct ibv_mr **ret_mr)
{
	struct gpu_mr_plan plan;
	const char *hint = "";
	struct ibv_mr *mr;
	int ret;

	ret = gpu_mr_plan(region, hca->index, hca->attr.max_mr_size, hca->dmabuf, iova, &plan);
	if (ret == RDMAX_E_GPU_TOO_LARGE) {
		log_warn("GPU region %" PRIu64 " of %" PRIu64 " bytes is larger than the "
			 "max_mr_size (%" PRIu64 " bytes) of device '%s'",
			 region->id, region->length, (uint64_t)hca->attr.max_mr_size, hca->name);
		return ret;
	}
	if (ret == RDMAX_E_GPU_NO_DMABUF) {
		log_warn("GPU region %" PRIu64 ": device '%s' cannot register dma-bufs", region->id,
			 hca->name);
		return ret;
	}
	if (ret < 0) {
		log_warn("GPU region %" PRIu64 " cannot be registered on '%s': %s", region->id,
			 hca->name, rdmax_strerror(ret));
		return ret;
	}
	switch (plan.how) {
	case GPU_MR_SHARED:
		*ret_mr = plan.shared;
		return 0;
	case GPU_MR_DMABUF:
		ret = verbs_reg_dmabuf_mr(pd, plan.offset, plan.length, iova, plan.fd,
					  access & DMABUF_ACCESS, &mr);
		if (ret < 0) {
			int err = gpu_reg_error(ret, true, &hint);
			log_warn("ibv_reg_dmabuf_mr() of GPU region %" PRIu64 " (%" PRIu64
				 " bytes at dma-buf offset %" PRIu64 ") on '%s' failed: %s%s",
				 region->id, plan.length, plan.offset, hca->name, strerror(-ret),
				 hint);
			return err;
		}
		break;
	case GPU_MR_ADDR:
		ret = verbs_reg_mr(pd, plan.addr, plan.length, iova, access, &mr);
		if (ret < 0) {
			int err = gpu_reg_error(ret, false, &hint);
			log_warn("ibv_reg_mr() of GPU region %" PRIu64 " (%" PRIu64
				 " bytes, peermem) on '%s' failed: %s%s",
				 region->id, plan.length, hca->name, strerror(-ret), hint);
			return err;
		}
		break;
	default:
		return RDMAX_E_INTERNAL;
	}
	*ret_mr = mr;
	return 0;
}

void gpu_verbs_dereg_mr(struct region *region, struct hca *hca, struct ibv_mr *mr)
{
	int ret;

	if (!mr || gpu_region_shares_mrs(region)) {
		return;
	}
	ret = verbs_dereg_mr(mr);
	if (ret < 0) {
		log_warn("ibv_dereg_mr() of GPU region %" PRIu64 " on '%s' failed: %s", region->id,
			 hca->name, strerror(-ret));
	}
}
