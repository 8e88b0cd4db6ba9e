#include "runtime/diff.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "core/compare.h"

namespace sparrow {

namespace {

const TapRecord* find(const std::vector<TapRecord>& v, const std::string& name) {
  for (const TapRecord& r : v)
    if (r.name == name) return &r;
  return nullptr;
}

// Per query row: the fraction of A's valid picks that B also picked (-1 = no pick). Rows where A
// picked nothing count as full overlap when B picked nothing too.
void selection_overlap(const TapRecord& a, const TapRecord& b, TapDiff& d) {
  const int64_t rows = a.shape.empty() ? 0 : a.shape[0];
  if (rows == 0 || b.shape.empty() || b.shape[0] != rows) {
    d.shape_mismatch = true;
    d.overlap_min = d.overlap_mean = 0;
    return;
  }
  const int64_t ka = static_cast<int64_t>(a.i32.size()) / rows, kb = static_cast<int64_t>(b.i32.size()) / rows;
  double sum = 0, mn = 1;
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> sa, sb;
    for (int64_t i = 0; i < ka; ++i)
      if (a.i32[r * ka + i] >= 0) sa.insert(a.i32[r * ka + i]);
    for (int64_t i = 0; i < kb; ++i)
      if (b.i32[r * kb + i] >= 0) sb.insert(b.i32[r * kb + i]);
    double ov;
    if (sa.empty()) {
      ov = sb.empty() ? 1.0 : 0.0;
    } else {
      int64_t common = 0;
      for (int32_t x : sa) common += sb.count(x);
      ov = static_cast<double>(common) / static_cast<double>(sa.size());
    }
    sum += ov;
    mn = std::min(mn, ov);
  }
  d.overlap_min = mn;
  d.overlap_mean = sum / static_cast<double>(rows);
}

std::string shape_json(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

}  // namespace

DiffReport diff_taps(const std::vector<TapRecord>& a, const std::vector<TapRecord>& b, const DiffOptions& opt) {
  DiffReport rep;
  for (const TapRecord& ra : a) {
    TapDiff d;
    d.name = ra.name;
    d.layer = tap_layer(ra.name);
    d.selection = tap_is_selection(ra.name);
    d.shape_a = ra.shape;
    const TapRecord* rb = find(b, ra.name);
    if (!rb && tap_is_informational(ra.name)) continue;
    if (!rb) {
      d.present_in_b = false;
      d.diverged = true;
    } else {
      d.shape_b = rb->shape;
      if (d.selection) {
        selection_overlap(ra, *rb, d);
        d.diverged = !tap_is_informational(ra.name) && (d.shape_mismatch || d.overlap_min < opt.min_overlap);
      } else if (ra.shape != rb->shape || ra.type != rb->type) {
        d.shape_mismatch = true;
        d.diverged = true;
      } else {
        std::vector<float> fa = ra.f32, fb = rb->f32;
        if (ra.type == ElemType::kI32) {
          fa.assign(ra.i32.begin(), ra.i32.end());
          fb.assign(rb->i32.begin(), rb->i32.end());
        }
        const CompareResult c = compare_f32(fb, fa, {.atol = INFINITY}, ra.shape);
        d.rel_err = c.rel_to_max;
        d.max_abs_err = c.max_abs_err;
        d.cosine_distance = c.cosine_distance;
        // NaN/Inf in different places is a divergence whatever the finite values say.
        d.diverged = !c.ok || d.rel_err > opt.value_tol;
      }
    }
    if (d.diverged && !rep.first) rep.first = rep.taps.size();
    rep.taps.push_back(std::move(d));
  }
  return rep;
}

std::string diff_report_json(const DiffReport& r) {
  std::ostringstream o;
  o << "{\"first_divergence\": ";
  if (r.first) {
    const TapDiff& d = r.taps[*r.first];
    o << "{\"layer\": " << d.layer << ", \"tap\": " << json_string(d.name)
      << ", \"rel_err\": " << num(d.selection ? 1.0 - d.overlap_min : d.rel_err) << "}";
  } else {
    o << "null";
  }
  o << ", \"taps\": [";
  for (size_t i = 0; i < r.taps.size(); ++i) {
    const TapDiff& d = r.taps[i];
    o << (i ? ", " : "") << "{\"name\": " << json_string(d.name) << ", \"layer\": " << d.layer
      << ", \"kind\": \"" << (d.selection ? "selection" : "values") << "\", \"shape_a\": " << shape_json(d.shape_a)
      << ", \"shape_b\": " << shape_json(d.shape_b) << ", \"present_in_b\": " << (d.present_in_b ? "true" : "false");
    if (d.selection) {
      o << ", \"overlap_min\": " << num(d.overlap_min) << ", \"overlap_mean\": " << num(d.overlap_mean);
    } else {
      o << ", \"rel_err\": " << num(d.rel_err) << ", \"max_abs_err\": " << num(d.max_abs_err)
        << ", \"cosine_distance\": " << num(d.cosine_distance);
    }
    o << ", \"diverged\": " << (d.diverged ? "true" : "false") << "}";
  }
  o << "]}";
  return o.str();
}

std::string diff_report_text(const DiffReport& r) {
  struct Row {
    double worst_rel = 0;
    std::string worst_tap;
    double min_overlap = 1;
    std::string first_bad;
    int taps = 0;
  };
  // Rows in execution order: the embedding, each layer, then the head (final norm and logits).
  constexpr int64_t kHeadRow = INT64_MAX;
  auto row_key = [](const TapDiff& d) { return d.layer >= 0 ? d.layer : (d.name == "embed" ? -1 : kHeadRow); };
  std::map<int64_t, Row> rows;
  for (const TapDiff& d : r.taps) {
    Row& row = rows[row_key(d)];
    ++row.taps;
    if (!d.selection && d.rel_err >= row.worst_rel) {
      row.worst_rel = d.rel_err;
      row.worst_tap = d.name;
    }
    if (d.selection) row.min_overlap = std::min(row.min_overlap, d.overlap_min);
    if (d.diverged && row.first_bad.empty()) row.first_bad = d.name;
  }
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %5s %12s  %-28s %11s  %s\n", "layer", "taps", "worst rel", "(tap)",
                "min overlap", "first past tolerance");
  o << line;
  for (const auto& [layer, row] : rows) {
    std::snprintf(line, sizeof line, "%-6s %5d %12.3e  %-28s %11.3f  %s\n",
                  layer == -1 ? "embed" : layer == kHeadRow ? "head" : std::to_string(layer).c_str(), row.taps,
                  row.worst_rel, row.worst_tap.c_str(),
                  row.min_overlap, row.first_bad.empty() ? "-" : row.first_bad.c_str());
    o << line;
  }
  if (r.first) {
    const TapDiff& d = r.taps[*r.first];
    o << "first divergence: " << d.name << " (layer " << d.layer << "): ";
    if (!d.present_in_b) {
      o << "missing in B";
    } else if (d.shape_mismatch) {
      o << "shapes differ " << shape_json(d.shape_a) << " vs " << shape_json(d.shape_b);
    } else if (d.selection) {
      o << "selection overlap min " << d.overlap_min << ", mean " << d.overlap_mean;
    } else {
      o << "max|a-b|/max|a| = " << d.rel_err;
    }
    o << "\n";
  } else {
    o << "no divergence\n";
  }
  return o.str();
}

}  // namespace sparrow
