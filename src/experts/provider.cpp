#include "experts/provider.hpp"

#include "core/error.hpp"

namespace ep::experts {

ExpertShape expert_shape_of(const StackedRole &gate, const StackedRole &up, const StackedRole &down) {
  auto shape_of = [](const StackedRole &e) {
    if (!backend::is_supported_weight_type(e.type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for experts", e.origin, static_cast<uint32_t>(e.type));
    backend::SlotWeight w;
    w.type = e.type;
    w.ne0 = e.ne0;
    w.ne1 = e.ne1;
    return w;
  };
  return ExpertShape{shape_of(gate), shape_of(up), shape_of(down)};
}

}  // namespace ep::experts
