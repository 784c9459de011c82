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

#endif
