#include "experts/route_override.hpp"

#include "core/error.hpp"

#include <vector>

namespace ep::experts {

void apply_route_override(backend::Backend &be, RouteOverride &route, int64_t layer, const backend::Tensor &ids) {
  if (ids.type != backend::GgmlType::i32)
    fail(Status::internal, "route override of MoE layer {}: the router's ids are not i32", layer);
  const int64_t k = ids.ne[0], n = ids.n_rows();
  std::vector<int32_t> host(static_cast<size_t>(k * n));
  route.picks(layer, n, k, host);
  be.upload(ids.data, host.data(), ids.n_bytes());
}

}  // namespace ep::experts
