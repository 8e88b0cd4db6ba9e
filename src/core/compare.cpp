#include "core/compare.h"

#include <cmath>
#include <sstream>

namespace sparrow {

namespace {

std::string index_str(int64_t flat, const std::vector<int64_t>& shape) {
  if (shape.empty()) return "[" + std::to_string(flat) + "]";
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

}  // namespace

std::string CompareResult::summary() const {
  std::ostringstream o;
  o.precision(3);
  o << std::scientific << "n=" << count << " max|d|=" << max_abs_err << " max|ref|=" << max_abs_ref
    << " max|d|/max|ref|=" << rel_to_max << " cos_dist=" << cosine_distance << " failures=" << failures;
  return o.str();
}

CompareResult compare_f32(std::span<const float> got, std::span<const float> ref, const Tolerance& tol,
                          const std::vector<int64_t>& shape) {
  CompareResult r;
  r.count = static_cast<int64_t>(ref.size());
  if (got.size() != ref.size()) {
    r.ok = false;
    r.message = "size mismatch: got " + std::to_string(got.size()) + " elements, reference has " +
                std::to_string(ref.size());
    return r;
  }
  int64_t nonfinite_mismatch = -1;
  double worst_excess = -INFINITY, dot = 0, gg = 0, rr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], f = ref[i];
    if (!std::isfinite(g) || !std::isfinite(f)) {
      const bool same = (std::isnan(g) && std::isnan(f)) || (std::isinf(g) && std::isinf(f) && (g > 0) == (f > 0));
      if (!same && nonfinite_mismatch < 0) nonfinite_mismatch = static_cast<int64_t>(i);
      continue;
    }
    const double err = std::fabs(g - f);
    const double excess = err - (tol.atol + tol.rtol * std::fabs(f));
    if (excess > 0) ++r.failures;
    if (excess > worst_excess) {
      worst_excess = excess;
      r.worst_index = static_cast<int64_t>(i);
      r.worst_got = g;
      r.worst_ref = f;
    }
    r.max_abs_err = std::max(r.max_abs_err, err);
    r.max_abs_ref = std::max(r.max_abs_ref, std::fabs(f));
    dot += g * f;
    gg += g * g;
    rr += f * f;
  }
  r.rel_to_max = r.max_abs_ref > 0 ? r.max_abs_err / r.max_abs_ref : r.max_abs_err;
  r.cosine_distance = (gg > 0 && rr > 0) ? 1.0 - dot / std::sqrt(gg * rr) : (gg == rr ? 0.0 : 1.0);
  std::ostringstream msg;
  msg.precision(9);
  if (nonfinite_mismatch >= 0) {
    msg << "NaN/Inf mismatch at " << index_str(nonfinite_mismatch, shape) << ": got " << got[nonfinite_mismatch]
        << ", ref " << ref[nonfinite_mismatch] << "; ";
  }
  if (r.failures > 0) {
    msg << r.failures << " of " << r.count << " elements outside atol=" << tol.atol << " + rtol=" << tol.rtol
        << "*|ref|; worst at " << index_str(r.worst_index, shape) << ": got " << r.worst_got << ", ref "
        << r.worst_ref << "; ";
  }
  if (tol.max_cosine_distance >= 0 && r.cosine_distance > tol.max_cosine_distance)
    msg << "cosine distance " << r.cosine_distance << " > " << tol.max_cosine_distance << "; ";
  if (tol.max_rel_to_max >= 0 && r.rel_to_max > tol.max_rel_to_max)
    msg << "max|d|/max|ref| " << r.rel_to_max << " > " << tol.max_rel_to_max << " (worst at "
        << index_str(r.worst_index, shape) << "); ";
  r.message = msg.str();
  r.ok = r.message.empty();
  if (!r.ok) r.message += r.summary();
  return r;
}

}  // namespace sparrow
