/* Helpers for nlproxy that are faster or simpler in C than through cffi call by call. */
#include "nftshim.h"

#ifndef NLS_LIBNFTNL_VERSION
#define NLS_LIBNFTNL_VERSION "unknown"
#endif

const char *nls_libnftnl_version(void)
{
	return NLS_LIBNFTNL_VERSION;
}
