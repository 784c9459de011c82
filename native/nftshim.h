/* nlproxy's native shim: libnftnl's API and a few helpers that build hot objects in one call. */
#ifndef NLPROXY_NFTSHIM_H
#define NLPROXY_NFTSHIM_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/uio.h>
#include <linux/netlink.h>
#include <libmnl/libmnl.h>
#include <libnftnl/common.h>
#include <libnftnl/table.h>
#include <libnftnl/chain.h>
#include <libnftnl/rule.h>
#include <libnftnl/expr.h>
#include <libnftnl/set.h>
#include <libnftnl/gen.h>
#include <libnftnl/batch.h>
#include <libnftnl/udata.h>
#include <libnftnl/object.h>

const char *nls_libnftnl_version(void);

/* A growing buffer holding one nfnetlink batch. */
struct nls_buf {
	char *data;
	size_t len;
	size_t cap;
	size_t zeroed; /* every byte below this was zeroed once; none at or above it written */
};

struct nls_buf *nls_buf_new(size_t cap);
void nls_buf_free(struct nls_buf *b);
void nls_buf_reset(struct nls_buf *b);

int nls_put_batch_begin(struct nls_buf *b, uint32_t seq);
int nls_put_batch_end(struct nls_buf *b, uint32_t seq);

/* Object kinds for nls_put_obj. */
enum nls_kind { NLS_TABLE = 0, NLS_CHAIN = 1, NLS_RULE = 2, NLS_SET = 3 };

/* Append one message of type (NFNL_SUBSYS_NFTABLES << 8 | msg) carrying a libnftnl object.
 * Returns the message's offset in the buffer, or -ENOMEM. */
long nls_put_obj(struct nls_buf *b, int kind, uint16_t msg, uint16_t family, uint16_t flags,
		 uint32_t seq, const void *obj);

/* Elements of one set, as parallel arrays; every pointer but keys may be NULL (absent). */
struct nls_elems {
	uint16_t msg;            /* NFT_MSG_NEWSETELEM, DELSETELEM or DESTROYSETELEM */
	uint16_t family;
	uint16_t flags;          /* netlink flags besides NLM_F_REQUEST */
	const char *table;
	const char *set;
	uint32_t set_id;         /* 0: none */
	uint32_t count;
	const uint8_t *keys;     /* count * key_len */
	uint32_t key_len;
	const uint8_t *key_ends; /* count * key_len: NFTA_SET_ELEM_KEY_END */
	const uint8_t *data;     /* count * data_len */
	uint32_t data_len;
	const int32_t *verdicts; /* count verdict codes (verdict maps) */
	const char *const *chains; /* count chain names for jump/goto (NULL entries: none) */
	const uint64_t *timeouts_ms; /* count; 0: none */
	const uint32_t *elem_flags;  /* count; NFT_SET_ELEM_INTERVAL_END... */
	const char *const *comments; /* count; NULL entries: none */
	uint32_t max_bytes;      /* bound on one message's element list (< 65536) */
	uint32_t *offsets;       /* out, count: offset of each element's attribute in its message */
	uint32_t *msg_index;     /* out, count: which of the appended messages holds it */
};

/* Append NEWSETELEM/DELSETELEM messages for all elements, starting a new message (with the next
 * sequence number) whenever the element list would exceed max_bytes. count == 0 appends one
 * message without elements (a set flush when msg is DELSETELEM).
 * Returns the number of messages appended, or a negative errno. */
int nls_put_elems(struct nls_buf *b, uint32_t seq, const struct nls_elems *e);

/* Add netlink flags (e.g. NLM_F_ACK) to the message numbered seq. 0, or -ENOENT. */
int nls_set_msg_flags(struct nls_buf *b, uint32_t seq, uint16_t flags);

#endif
