// A source's stacked routed-expert tensor as src/experts takes it (ResidentExperts, ExpertShape).
#pragma once

#include "experts/provider.hpp"
#include "model/weight_catalog.hpp"

namespace ep::model {

/// The experts::StackedRole of a catalog tensor stacked as [ne0, ne1, n_experts].
inline experts::StackedRole stacked_role(const CatalogEntry &e) {
  experts::StackedRole r;
  r.type = e.type;
  r.ne0 = e.ne[0];
  r.ne1 = e.ne[1];
  r.n_experts = e.ne[2];
  r.origin = e.origin;
  r.read_expert = e.read_expert;
  return r;
}

}  // namespace ep::model
