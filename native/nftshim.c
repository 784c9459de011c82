/* Helpers for nlproxy that are faster or simpler in C than through cffi call by call.
 *
 * Sits under nlproxy/nft/encode.py: it owns the batch buffer and appends messages to it, either
 * from libnftnl objects that Python built (tables, chains, sets, rules) or, for the hot path, all
 * elements of one set from packed arrays in one call. It never sends anything and never decides
 * what to program: the Python encoder does both.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nf_tables.h>
#include "nftshim.h"

#ifndef NLS_LIBNFTNL_VERSION
#define NLS_LIBNFTNL_VERSION "unknown"
#endif

/* Room kept free before building one object: a rule or set message never comes close. */
#define NLS_OBJ_ROOM (256u * 1024u)
/* NFTNL_UDATA_SET_ELEM_COMMENT: how nft stores an element's comment in its userdata. */
#define NLS_UDATA_ELEM_COMMENT 0

const char *nls_libnftnl_version(void)
{
	return NLS_LIBNFTNL_VERSION;
}

struct nls_buf *nls_buf_new(size_t cap)
{
	struct nls_buf *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	if (cap < 4096)
		cap = 4096;
	/* Every byte is zeroed before it is first written (nls_reserve): attribute padding that
	 * the netlink helpers skip then holds zeros, not what the memory held before, so a batch
	 * is a function of its operations alone, byte for byte. Only bytes about to be written are
	 * touched: the capacity past them (up to half of a large batch's buffer) costs no memory. */
	b->data = malloc(cap);
	if (!b->data) {
		free(b);
		return NULL;
	}
	b->cap = cap;
	return b;
}

void nls_buf_free(struct nls_buf *b)
{
	if (!b)
		return;
	free(b->data);
	free(b);
}

void nls_buf_reset(struct nls_buf *b)
{
	memset(b->data, 0, b->zeroed); /* zero again all that may have been written */
	b->len = 0;
}

/* Room for ``extra`` more bytes at b->len, zeroed (see nls_buf_new): the bytes past b->len
 * were never written (each message ends at the b->len it advances to, and a put that fails
 * part way is rolled back: nls_rollback), so only those never zeroed yet are. */
static int nls_reserve(struct nls_buf *b, size_t extra)
{
	size_t need = b->len + extra;
	size_t cap = b->cap;
	char *data;

	if (need > b->cap) {
		while (cap < need)
			cap *= 2;
		data = realloc(b->data, cap);
		if (!data)
			return -ENOMEM;
		b->data = data;
		b->cap = cap;
	}
	if (need > b->zeroed) {
		memset(b->data + b->zeroed, 0, need - b->zeroed);
		b->zeroed = need;
	}
	return 0;
}

/* Undo a put that failed part way: b->len back to ``start`` and every byte past it zeroed
 * again, as nls_reserve expects; returns ``err``. */
static long nls_rollback(struct nls_buf *b, size_t start, long err)
{
	if (b->zeroed > start)
		memset(b->data + start, 0, b->zeroed - start);
	b->len = start;
	return err;
}

int nls_put_batch_begin(struct nls_buf *b, uint32_t seq)
{
	struct nlmsghdr *nlh;

	if (nls_reserve(b, 64))
		return -ENOMEM;
	nlh = nftnl_batch_begin(b->data + b->len, seq);
	b->len += NLMSG_ALIGN(nlh->nlmsg_len);
	return 0;
}

int nls_put_batch_end(struct nls_buf *b, uint32_t seq)
{
	struct nlmsghdr *nlh;

	if (nls_reserve(b, 64))
		return -ENOMEM;
	nlh = nftnl_batch_end(b->data + b->len, seq);
	b->len += NLMSG_ALIGN(nlh->nlmsg_len);
	return 0;
}

long nls_put_obj(struct nls_buf *b, int kind, uint16_t msg, uint16_t family, uint16_t flags,
		 uint32_t seq, const void *obj)
{
	struct nlmsghdr *nlh;
	size_t off = b->len;

	if (nls_reserve(b, NLS_OBJ_ROOM))
		return -ENOMEM;
	nlh = nftnl_nlmsg_build_hdr(b->data + off, (NFNL_SUBSYS_NFTABLES << 8) | msg, family,
				    NLM_F_REQUEST | flags, seq);
	switch (kind) {
	case NLS_TABLE:
		nftnl_table_nlmsg_build_payload(nlh, obj);
		break;
	case NLS_CHAIN:
		nftnl_chain_nlmsg_build_payload(nlh, obj);
		break;
	case NLS_RULE:
		nftnl_rule_nlmsg_build_payload(nlh, (struct nftnl_rule *)obj);
		break;
	case NLS_SET:
		nftnl_set_nlmsg_build_payload(nlh, (struct nftnl_set *)obj);
		break;
	default:
		return nls_rollback(b, off, -EINVAL);
	}
	b->len += NLMSG_ALIGN(nlh->nlmsg_len);
	return (long)off;
}

/* An upper bound on the bytes element i adds to the element list. */
static size_t nls_elem_size(const struct nls_elems *e, uint32_t i)
{
	size_t n = 4 + 8 + MNL_ALIGN(e->key_len);

	if (e->key_ends)
		n += 8 + MNL_ALIGN(e->key_len);
	if (e->data)
		n += 8 + MNL_ALIGN(e->data_len);
	if (e->verdicts) {
		n += 4 + 4 + 8;
		if (e->chains && e->chains[i])
			n += 4 + MNL_ALIGN(strlen(e->chains[i]) + 1);
	}
	if (e->elem_flags)
		n += 8;
	if (e->timeouts_ms)
		n += 12;
	if (e->comments && e->comments[i])
		n += 4 + MNL_ALIGN(2 + strlen(e->comments[i]) + 1);
	return n;
}

static void nls_put_value(struct nlmsghdr *nlh, uint16_t type, const uint8_t *v, uint32_t len)
{
	struct nlattr *nest = mnl_attr_nest_start(nlh, type);

	mnl_attr_put(nlh, NFTA_DATA_VALUE, len, v);
	mnl_attr_nest_end(nlh, nest);
}

static void nls_put_elem(struct nlmsghdr *nlh, const struct nls_elems *e, uint32_t i)
{
	struct nlattr *elem = mnl_attr_nest_start(nlh, NFTA_LIST_ELEM);

	nls_put_value(nlh, NFTA_SET_ELEM_KEY, e->keys + (size_t)i * e->key_len, e->key_len);
	if (e->key_ends)
		nls_put_value(nlh, NFTA_SET_ELEM_KEY_END, e->key_ends + (size_t)i * e->key_len,
			      e->key_len);
	if (e->elem_flags && e->elem_flags[i])
		mnl_attr_put_u32(nlh, NFTA_SET_ELEM_FLAGS, htonl(e->elem_flags[i]));
	if (e->timeouts_ms && e->timeouts_ms[i])
		mnl_attr_put_u64(nlh, NFTA_SET_ELEM_TIMEOUT, htobe64(e->timeouts_ms[i]));
	if (e->elem_flags && (e->elem_flags[i] & NFT_SET_ELEM_INTERVAL_END)) {
		/* an interval's closing element carries no data, as nft sends it */
	} else if (e->data) {
		nls_put_value(nlh, NFTA_SET_ELEM_DATA, e->data + (size_t)i * e->data_len,
			      e->data_len);
	} else if (e->verdicts) {
		struct nlattr *data = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_DATA);
		struct nlattr *verdict = mnl_attr_nest_start(nlh, NFTA_DATA_VERDICT);

		mnl_attr_put_u32(nlh, NFTA_VERDICT_CODE, htonl((uint32_t)e->verdicts[i]));
		if (e->chains && e->chains[i])
			mnl_attr_put_strz(nlh, NFTA_VERDICT_CHAIN, e->chains[i]);
		mnl_attr_nest_end(nlh, verdict);
		mnl_attr_nest_end(nlh, data);
	}
	if (e->comments && e->comments[i]) {
		size_t len = strlen(e->comments[i]) + 1;
		uint8_t ud[2 + 256];

		if (len > 255)
			len = 255; /* validate.py rejects longer comments before we get here */
		ud[0] = NLS_UDATA_ELEM_COMMENT;
		ud[1] = (uint8_t)len;
		memcpy(ud + 2, e->comments[i], len - 1);
		ud[2 + len - 1] = 0;
		mnl_attr_put(nlh, NFTA_SET_ELEM_USERDATA, 2 + len, ud);
	}
	mnl_attr_nest_end(nlh, elem);
}

static struct nlmsghdr *nls_elem_msg(struct nls_buf *b, uint32_t seq, const struct nls_elems *e)
{
	struct nlmsghdr *nlh;

	if (nls_reserve(b, (size_t)e->max_bytes + 2 * 65536))
		return NULL;
	nlh = nftnl_nlmsg_build_hdr(b->data + b->len, (NFNL_SUBSYS_NFTABLES << 8) | e->msg,
				    e->family, NLM_F_REQUEST | e->flags, seq);
	mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, e->table);
	mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, e->set);
	if (e->set_id)
		mnl_attr_put_u32(nlh, NFTA_SET_ELEM_LIST_SET_ID, htonl(e->set_id));
	return nlh;
}

int nls_put_elems(struct nls_buf *b, uint32_t seq, const struct nls_elems *e)
{
	size_t start = b->len;
	struct nlmsghdr *nlh;
	struct nlattr *list = NULL;
	size_t list_start = 0;
	int msgs = 1;
	uint32_t i;

	if (e->max_bytes == 0 || e->max_bytes > 65000)
		return -EINVAL;
	nlh = nls_elem_msg(b, seq, e);
	if (!nlh)
		return (int)nls_rollback(b, start, -ENOMEM);
	for (i = 0; i < e->count; i++) {
		size_t need = nls_elem_size(e, i);

		if (need > e->max_bytes)
			return (int)nls_rollback(b, start, -EMSGSIZE);
		if (list && nlh->nlmsg_len - list_start + need > e->max_bytes) {
			mnl_attr_nest_end(nlh, list);
			b->len += NLMSG_ALIGN(nlh->nlmsg_len);
			nlh = nls_elem_msg(b, seq + msgs, e);
			if (!nlh)
				return (int)nls_rollback(b, start, -ENOMEM);
			msgs++;
			list = NULL;
		}
		if (!list) {
			list_start = nlh->nlmsg_len;
			list = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_LIST_ELEMENTS);
		}
		if (e->offsets)
			e->offsets[i] = nlh->nlmsg_len;
		if (e->msg_index)
			e->msg_index[i] = (uint32_t)(msgs - 1);
		nls_put_elem(nlh, e, i);
	}
	if (list)
		mnl_attr_nest_end(nlh, list);
	b->len += NLMSG_ALIGN(nlh->nlmsg_len);
	return msgs;
}

int nls_set_msg_flags(struct nls_buf *b, uint32_t seq, uint16_t flags)
{
	size_t off = 0;

	while (off + sizeof(struct nlmsghdr) <= b->len) {
		struct nlmsghdr *nlh = (struct nlmsghdr *)(b->data + off);

		if (nlh->nlmsg_len < sizeof(*nlh))
			return -EINVAL;
		if (nlh->nlmsg_seq == seq) {
			nlh->nlmsg_flags |= flags;
			return 0;
		}
		off += NLMSG_ALIGN(nlh->nlmsg_len);
	}
	return -ENOENT;
}
