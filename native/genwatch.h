/* The generation watch's looks, made by a thread of its own that runs no Python (genwatch.c). */
#ifndef NLPROXY_GENWATCH_H
#define NLPROXY_GENWATCH_H

#include <stdint.h>

struct nls_gw;

struct nls_gw *nls_gw_new(int sock, int *err);
void nls_gw_release(struct nls_gw *gw);
int nls_gw_generation(struct nls_gw *gw, uint32_t *gen);
int nls_gw_look(struct nls_gw *gw, uint32_t *after, uint32_t *upto);
int nls_gw_start(struct nls_gw *gw, int peer, int interval_ms);
uint32_t nls_gw_seen(struct nls_gw *gw);
uint64_t nls_gw_looks(struct nls_gw *gw);
int nls_gw_running(struct nls_gw *gw);

#endif
