// Internal to capi/: the store's statistics as the C struct, for every handle that reports them.
#pragma once

#include <expertpack/expertpack.h>

#include "store/stats.hpp"

namespace ep::capi {

/// @p stats as an ep_store_stats of the full current size (ep_store_stats_init, then every field).
ep_store_stats to_c_store_stats(const store::StoreStats &stats);

}  // namespace ep::capi
