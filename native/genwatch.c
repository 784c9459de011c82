/* The generation watch's looks (nlproxy/nft/monitor.py's GenerationWatch), made in C.
 *
 * A look is one NFT_MSG_GETGEN on a netlink socket that Python opened in the right network
 * namespace and handed over. The watch's thread sleeps in poll() on its end of a socket pair
 * with the interval as the timeout, looks, and writes a span (after, upto] to the pair only when
 * the generation moved: the event loop waits on the other end, so while nothing moves no Python
 * code runs for the watch at all (a Python thread's wake-up costs the interpreter's bytecode,
 * cold in a large process, every time). When Python closes its end, the thread's poll() returns
 * and the thread ends, closing the netlink socket and its end of the pair: nobody ever waits for
 * it.
 *
 * The socket, the sequence number and the last generation seen are shared with Python's own
 * looks (nls_gw_look, nls_gw_generation, from any thread) under one mutex: a move that one look
 * took is not reported by another. The structure is freed by whichever of Python (its last
 * reference, nls_gw_release) and the thread lets go of it last.
 *
 * Plain POSIX threads and sockets; nothing of libnftnl's.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <linux/netlink.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nf_tables.h>
#include "genwatch.h"

/* How long a look waits for the kernel's answer before it fails (and is tried again). */
#define NLS_GW_TIMEOUT_S 10
#define NLS_GW_STACK (256u * 1024u)

struct nls_gw {
	pthread_mutex_t lock; /* everything below */
	int sock;	      /* NETLINK_NETFILTER; -1 once the thread closed it */
	int peer;	      /* the thread's end of the pair; -1 when there is no thread */
	int running;
	int refs; /* Python's, the thread's */
	int interval_ms;
	uint32_t seq;
	uint32_t seen; /* the generation at the last look: every move up to it was reported */
	uint64_t looks;
};

static int gw_getgen_locked(struct nls_gw *gw, uint32_t *gen);

/* A watch over the netlink socket sock, the current generation seen. Returns NULL with *err
 * set (a negative errno; sock is still the caller's), or the watch, which owns sock then. */
struct nls_gw *nls_gw_new(int sock, int *err)
{
	struct nls_gw *gw;
	struct timeval tv = { .tv_sec = NLS_GW_TIMEOUT_S };
	int flags = fcntl(sock, F_GETFL);

	/* Blocking, each wait bounded: the mutex is held over one request and its answer. */
	if (flags < 0 || fcntl(sock, F_SETFL, flags & ~O_NONBLOCK) < 0 ||
	    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
		*err = -errno;
		return NULL;
	}
	gw = calloc(1, sizeof(*gw));
	if (!gw) {
		*err = -ENOMEM;
		return NULL;
	}
	gw->sock = sock;
	gw->peer = -1;
	gw->refs = 1;
	*err = gw_getgen_locked(gw, &gw->seen); /* nobody else has it yet */
	if (*err == 0)
		*err = -pthread_mutex_init(&gw->lock, NULL);
	if (*err == 0)
		return gw;
	free(gw);
	return NULL;
}

/* Drops one reference (the caller holds the lock); frees the watch after the last one. */
static void gw_unref_locked(struct nls_gw *gw)
{
	int last = --gw->refs == 0;

	pthread_mutex_unlock(&gw->lock);
	if (!last)
		return;
	if (gw->sock >= 0)
		close(gw->sock);
	pthread_mutex_destroy(&gw->lock);
	free(gw);
}

void nls_gw_release(struct nls_gw *gw)
{
	pthread_mutex_lock(&gw->lock);
	gw_unref_locked(gw);
}

/* The generation id among the attributes of a NEWGEN message's body. */
static int gw_gen_id(const char *p, const char *end, uint32_t *gen)
{
	p += sizeof(struct nfgenmsg);
	while (p + sizeof(struct nlattr) <= end) {
		struct nlattr a;
		uint32_t be;

		memcpy(&a, p, sizeof(a));
		if (a.nla_len < sizeof(a) || p + a.nla_len > end)
			break;
		if ((a.nla_type & NLA_TYPE_MASK) == NFTA_GEN_ID && a.nla_len >= sizeof(a) + 4) {
			memcpy(&be, p + sizeof(a), 4);
			*gen = ntohl(be);
			return 0;
		}
		p += NLA_ALIGN(a.nla_len);
	}
	return -ENODATA;
}

/* One GETGEN, without NLM_F_ACK (the kernel then sends the generation alone). Lock held. */
static int gw_getgen_locked(struct nls_gw *gw, uint32_t *gen)
{
	struct {
		struct nlmsghdr h;
		struct nfgenmsg g;
	} req;
	union {
		char bytes[4096];
		struct nlmsghdr align;
	} reply;
	uint32_t seq;
	ssize_t got;

	if (gw->sock < 0)
		return -EBADF;
	seq = ++gw->seq;
	memset(&req, 0, sizeof(req));
	req.h.nlmsg_len = sizeof(req);
	req.h.nlmsg_type = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN;
	req.h.nlmsg_flags = NLM_F_REQUEST;
	req.h.nlmsg_seq = seq;
	req.g.nfgen_family = AF_UNSPEC;
	req.g.version = NFNETLINK_V0;
	do
		got = send(gw->sock, &req, sizeof(req), 0);
	while (got < 0 && errno == EINTR);
	if (got < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
	for (;;) {
		const char *p = reply.bytes, *end;

		got = recv(gw->sock, reply.bytes, sizeof(reply.bytes), 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
		if (got == 0)
			return -EIO;
		end = p + got;
		/* Answers to earlier requests that timed out carry other sequence numbers. */
		while (p + sizeof(struct nlmsghdr) <= end) {
			struct nlmsghdr h;

			memcpy(&h, p, sizeof(h));
			if (h.nlmsg_len < sizeof(h) || p + h.nlmsg_len > end)
				break;
			if (h.nlmsg_seq == seq) {
				if (h.nlmsg_type == NLMSG_ERROR && h.nlmsg_len >= sizeof(h) + 4) {
					int err;

					memcpy(&err, p + sizeof(h), sizeof(err));
					if (err < 0)
						return err;
				} else if (h.nlmsg_type ==
					   (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN)) {
					return gw_gen_id(p + sizeof(h), p + h.nlmsg_len, gen);
				}
			}
			p += NLMSG_ALIGN(h.nlmsg_len);
		}
	}
}

/* The kernel's generation now. Returns 0, or a negative errno (-ENODATA: no generation id in
 * the answer, -EBADF: the watch's thread ended and closed the socket). */
int nls_gw_generation(struct nls_gw *gw, uint32_t *gen)
{
	int rc;

	pthread_mutex_lock(&gw->lock);
	rc = gw_getgen_locked(gw, gen);
	pthread_mutex_unlock(&gw->lock);
	return rc;
}

/* The span the generation moved by since the last look: 1 with *after and *upto set, 0 when
 * it did not move, or a negative errno (nls_gw_generation's). */
int nls_gw_look(struct nls_gw *gw, uint32_t *after, uint32_t *upto)
{
	uint32_t now;
	int rc;

	pthread_mutex_lock(&gw->lock);
	gw->looks++;
	rc = gw_getgen_locked(gw, &now);
	if (rc == 0 && now != gw->seen) {
		*after = gw->seen;
		*upto = now;
		gw->seen = now;
		rc = 1;
	}
	pthread_mutex_unlock(&gw->lock);
	return rc;
}

/* Sleeps ms milliseconds (whole, across signals: they are blocked in the thread anyway). */
static void gw_pause(int ms)
{
	struct timespec left = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&left, &left) < 0 && errno == EINTR)
		;
}

static void *gw_run(void *arg)
{
	struct nls_gw *gw = arg;
	struct pollfd p = { .fd = gw->peer, .events = POLLIN };
	uint32_t span[2] = { 0, 0 }, after = 0, upto = 0;
	int pending = 0, n;

	for (;;) {
		n = poll(&p, 1, gw->interval_ms);
		if (n < 0 && (errno == EINTR || errno == ENOMEM)) {
			/* Short of memory: wait out the interval, then look as usual. */
			if (errno == ENOMEM)
				gw_pause(gw->interval_ms);
			n = 0;
		}
		if (n != 0)
			break; /* Python closed its end (it never writes): the watch stops */
		/* A look that fails is tried at the next one: the move it missed is still there. */
		if (nls_gw_look(gw, &after, &upto) == 1) {
			/* A span not yet taken by the loop (its end was full) grows to cover the new
			 * one: a move another look took between them is reported again, never one
			 * left out. */
			if (!pending)
				span[0] = after;
			span[1] = upto;
			pending = 1;
		}
		if (!pending)
			continue;
		if (send(gw->peer, span, sizeof(span), MSG_DONTWAIT | MSG_NOSIGNAL) ==
		    (ssize_t)sizeof(span))
			pending = 0;
		else if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN ||
			 errno == ECONNREFUSED)
			break; /* Python's end is gone */
		/* Any other failure (its end full, no memory for the message): the span stays
		 * pending and is sent at a later turn. */
	}
	pthread_mutex_lock(&gw->lock);
	if (gw->sock >= 0)
		close(gw->sock);
	gw->sock = -1;
	close(gw->peer);
	gw->peer = -1;
	gw->running = 0;
	gw_unref_locked(gw);
	return NULL;
}

/* Starts the watch's thread, looking every interval_ms and writing each move to peer (the
 * thread's end of a SOCK_SEQPACKET pair, owned by the watch once this returns 0) as two
 * uint32_t (after, upto]. Returns 0 or a negative errno (peer is the caller's then). */
int nls_gw_start(struct nls_gw *gw, int peer, int interval_ms)
{
	pthread_attr_t attr;
	pthread_t thread;
	sigset_t all, old;
	int rc;

	if (interval_ms < 1)
		return -EINVAL;
	pthread_mutex_lock(&gw->lock);
	rc = gw->running ? -EBUSY : gw->sock < 0 ? -EBADF : 0;
	if (rc != 0) {
		pthread_mutex_unlock(&gw->lock);
		return rc;
	}
	gw->peer = peer;
	gw->interval_ms = interval_ms;
	gw->running = 1;
	gw->refs++;
	pthread_mutex_unlock(&gw->lock);

	rc = pthread_attr_init(&attr);
	if (rc == 0) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, NLS_GW_STACK);
		/* Signals are the interpreter's to take, on its own threads. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = pthread_create(&thread, &attr, gw_run, gw);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&attr);
	}
	if (rc == 0)
		return 0;
	pthread_mutex_lock(&gw->lock);
	gw->peer = -1;
	gw->running = 0;
	gw->refs--; /* Python still holds one */
	pthread_mutex_unlock(&gw->lock);
	return -rc;
}

uint32_t nls_gw_seen(struct nls_gw *gw)
{
	uint32_t seen;

	pthread_mutex_lock(&gw->lock);
	seen = gw->seen;
	pthread_mutex_unlock(&gw->lock);
	return seen;
}

uint64_t nls_gw_looks(struct nls_gw *gw)
{
	uint64_t looks;

	pthread_mutex_lock(&gw->lock);
	looks = gw->looks;
	pthread_mutex_unlock(&gw->lock);
	return looks;
}

/* Whether the watch's thread is still there (it ends soon after Python closes its end). */
int nls_gw_running(struct nls_gw *gw)
{
	int running;

	pthread_mutex_lock(&gw->lock);
	running = gw->running;
	pthread_mutex_unlock(&gw->lock);
	return running;
}
