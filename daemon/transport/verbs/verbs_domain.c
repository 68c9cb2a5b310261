/* SPDX-License-Identifier: MIT */
/*
 * Protection domains per local uid ([verbs] isolation = per-uid): a domain
 * is a uid's set of PDs, one per device, allocated when the device first
 * needs it, with a number (1..DESC_DOMAIN_MAX, never two alive at once) and
 * a random token that the descriptors of its regions carry. Regions of the
 * uid are registered in its PDs, and queue pairs that serve them (outgoing
 * links of its clients' jobs, accepted QPs whose requester proved the token)
 * are created in them, so the NIC refuses an rkey of one uid on another's
 * QPs. A domain lives while regions or QPs hold it; then its PDs are freed
 * and a later region of the uid gets a new number and token. The number of
 * domains is bounded by [limits] max_isolation_domains. Nothing here decides
 * about connections; with isolation = shared there are no domains at all.
 */
#include "transport_verbs_internal.h"

int vt_domains_init(struct verbs_transport *vt)
{
	int ret;

	vt->per_uid = vt->daemon->cfg.isolation == CONFIG_ISOLATION_PER_UID;
	vt->next_domain = 1;
	if ((ret = hmap_init(&vt->domains_by_uid, 16)) < 0) {
		return ret;
	}
	if ((ret = hmap_init(&vt->domains_by_number, 16)) < 0) {
		hmap_fini(&vt->domains_by_uid);
		return ret;
	}
	return 0;
}

static void domain_free(struct verbs_transport *vt, struct vt_domain *dom)
{
	for (uint32_t i = 0; i < REGION_MAX_DEVICES; i++) {
		if (!dom->pd[i]) {
			continue;
		}
		int ret = verbs_dealloc_pd(dom->pd[i]);
		if (ret < 0) {
			log_warn("ibv_dealloc_pd() of the protection domain of uid %u failed: %s",
				 dom->uid, strerror(-ret));
		}
	}
	hmap_del(&vt->domains_by_uid, (uint64_t)dom->uid + 1);
	hmap_del(&vt->domains_by_number, dom->number);
	vt->n_domains--;
	free(dom);
}

void vt_domains_fini(struct verbs_transport *vt)
{
	struct vt_domain *dom;
	size_t iter = 0;

	/* Whatever still holds a domain is gone with the transport. */
	while (hmap_next(&vt->domains_by_number, &iter, NULL, (void **)&dom)) {
		domain_free(vt, dom);
		iter = 0;
	}
	hmap_fini(&vt->domains_by_uid);
	hmap_fini(&vt->domains_by_number);
}

struct vt_domain *vt_domain_find(struct verbs_transport *vt, uint32_t number)
{
	return number ? hmap_get(&vt->domains_by_number, number) : NULL;
}

struct vt_domain *vt_domain_of_uid(struct verbs_transport *vt, uint32_t uid)
{
	return vt->per_uid ? hmap_get(&vt->domains_by_uid, (uint64_t)uid + 1) : NULL;
}

int vt_domain_hold_uid(struct verbs_transport *vt, uint32_t uid, struct vt_domain **ret_dom)
{
	struct vt_domain *dom = vt_domain_of_uid(vt, uid);
	int ret;

	if (dom) {
		dom->refs++;
		*ret_dom = dom;
		return 0;
	}
	if (vt->n_domains >= vt->daemon->cfg.max_isolation_domains) {
		log_ratelimited(&vt->rl, LOG_WARNING,
				"no protection domain for uid %u: %u uids have regions registered "
				"([limits] max_isolation_domains)",
				uid, vt->n_domains);
		return RDMAX_E_RESOURCE_EXHAUSTED;
	}
	dom = calloc(1, sizeof(*dom));
	if (!dom) {
		return -ENOMEM;
	}
	/* A number not in use; the bound above keeps this loop short. */
	while (vt->next_domain == 0 || vt->next_domain > DESC_DOMAIN_MAX ||
	       vt_domain_find(vt, vt->next_domain)) {
		vt->next_domain = vt->next_domain >= DESC_DOMAIN_MAX ? 1 : vt->next_domain + 1;
	}
	dom->number = vt->next_domain++;
	dom->uid = uid;
	do {
		dom->token = random_u64();
	} while (dom->token == 0);
	dom->refs = 1;
	if ((ret = hmap_put(&vt->domains_by_uid, (uint64_t)uid + 1, dom)) < 0) {
		free(dom);
		return ret;
	}
	if ((ret = hmap_put(&vt->domains_by_number, dom->number, dom)) < 0) {
		hmap_del(&vt->domains_by_uid, (uint64_t)uid + 1);
		free(dom);
		return ret;
	}
	vt->n_domains++;
	log_info("protection domain %u for uid %u", dom->number, uid);
	*ret_dom = dom;
	return 0;
}

void vt_domain_hold(struct vt_domain *dom)
{
	dom->refs++;
}

void vt_domain_put(struct verbs_transport *vt, struct vt_domain *dom)
{
	if (!dom || --dom->refs > 0) {
		return;
	}
	log_info("protection domain %u of uid %u released", dom->number, dom->uid);
	domain_free(vt, dom);
}

int vt_domain_pd(struct vt_domain *dom, struct hca *hca, struct ibv_pd **ret_pd)
{
	if (!dom) {
		*ret_pd = hca->pd;
		return 0;
	}
	if (!dom->pd[hca->index]) {
		int ret = verbs_alloc_pd(hca->ctx, &dom->pd[hca->index]);
		if (ret < 0) {
			log_warn("ibv_alloc_pd() on '%s' for uid %u failed: %s", hca->name,
				 dom->uid, strerror(-ret));
			return ret;
		}
	}
	*ret_pd = dom->pd[hca->index];
	return 0;
}

struct vt_domain *vt_region_domain(struct verbs_transport *vt, const struct region *region,
				   const struct hca *hca)
{
	struct vt_domain *dom = region ? vt_domain_of_uid(vt, region->uid) : NULL;
	const struct ibv_mr *mr = region ? region->transport_data[hca->index] : NULL;

	/* A pool slice keeps its pool's MR, in the device's shared PD. */
	return dom && mr && mr->pd == dom->pd[hca->index] ? dom : NULL;
}
