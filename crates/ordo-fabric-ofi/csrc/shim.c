/* The C side of ordo's libfabric backend: every libfabric call ordo makes,
 * as plain functions over one opaque handle, so the Rust side declares a
 * dozen functions and no libfabric struct. libfabric's own API is mostly
 * `static inline` wrappers around provider ops tables, which Rust cannot
 * call; compiling them here against the system's headers (found by
 * pkg-config) keeps the bindings correct for the installed version.
 *
 * One handle = one member's endpoint: fabric, domain, one completion queue
 * (context format, selective completion), the member's whole region
 * registered for remote writes, and either one reliable-datagram endpoint
 * with an address vector (FI_EP_RDM) or a passive endpoint, an event queue
 * and one connected endpoint per connection (FI_EP_MSG). Callers
 * serialise every call on one handle (the Rust side holds a mutex), so the
 * domain is opened with FI_THREAD_DOMAIN.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ORDO_OFI_MAX_EPS 1024

struct ordo_ofi {
	int msg; /* connected endpoints (FI_EP_MSG): pep + one ep per connection */
	struct fid_eq *eq;
	struct fid_pep *pep;
	struct fid_ep *eps[ORDO_OFI_MAX_EPS];
	/* Send endpoints (RDM) have their own completion queue: reading it is
	 * what drives that endpoint's progress (shm). */
	struct fid_cq *scq[ORDO_OFI_MAX_EPS];
	size_t nscq; /* slots below this may hold one */
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fid_mr *mr;
	void *base;
	size_t len;
	void *desc;
	uint64_t key;
	/* The staging buffer writes are sent from (bytes captured at post). */
	struct fid_mr *smr;
	void *sbase;
	size_t slen;
	void *sdesc;
	int cq_fd; /* the completion queue's wait fd, or -1 */
};

/* What the provider promised, for the Rust side to decide on fences. */
struct ordo_ofi_attr {
	uint64_t tx_msg_order;
	uint64_t max_order_waw_size;
	uint64_t max_msg_size;
	uint64_t inject_size;
	uint64_t tx_size;
	uint64_t mr_mode;
	uint64_t data_progress_manual;
	uint64_t key;
	uint64_t cq_data_size;
	char prov_name[64];
	char fabric_name[64];
};

/* One completion: the context ordo posted with, or an error; `remote`:
 * a peer's write carrying remote CQ data landed here (the doorbell). */
struct ordo_ofi_comp {
	uint64_t context;
	int32_t err;  /* 0, or a positive FI_E* / errno */
	int32_t prov_errno;
	uint64_t remote;
	uint64_t data;
};

static void set_err(char *err, size_t errlen, const char *what, int ret) {
	if (err && errlen)
		snprintf(err, errlen, "%s: %s (%d)", what, fi_strerror(ret < 0 ? -ret : ret), ret);
}

void ordo_ofi_close(struct ordo_ofi *o) {
	if (!o)
		return;
	for (int i = 0; i < ORDO_OFI_MAX_EPS; i++) {
		if (o->eps[i])
			fi_close(&o->eps[i]->fid);
		if (o->scq[i])
			fi_close(&o->scq[i]->fid);
	}
	if (o->pep)
		fi_close(&o->pep->fid);
	if (o->ep)
		fi_close(&o->ep->fid);
	if (o->mr)
		fi_close(&o->mr->fid);
	if (o->smr)
		fi_close(&o->smr->fid);
	if (o->cq)
		fi_close(&o->cq->fid);
	if (o->av)
		fi_close(&o->av->fid);
	if (o->domain)
		fi_close(&o->domain->fid);
	if (o->eq)
		fi_close(&o->eq->fid);
	if (o->fabric)
		fi_close(&o->fabric->fid);
	if (o->info)
		fi_freeinfo(o->info);
	free(o);
}

/* Opens an RDM endpoint of provider `prov` (e.g. "tcp;ofi_rxm", "shm",
 * "verbs;ofi_rxm") and registers [base, base+len) for remote writes with
 * `requested_key` (ignored where the provider picks keys). Returns 0 or a
 * negative FI_E* code with a message in `err`. */
int ordo_ofi_open(const char *prov, int msg, const char *node, void *base, size_t len,
		  void *sbase, size_t slen, uint64_t requested_key, struct ordo_ofi **out,
		  struct ordo_ofi_attr *attr, char *err, size_t errlen) {
	struct fi_info *hints = fi_allocinfo();
	struct ordo_ofi *o = calloc(1, sizeof(*o));
	int ret;
	*out = NULL;
	if (!hints || !o) {
		set_err(err, errlen, "out of memory", -FI_ENOMEM);
		fi_freeinfo(hints);
		free(o);
		return -FI_ENOMEM;
	}
	hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
	hints->mode = 0;
	o->msg = msg;
	hints->ep_attr->type = msg ? FI_EP_MSG : FI_EP_RDM;
	/* Connected endpoints share the domain's registration; binding it to
	 * every endpoint (FI_MR_ENDPOINT) is supported for RDM only. */
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
				      (msg ? 0 : FI_MR_ENDPOINT);
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->fabric_attr->prov_name = strdup(prov);
	ret = fi_getinfo(FI_VERSION(1, 17), node && *node ? node : NULL, NULL,
			 node && *node ? FI_SOURCE : 0, hints, &o->info);
	fi_freeinfo(hints);
	if (ret) {
		set_err(err, errlen, "fi_getinfo", ret);
		goto fail;
	}
	ret = fi_fabric(o->info->fabric_attr, &o->fabric, NULL);
	if (ret) { set_err(err, errlen, "fi_fabric", ret); goto fail; }
	ret = fi_domain(o->fabric, o->info, &o->domain, NULL);
	if (ret) { set_err(err, errlen, "fi_domain", ret); goto fail; }
	if (msg) {
		struct fi_eq_attr eq_attr = { .size = 256, .wait_obj = FI_WAIT_NONE };
		ret = fi_eq_open(o->fabric, &eq_attr, &o->eq, NULL);
		if (ret) { set_err(err, errlen, "fi_eq_open", ret); goto fail; }
	} else {
		struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
		ret = fi_av_open(o->domain, &av_attr, &o->av, NULL);
		if (ret) {
			av_attr.type = FI_AV_MAP;
			ret = fi_av_open(o->domain, &av_attr, &o->av, NULL);
		}
		if (ret) { set_err(err, errlen, "fi_av_open", ret); goto fail; }
	}
	/* A completion queue with a wait fd where the provider has one (the
	 * progress agent blocks on it when idle), else a polled one. */
	o->cq_fd = -1;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD,
				      .size = o->info->tx_attr->size * 2 };
	ret = fi_cq_open(o->domain, &cq_attr, &o->cq, NULL);
	if (!ret && fi_control(&o->cq->fid, FI_GETWAIT, &o->cq_fd)) {
		fi_close(&o->cq->fid);
		o->cq = NULL;
		o->cq_fd = -1;
		ret = -FI_ENOSYS;
	}
	if (ret) {
		o->cq_fd = -1;
		cq_attr.wait_obj = FI_WAIT_NONE;
		ret = fi_cq_open(o->domain, &cq_attr, &o->cq, NULL);
	}
	if (ret) { set_err(err, errlen, "fi_cq_open", ret); goto fail; }
	if (msg) {
		ret = fi_mr_reg(o->domain, base, len, FI_WRITE | FI_REMOTE_WRITE, 0, requested_key, 0, &o->mr, NULL);
		if (ret) { set_err(err, errlen, "fi_mr_reg", ret); goto fail; }
		ret = fi_passive_ep(o->fabric, o->info, &o->pep, NULL);
		if (ret) { set_err(err, errlen, "fi_passive_ep", ret); goto fail; }
		ret = fi_pep_bind(o->pep, &o->eq->fid, 0);
		if (ret) { set_err(err, errlen, "fi_pep_bind", ret); goto fail; }
		ret = fi_listen(o->pep);
		if (ret) { set_err(err, errlen, "fi_listen", ret); goto fail; }
		goto registered;
	}
	ret = fi_endpoint(o->domain, o->info, &o->ep, NULL);
	if (ret) { set_err(err, errlen, "fi_endpoint", ret); goto fail; }
	ret = fi_ep_bind(o->ep, &o->av->fid, 0);
	if (ret) { set_err(err, errlen, "fi_ep_bind(av)", ret); goto fail; }
	ret = fi_ep_bind(o->ep, &o->cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION);
	if (ret) { set_err(err, errlen, "fi_ep_bind(cq)", ret); goto fail; }
	ret = fi_mr_reg(o->domain, base, len, FI_WRITE | FI_REMOTE_WRITE, 0, requested_key, 0, &o->mr, NULL);
	if (ret) { set_err(err, errlen, "fi_mr_reg", ret); goto fail; }
	if (o->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		ret = fi_mr_bind(o->mr, &o->ep->fid, 0);
		if (ret) { set_err(err, errlen, "fi_mr_bind", ret); goto fail; }
		ret = fi_mr_enable(o->mr);
		if (ret) { set_err(err, errlen, "fi_mr_enable", ret); goto fail; }
	}
	ret = fi_enable(o->ep);
	if (ret) { set_err(err, errlen, "fi_enable", ret); goto fail; }
registered:
	/* The staging buffer: local source of writes only (no remote access). */
	ret = fi_mr_reg(o->domain, sbase, slen, FI_WRITE, 0, requested_key ^ 1, 0, &o->smr, NULL);
	if (ret) { set_err(err, errlen, "fi_mr_reg(staging)", ret); goto fail; }
	if (!msg && (o->info->domain_attr->mr_mode & FI_MR_ENDPOINT)) {
		ret = fi_mr_bind(o->smr, &o->ep->fid, 0);
		if (ret) { set_err(err, errlen, "fi_mr_bind(staging)", ret); goto fail; }
		ret = fi_mr_enable(o->smr);
		if (ret) { set_err(err, errlen, "fi_mr_enable(staging)", ret); goto fail; }
	}
	o->sbase = sbase;
	o->slen = slen;
	o->sdesc = fi_mr_desc(o->smr);
	o->base = base;
	o->len = len;
	o->desc = fi_mr_desc(o->mr);
	o->key = fi_mr_key(o->mr);
	if (o->key == FI_KEY_NOTAVAIL) {
		set_err(err, errlen, "fi_mr_key (raw keys are not supported)", -FI_ENOSYS);
		ret = -FI_ENOSYS;
		goto fail;
	}
	memset(attr, 0, sizeof(*attr));
	attr->tx_msg_order = o->info->tx_attr->msg_order;
	attr->max_order_waw_size = o->info->ep_attr->max_order_waw_size;
	attr->max_msg_size = o->info->ep_attr->max_msg_size;
	attr->inject_size = o->info->tx_attr->inject_size;
	attr->tx_size = o->info->tx_attr->size;
	attr->mr_mode = (uint64_t)o->info->domain_attr->mr_mode;
	attr->data_progress_manual = o->info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
	attr->key = o->key;
	attr->cq_data_size = o->info->domain_attr->cq_data_size;
	snprintf(attr->prov_name, sizeof(attr->prov_name), "%s",
		 o->info->fabric_attr->prov_name ? o->info->fabric_attr->prov_name : "");
	snprintf(attr->fabric_name, sizeof(attr->fabric_name), "%s",
		 o->info->fabric_attr->name ? o->info->fabric_attr->name : "");
	*out = o;
	return 0;
fail:
	ordo_ofi_close(o);
	return ret ? ret : -FI_EOTHER;
}

/* The endpoint's address (connected endpoints: the passive endpoint's,
 * which peers connect to), to hand to peers. */
int ordo_ofi_name(struct ordo_ofi *o, void *addr, size_t *len) {
	return fi_getname(o->msg ? &o->pep->fid : &o->ep->fid, addr, len);
}

/* ---- connected endpoints (FI_EP_MSG) ----
 * Slots name endpoints: the caller picks a free slot (< ORDO_OFI_MAX_EPS)
 * for each connection it dials or accepts; an endpoint's fid context is
 * slot + 1, which is how connection events name it. */

static int msg_ep(struct ordo_ofi *o, struct fi_info *info, size_t slot) {
	struct fid_ep *ep;
	int ret;
	if (slot >= ORDO_OFI_MAX_EPS || o->eps[slot])
		return -FI_EINVAL;
	ret = fi_endpoint(o->domain, info, &ep, (void *)(uintptr_t)(slot + 1));
	if (ret)
		return ret;
	if ((ret = fi_ep_bind(ep, &o->eq->fid, 0)) ||
	    (ret = fi_ep_bind(ep, &o->cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) ||
	    (ret = fi_enable(ep))) {
		fi_close(&ep->fid);
		return ret;
	}
	o->eps[slot] = ep;
	return 0;
}

/* Starts connecting slot `slot` to the passive endpoint at `addr`,
 * carrying `param` (the connection request's private data). */
int ordo_ofi_msg_connect(struct ordo_ofi *o, size_t slot, const void *addr, size_t addrlen,
			 const void *param, size_t paramlen) {
	struct fi_info *hints = fi_dupinfo(o->info), *info = NULL;
	int ret;
	if (!hints)
		return -FI_ENOMEM;
	free(hints->dest_addr);
	hints->dest_addr = malloc(addrlen);
	if (!hints->dest_addr) {
		fi_freeinfo(hints);
		return -FI_ENOMEM;
	}
	memcpy(hints->dest_addr, addr, addrlen);
	hints->dest_addrlen = addrlen;
	free(hints->src_addr);
	hints->src_addr = NULL;
	hints->src_addrlen = 0;
	ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	fi_freeinfo(hints);
	if (ret)
		return ret;
	ret = msg_ep(o, info, slot);
	if (!ret) {
		ret = fi_connect(o->eps[slot], addr, param, paramlen);
		if (ret) {
			fi_close(&o->eps[slot]->fid);
			o->eps[slot] = NULL;
		}
	}
	fi_freeinfo(info);
	return ret;
}

/* A connection event. */
struct ordo_ofi_cm {
	int32_t kind; /* 1 connection request, 2 connected, 3 shut down, 4 error */
	int32_t err;
	uint64_t slot; /* 2-4: the endpoint's slot (or ~0 if not an endpoint's) */
	void *request; /* 1: accept or reject it (either frees it) */
	uint32_t param_len;
	uint8_t param[64];
};

/* Reads one connection event: 1 if one was read, 0 if none, < 0 on error. */
int ordo_ofi_msg_event(struct ordo_ofi *o, struct ordo_ofi_cm *out) {
	union {
		struct fi_eq_cm_entry cm;
		uint8_t bytes[sizeof(struct fi_eq_cm_entry) + 256];
	} buf;
	uint32_t event = 0;
	memset(out, 0, sizeof(*out));
	ssize_t n = fi_eq_read(o->eq, &event, &buf, sizeof(buf), 0);
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry e;
		memset(&e, 0, sizeof(e));
		if (fi_eq_readerr(o->eq, &e, 0) < 0)
			return -FI_EOTHER;
		out->kind = 4;
		out->err = e.err ? e.err : FI_EOTHER;
		out->slot = e.fid && e.fid != &o->pep->fid ? (uint64_t)(uintptr_t)e.fid->context - 1 : ~0ULL;
		if (e.fid == &o->pep->fid)
			out->slot = ~0ULL;
		return 1;
	}
	if (n < 0)
		return (int)n;
	if (event == FI_CONNREQ) {
		out->kind = 1;
		out->request = buf.cm.info;
		size_t plen = (size_t)n > sizeof(struct fi_eq_cm_entry) ? (size_t)n - sizeof(struct fi_eq_cm_entry) : 0;
		if (plen > sizeof(out->param))
			plen = sizeof(out->param);
		memcpy(out->param, buf.cm.data, plen);
		out->param_len = (uint32_t)plen;
		return 1;
	}
	if (event == FI_CONNECTED || event == FI_SHUTDOWN) {
		out->kind = event == FI_CONNECTED ? 2 : 3;
		out->slot = buf.cm.fid && buf.cm.fid->context ? (uint64_t)(uintptr_t)buf.cm.fid->context - 1 : ~0ULL;
		return 1;
	}
	return 0; /* other events: ignored */
}

/* Accepts a connection request on slot `slot` (frees the request). */
int ordo_ofi_msg_accept(struct ordo_ofi *o, void *request, size_t slot) {
	struct fi_info *info = request;
	int ret = msg_ep(o, info, slot);
	if (!ret) {
		ret = fi_accept(o->eps[slot], NULL, 0);
		if (ret) {
			fi_close(&o->eps[slot]->fid);
			o->eps[slot] = NULL;
		}
	} else {
		fi_reject(o->pep, info->handle, NULL, 0);
	}
	fi_freeinfo(info);
	return ret;
}

/* Rejects a connection request (frees it). */
void ordo_ofi_msg_reject(struct ordo_ofi *o, void *request) {
	struct fi_info *info = request;
	fi_reject(o->pep, info->handle, NULL, 0);
	fi_freeinfo(info);
}

/* Reliable datagrams: a send endpoint in `slot` (bound to the shared
 * address vector and completion queue) for the writes to one peer, so a
 * provider that reports an endpoint's completions in order (shm) cannot
 * let one dead peer hold back the completions of writes to the others.
 * -FI_ENOSYS where the registration must be bound per endpoint. */
int ordo_ofi_rdm_send_ep(struct ordo_ofi *o, size_t slot) {
	struct fid_ep *ep;
	int ret;
	if (o->msg || slot >= ORDO_OFI_MAX_EPS || o->eps[slot])
		return -FI_EINVAL;
	if (o->info->domain_attr->mr_mode & FI_MR_ENDPOINT)
		return -FI_ENOSYS;
	struct fid_cq *cq;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE,
				      .size = o->info->tx_attr->size * 2 };
	ret = fi_cq_open(o->domain, &cq_attr, &cq, NULL);
	if (ret)
		return ret;
	ret = fi_endpoint(o->domain, o->info, &ep, NULL);
	if (ret) {
		fi_close(&cq->fid);
		return ret;
	}
	if ((ret = fi_ep_bind(ep, &o->av->fid, 0)) ||
	    (ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) ||
	    (ret = fi_enable(ep))) {
		fi_close(&ep->fid);
		fi_close(&cq->fid);
		return ret;
	}
	o->eps[slot] = ep;
	o->scq[slot] = cq;
	if (slot + 1 > o->nscq)
		o->nscq = slot + 1;
	return 0;
}

/* Closes the endpoint in `slot`. */
void ordo_ofi_msg_close(struct ordo_ofi *o, size_t slot) {
	if (slot < ORDO_OFI_MAX_EPS && o->eps[slot]) {
		fi_close(&o->eps[slot]->fid);
		o->eps[slot] = NULL;
	}
	if (slot < ORDO_OFI_MAX_EPS && o->scq[slot]) {
		fi_close(&o->scq[slot]->fid);
		o->scq[slot] = NULL;
	}
}

/* Inserts a peer's address; its handle in *fi_addr. Returns 0 or < 0. */
int ordo_ofi_av_insert(struct ordo_ofi *o, const void *addr, uint64_t *fi_addr) {
	fi_addr_t a = FI_ADDR_UNSPEC;
	int ret = fi_av_insert(o->av, addr, 1, &a, 0, NULL);
	if (ret != 1)
		return ret < 0 ? ret : -FI_EINVAL;
	*fi_addr = a;
	return 0;
}

int ordo_ofi_av_remove(struct ordo_ofi *o, uint64_t fi_addr) {
	fi_addr_t a = fi_addr;
	return fi_av_remove(o->av, &a, 1, 0);
}

/* Writes [offset, offset+len) of the local region to `remote_addr` under
 * `key` at peer `dest`. `flags`: FI_COMPLETION, FI_DELIVERY_COMPLETE,
 * FI_INJECT as the caller decides. Returns 0, -FI_EAGAIN, or < 0. */
ssize_t ordo_ofi_write(struct ordo_ofi *o, int64_t via, int64_t staged, size_t offset, size_t len,
		       uint64_t dest, uint64_t remote_addr, uint64_t key, uint64_t context,
		       uint64_t flags, uint64_t data) {
	/* staged >= 0: the bytes were captured at that offset of the staging
	 * buffer; else they are sent from the region at `offset`. */
	struct iovec iov = { .iov_base = staged >= 0 ? (char *)o->sbase + staged : (char *)o->base + offset,
			     .iov_len = len };
	void *desc = staged >= 0 ? o->sdesc : o->desc;
	struct fi_rma_iov rma = { .addr = remote_addr, .len = len, .key = key };
	struct fi_msg_rma msg = {
		.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = o->msg ? FI_ADDR_UNSPEC : dest,
		.rma_iov = &rma, .rma_iov_count = 1, .context = (void *)(uintptr_t)context, .data = data,
	};
	struct fid_ep *ep = o->ep;
	if (!o->msg && via >= 0) {
		/* a peer's own send endpoint (RDM) */
		if (via >= ORDO_OFI_MAX_EPS || !o->eps[via])
			return -FI_ENOTCONN;
		ep = o->eps[via];
	}
	if (o->msg) {
		/* dest names the slot of the connection to write on */
		if (dest >= ORDO_OFI_MAX_EPS || !o->eps[dest])
			return -FI_ENOTCONN;
		ep = o->eps[dest];
	}
	return fi_writemsg(ep, &msg, flags);
}

static ssize_t poll_cq(struct fid_cq *cq, struct ordo_ofi_comp *out, size_t count) {
	struct fi_cq_data_entry entries[32];
	if (count > 32)
		count = 32;
	if (count == 0)
		return 0;
	ssize_t n = fi_cq_read(cq, entries, count);
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++) {
			out[i].context = (uint64_t)(uintptr_t)entries[i].op_context;
			out[i].err = 0;
			out[i].prov_errno = 0;
			out[i].remote = (entries[i].flags & FI_REMOTE_CQ_DATA) != 0;
			out[i].data = entries[i].data;
		}
		return n;
	}
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry e;
		memset(&e, 0, sizeof(e));
		ssize_t r = fi_cq_readerr(cq, &e, 0);
		if (r == 1 || r == 0) {
			out[0].context = (uint64_t)(uintptr_t)e.op_context;
			out[0].err = e.err ? e.err : FI_EOTHER;
			out[0].prov_errno = e.prov_errno;
			out[0].remote = 0;
			out[0].data = 0;
			return 1;
		}
		return r < 0 ? r : -FI_EOTHER;
	}
	return n;
}

/* Drives progress and reads up to `count` completions into `out`: from the
 * main completion queue, then from every send endpoint's. Returns how many
 * (>= 0); an error completion is returned as one entry with `err` set. */
ssize_t ordo_ofi_poll(struct ordo_ofi *o, struct ordo_ofi_comp *out, size_t count) {
	if (count > 32)
		count = 32;
	ssize_t n = poll_cq(o->cq, out, count);
	if (n < 0)
		return n;
	size_t got = (size_t)n;
	for (size_t i = 0; i < o->nscq && got < count; i++) {
		if (!o->scq[i])
			continue;
		ssize_t m = poll_cq(o->scq[i], out + got, count - got);
		if (m < 0)
			return got ? (ssize_t)got : m;
		got += (size_t)m;
	}
	return (ssize_t)got;
}

/* The completion queue's wait fd (-1: none; poll instead). */
int ordo_ofi_wait_fd(struct ordo_ofi *o) {
	return o->cq_fd;
}

/* 0 when it is safe to block on the wait fd (nothing pending), else
 * -FI_EAGAIN (poll the completion queue first). */
int ordo_ofi_trywait(struct ordo_ofi *o) {
	struct fid *fids[1] = { &o->cq->fid };
	return fi_trywait(o->fabric, fids, 1);
}

const char *ordo_ofi_strerror(int err) {
	return fi_strerror(err < 0 ? -err : err);
}

/* Constants the Rust side needs, from this version's headers. */
uint64_t ordo_ofi_flag_completion(void) { return FI_COMPLETION; }
uint64_t ordo_ofi_flag_delivery_complete(void) { return FI_DELIVERY_COMPLETE; }
uint64_t ordo_ofi_flag_inject(void) { return FI_INJECT; }
uint64_t ordo_ofi_flag_remote_cq_data(void) { return FI_REMOTE_CQ_DATA; }
uint64_t ordo_ofi_order_waw(void) { return FI_ORDER_WAW | FI_ORDER_RMA_WAW; }
uint64_t ordo_ofi_mr_virt_addr(void) { return FI_MR_VIRT_ADDR; }
int ordo_ofi_eagain(void) { return -FI_EAGAIN; }
size_t ordo_ofi_max_eps(void) { return ORDO_OFI_MAX_EPS; }
