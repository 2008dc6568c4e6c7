//===- lib/report/picture.cpp - A plan as an SVG picture or an HTML page -----===//
//
// `apc explain --format svg|html`. Both draw the same content, module by module:
//   - a per-module cost chart: one bar per module down to depth 2, split into compute (blue) and
//     communication (red), with its microseconds;
//   - a legend of output placements and their colours (placementColour: a colour per placement
//     text, the same in every plan) and of every mark (pictureMarks);
//   - the module tree: each module a box (SVG) or a collapsible <details> section (HTML) titled
//     with its op and parameter counts and cost, holding its own nodes as chips (ops as boxes,
//     parameters and buffers as pills, inputs and outputs as pills too) filled with the colour of
//     their output placement, and its submodules nested below. A node fed by a communicating edge
//     has a red border and the edge's collectives (PictureOptions::edge_labels) under its name,
//     wrapped over as many lines as they need. In the SVG, a run of repeated layers placed like
//     the first of the run (same ops and strategies) is that layer drawn once and one dashed box
//     counting the others ("layers.1-31: 31 more layers placed like layers.0").
// The SVG is static (every module expanded; tooltips on hover); the HTML page collapses modules
// below depth 1 until clicked. Both are self-contained and deterministic (graph order, no
// timestamps).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apc/report/explain.h"
#include "apc/report/report.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

/// Parameters, buffers and inputs by their own name; ops by displayName ("%linear_1").
std::string chipName(const PlanNode& n) {
  return n.kind == "op" ? displayName(n) : n.name;
}

std::string xmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string placementOf(const PlanNode& n) {
  std::string out = mesh::toCompactString(n.outputPlacements());
  return out.empty() ? "-" : out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// A module with its own nodes, submodules (in graph order) and totals over its subtree.
struct Module {
  std::string path;  // "" for the top level
  size_t depth = 0;
  std::vector<size_t> nodes;     // plan node indices directly in it
  std::vector<size_t> children;  // indices into Layout::modules
  size_t ops = 0, params = 0;    // over the subtree
  double compute_us = 0, comm_us = 0;
};

struct Layout {
  std::vector<Module> modules;  // [0] is the top level
  std::set<std::string> placements;
  std::vector<std::string> comm;  // per plan node: its incoming collectives (one line each)
  /// Per plan node: the same as lines short enough for a chip, every word kept.
  std::vector<std::vector<std::string>> comm_lines;
};

constexpr size_t kCommChars = 32;  // characters of a chip's collective line

/// `text` cut at spaces into lines of at most `width` characters (a longer word is a line).
std::vector<std::string> wrapped(const std::string& text, size_t width) {
  std::vector<std::string> out;
  for (const std::string& part : split(text, '\n')) {
    std::string line;
    for (const std::string& word : split(part, ' ')) {
      if (word.empty()) continue;
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        out.push_back(line);
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

size_t moduleFor(Layout& l, std::map<std::string, size_t>& index, const std::string& path) {
  if (auto it = index.find(path); it != index.end()) return it->second;
  size_t dot = path.rfind('.');
  size_t parent =
      moduleFor(l, index, dot == std::string::npos ? std::string() : path.substr(0, dot));
  Module m;
  m.path = path;
  m.depth = l.modules[parent].depth + 1;
  l.modules.push_back(m);
  size_t id = l.modules.size() - 1;
  l.modules[parent].children.push_back(id);
  index[path] = id;
  return id;
}

Layout layoutOf(const Plan& p, const PictureOptions& o) {
  Layout l;
  l.modules.push_back(Module{});
  std::map<std::string, size_t> index{{"", 0}};
  l.comm.resize(p.nodes.size());
  l.comm_lines.resize(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    l.placements.insert(placementOf(n));
    size_t m = moduleFor(l, index, n.module_path);
    l.modules[m].nodes.push_back(i);
    // Totals up the chain.
    for (std::string path = n.module_path;;) {
      Module& mod = l.modules[index[path]];
      if (n.kind == "op") ++mod.ops;
      if (n.kind == "parameter") ++mod.params;
      mod.compute_us += n.compute_us;
      mod.comm_us += n.comm_us;
      if (path.empty()) break;
      size_t dot = path.rfind('.');
      path = dot == std::string::npos ? std::string() : path.substr(0, dot);
    }
    if (n.graph_node)
      for (const PlanEdge& e : n.in_edges)
        if (auto it = o.edge_labels.find({*n.graph_node, e.input}); it != o.edge_labels.end()) {
          for (std::string& line : wrapped(it->second, kCommChars))
            l.comm_lines[i].push_back(std::move(line));
          std::string label = it->second;
          std::replace(label.begin(), label.end(), '\n', ' ');
          l.comm[i] += (l.comm[i].empty() ? "" : "; ") + label;
        }
    if (!n.graph_node)
      if (auto it = o.sink_labels.find(n.name); it != o.sink_labels.end()) {
        l.comm_lines[i] = wrapped(it->second, kCommChars);
        l.comm[i] = it->second;
        std::replace(l.comm[i].begin(), l.comm[i].end(), '\n', ' ');
      }
    if (l.comm[i].empty() && n.comm_us > 0) {
      l.comm[i] = "comm " + formatMicros(n.comm_us);
      l.comm_lines[i] = {l.comm[i]};
    }
  }
  return l;
}

std::string moduleTitle(const Module& m) {
  return (m.path.empty() ? std::string("(top level)") : m.path) + ": " + std::to_string(m.ops) +
         " ops, " + std::to_string(m.params) + " params, " +
         formatMicros(m.compute_us + m.comm_us) + " (comm " + formatMicros(m.comm_us) + ")";
}

/// A repeated layer ("layers.3") and its stem ("layers"); "" when `path` is not one.
std::string layerStem(const std::string& path) {
  if (path.empty() || repeatedLayerOf(path) != path) return "";
  return path.substr(0, path.rfind('.'));
}

/// The cost chart as an SVG fragment at (x, y); returns its height.
/// Whether two modules cost the same (compute and communication, 1e-9 relative).
bool sameCost(const Module& a, const Module& b) {
  auto near = [](double u, double v) {
    return std::fabs(u - v) <= 1e-9 * std::max({1.0, std::fabs(u), std::fabs(v)});
  };
  return near(a.compute_us, b.compute_us) && near(a.comm_us, b.comm_us);
}

double chartSvg(const Layout& l, double x, double y, double width, std::string& out) {
  // A run of repeated layers of equal cost is one row ("layers.1-31 (31 alike, each)"), as the
  // module tree draws such layers once: llama3_8b's 32 layers are 2 rows, not 32.
  struct Row {
    size_t m;
    std::string label;
    bool run = false;  // stands for several layers: drawn without its children
  };
  auto childRows = [&](size_t m) {
    const std::vector<size_t>& kids = l.modules[m].children;
    std::vector<Row> runs;
    for (size_t k = 0; k < kids.size();) {
      const std::string stem = layerStem(l.modules[kids[k]].path);
      size_t end = k + 1;
      while (!stem.empty() && end < kids.size() && layerStem(l.modules[kids[end]].path) == stem &&
             sameCost(l.modules[kids[end]], l.modules[kids[k]]))
        ++end;
      Row r{kids[k], l.modules[kids[k]].path, end > k + 1};
      if (r.run)
        r.label += "-" + l.modules[kids[end - 1]].path.substr(stem.size() + 1) + " (" +
                   std::to_string(end - k) + " alike, each)";
      runs.push_back(std::move(r));
      k = end;
    }
    return runs;
  };
  std::vector<Row> rows;
  std::vector<Row> stack;
  for (Row& r : childRows(0)) stack.push_back(std::move(r));
  std::reverse(stack.begin(), stack.end());
  while (!stack.empty()) {
    Row r = std::move(stack.back());
    stack.pop_back();
    const size_t m = r.m;
    const bool expand = !r.run && l.modules[m].depth < 2;
    rows.push_back(std::move(r));
    if (!expand) continue;
    std::vector<Row> kids = childRows(m);
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.push_back(std::move(*it));
  }
  double max = 0;
  for (const Row& r : rows) max = std::max(max, l.modules[r.m].compute_us + l.modules[r.m].comm_us);
  const double label_w = 230, bar_w = width - label_w - 130, row_h = 16;
  out += "<text x=\"" + num(x) + "\" y=\"" + num(y + 12) +
         "\" class=\"h\">Cost per module (compute blue, communication red)</text>\n";
  double cy = y + 20;
  for (const Row& row : rows) {
    const Module& mod = l.modules[row.m];
    double total = mod.compute_us + mod.comm_us;
    double wc = max > 0 ? bar_w * mod.compute_us / max : 0;
    double wm = max > 0 ? bar_w * mod.comm_us / max : 0;
    out += "<g><title>" + xmlEscape(moduleTitle(mod)) + "</title>";
    out += "<text x=\"" + num(x + 12 * (mod.depth - 1)) + "\" y=\"" + num(cy + 11) +
           "\" class=\"s\">" + xmlEscape(row.label) + "</text>";
    out += "<rect x=\"" + num(x + label_w) + "\" y=\"" + num(cy + 2) + "\" width=\"" + num(wc) +
           "\" height=\"11\" fill=\"#4e79a7\"/>";
    out += "<rect x=\"" + num(x + label_w + wc) + "\" y=\"" + num(cy + 2) + "\" width=\"" +
           num(wm) + "\" height=\"11\" fill=\"#e15759\"/>";
    out += "<text x=\"" + num(x + label_w + wc + wm + 6) + "\" y=\"" + num(cy + 11) +
           "\" class=\"s\">" + xmlEscape(formatMicros(total)) + "</text></g>\n";
    cy += row_h;
  }
  return cy - y + 6;
}

double legendSvg(const Layout& l, double x, double y, double width, std::string& out) {
  out +=
      "<text x=\"" + num(x) + "\" y=\"" + num(y + 12) + "\" class=\"h\">Output placement</text>\n";
  double cx = x, cy = y + 18;
  for (const std::string& placement : l.placements) {
    double w = 14 + 7.0 * static_cast<double>(placement.size());
    if (cx + w > x + width) {
      cx = x;
      cy += 20;
    }
    out += "<rect x=\"" + num(cx) + "\" y=\"" + num(cy) + "\" width=\"" + num(w) +
           "\" height=\"16\" rx=\"3\" fill=\"" + placementColour(placement) +
           "\" stroke=\"#888\"/>";
    out += "<text x=\"" + num(cx + 7) + "\" y=\"" + num(cy + 12) + "\" class=\"s\">" +
           xmlEscape(placement) + "</text>\n";
    cx += w + 6;
  }
  // What every mark means.
  cy += 22;
  for (const std::string& line : pictureMarks()) {
    out += "<text x=\"" + num(x) + "\" y=\"" + num(cy + 12) + "\" class=\"s\">" + xmlEscape(line) +
           "</text>\n";
    cy += 13;
  }
  return cy + 10 - y;
}

/// What a module's subtree chose, node by node (op and strategy): repeated layers with equal
/// texts are placed alike.
std::string placedAs(const Plan& p, const Layout& l, size_t m) {
  std::string out;
  for (size_t i : l.modules[m].nodes) out += p.nodes[i].op + "|" + p.nodes[i].strategy + ";";
  for (size_t c : l.modules[m].children) out += "{" + placedAs(p, l, c) + "}";
  return out;
}

constexpr double kChipW = 168, kChipH = 34, kTextH = 13, kCommH = 12, kGap = 6;
constexpr size_t kChipChars = 28;  // characters of a chip's name or placement line

/// `s` cut into pieces of at most `n` characters (names have no spaces to wrap at).
std::vector<std::string> chunked(const std::string& s, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size(); i += n) out.push_back(s.substr(i, n));
  if (out.empty()) out.push_back("");
  return out;
}

/// `s` wrapped at spaces into lines of at most `n` characters, a longer word cut into pieces.
std::vector<std::string> wrappedWords(const std::string& s, size_t n) {
  std::vector<std::string> out;
  for (const std::string& line : wrapped(s, n))
    for (std::string& piece : chunked(line, n)) out.push_back(std::move(piece));
  if (out.empty()) out.push_back("");
  return out;
}

/// Draws module `m` at (x, y) with `width`; returns its height.
double moduleSvg(const Plan& p, const Layout& l, size_t m, double x, double y, double width,
                 std::string& out) {
  const Module& mod = l.modules[m];
  std::string body;
  double cy = y + 22;
  // Chips in rows.
  double cx = x + 8;
  double row_h = 0;
  for (size_t i : mod.nodes) {
    const PlanNode& n = p.nodes[i];
    const bool comm = !l.comm[i].empty();
    // The name and the placement line, wrapped rather than cut (a long op or module name takes
    // more lines); the full text is in the title too.
    const bool pill = n.kind != "op";
    std::string placement = placementOf(n);
    std::vector<std::string> name_lines = chunked(chipName(n), kChipChars);
    std::vector<std::string> detail_lines =
        wrappedWords(placement + "  " + (pill ? n.kind : n.op.substr(n.op.find(':') + 2)) + "  " +
                         formatMicros(n.cost_us),
                     kChipChars);
    const size_t text_lines = name_lines.size() + detail_lines.size();
    const double h = kChipH + kTextH * static_cast<double>(text_lines - 2) +
                     kCommH * static_cast<double>(l.comm_lines[i].size());
    if (cx + kChipW > x + width - 4 && cx > x + 8) {
      cx = x + 8;
      cy += row_h + kGap;
      row_h = 0;
    }
    body += "<g><title>" +
            xmlEscape(displayName(n) + " (" + n.op + ") " + placement + ", compute " +
                      formatMicros(n.compute_us) + ", comm " + formatMicros(n.comm_us) +
                      (comm ? "; in: " + l.comm[i] : "")) +
            "</title>";
    body += "<rect x=\"" + num(cx) + "\" y=\"" + num(cy) + "\" width=\"" + num(kChipW) +
            "\" height=\"" + num(h) + "\" rx=\"" + (pill ? "14" : "4") + "\" fill=\"" +
            placementColour(placement) + "\" stroke=\"" + (comm ? "#d62728" : "#666") +
            "\" stroke-width=\"" + (comm ? "2" : "1") + "\"/>";
    double ty = cy + 14;
    for (const std::string& line : name_lines) {
      body += "<text x=\"" + num(cx + 8) + "\" y=\"" + num(ty) + "\" class=\"n\">" +
              xmlEscape(line) + "</text>";
      ty += kTextH;
    }
    for (const std::string& line : detail_lines) {
      body += "<text x=\"" + num(cx + 8) + "\" y=\"" + num(ty) + "\" class=\"s\">" +
              xmlEscape(line) + "</text>";
      ty += kTextH;
    }
    for (size_t k = 0; k < l.comm_lines[i].size(); ++k)
      body += "<text x=\"" + num(cx + 8) + "\" y=\"" + num(ty + kCommH * static_cast<double>(k)) +
              "\" class=\"c\">" + xmlEscape(l.comm_lines[i][k]) + "</text>";
    body += "</g>\n";
    row_h = std::max(row_h, h);
    cx += kChipW + kGap;
  }
  if (!mod.nodes.empty()) cy += row_h + kGap;
  // Submodules in model order; a run of repeated layers placed like the first of the run is
  // drawn once, followed by one collapsed box that counts the rest.
  for (size_t k = 0; k < mod.children.size();) {
    const size_t c = mod.children[k];
    cy += moduleSvg(p, l, c, x + 10, cy, width - 20, body) + kGap;
    const std::string stem = layerStem(l.modules[c].path);
    size_t end = k + 1;
    if (!stem.empty()) {
      const std::string alike = placedAs(p, l, c);
      while (end < mod.children.size() && layerStem(l.modules[mod.children[end]].path) == stem &&
             placedAs(p, l, mod.children[end]) == alike)
        ++end;
    }
    if (end > k + 1) {
      const Module& last = l.modules[mod.children[end - 1]];
      const Module& next = l.modules[mod.children[k + 1]];
      double compute = 0, comm_us = 0;
      for (size_t j = k + 1; j < end; ++j) {
        compute += l.modules[mod.children[j]].compute_us;
        comm_us += l.modules[mod.children[j]].comm_us;
      }
      const std::string range = next.path + "-" + last.path.substr(stem.size() + 1);
      const std::string title = range + ": " + std::to_string(end - k - 1) +
                                " more layers placed like " + l.modules[c].path + " (collapsed), " +
                                formatMicros(compute + comm_us) + " (comm " +
                                formatMicros(comm_us) + ")";
      body += "<g class=\"collapsed\"><title>" + xmlEscape(title) + "</title><rect x=\"" +
              num(x + 10) + "\" y=\"" + num(cy) + "\" width=\"" + num(width - 20) +
              "\" height=\"24\" rx=\"6\" fill=\"#eeeeee\" stroke=\"#999\" "
              "stroke-dasharray=\"4 3\"/><text x=\"" +
              num(x + 18) + "\" y=\"" + num(cy + 16) + "\" class=\"m\">" + xmlEscape(title) +
              "</text></g>\n";
      cy += 24 + kGap;
    }
    k = end;
  }
  double h = cy - y + 4;
  static const char* kShade[] = {"#ffffff", "#f7f7f7", "#efefef", "#e7e7e7"};
  out += "<g class=\"module\"><rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" +
         num(width) + "\" height=\"" + num(h) + "\" rx=\"6\" fill=\"" +
         kShade[std::min<size_t>(mod.depth, 3)] + "\" stroke=\"#999\"/>";
  out += "<text x=\"" + num(x + 8) + "\" y=\"" + num(y + 15) + "\" class=\"m\">" +
         xmlEscape(moduleTitle(mod)) + "</text>\n" + body + "</g>\n";
  return h;
}

std::string header(const Plan& p) {
  return p.model.model_name + " on " + p.spec.mesh.toString() + ": " +
         formatMicros(p.totals.total_us) + " per step (compute " +
         formatMicros(p.totals.compute_us) + ", communication " + formatMicros(p.totals.comm_us) +
         ")";
}

constexpr const char* kSvgStyle =
    "<style>text{font-family:Helvetica,Arial,sans-serif}.t{font-size:16px;font-weight:bold}"
    ".h{font-size:13px;font-weight:bold}.m{font-size:11px;font-weight:bold}.n{font-size:10px}"
    ".s{font-size:9px}.c{font-size:9px;fill:#b00000}</style>\n";

}  // namespace

std::string svgPicture(const Plan& p, const PictureOptions& o) {
  Layout l = layoutOf(p, o);
  const double width = 1100;
  std::string body;
  double y = 10;
  body +=
      "<text x=\"10\" y=\"" + num(y + 16) + "\" class=\"t\">" + xmlEscape(header(p)) + "</text>\n";
  y += 30;
  y += chartSvg(l, 10, y, width - 20, body) + 8;
  y += legendSvg(l, 10, y, width - 20, body) + 4;
  y += moduleSvg(p, l, 0, 10, y, width - 20, body) + 10;
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" +
         num(y) + "\" viewBox=\"0 0 " + num(width) + " " + num(y) + "\">\n" + kSvgStyle +
         "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body + "</svg>\n";
}

std::string htmlPicture(const Plan& p, const PictureOptions& o) {
  Layout l = layoutOf(p, o);
  std::string chart;
  double h = chartSvg(l, 0, 0, 900, chart);
  std::string legend;
  double lh = legendSvg(l, 0, 0, 900, legend);
  std::string out =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + xmlEscape(header(p)) +
      "</title>\n<style>body{font-family:Helvetica,Arial,sans-serif;font-size:12px;margin:16px}"
      "details{border:1px solid #aaa;border-radius:6px;margin:4px 0 4px 12px;padding:2px 6px;"
      "background:#fafafa}summary{font-weight:bold;cursor:pointer}"
      ".chip{display:inline-block;vertical-align:top;width:170px;margin:3px;padding:3px 6px;"
      "border:1px solid #666;border-radius:4px;font-size:10px}.pill{border-radius:14px}"
      ".comm{border:2px solid #d62728}.c{color:#b00000;font-size:9px}</style></head><body>\n<h2>" +
      xmlEscape(header(p)) + "</h2>\n<svg width=\"900\" height=\"" + num(h) + "\">" + kSvgStyle +
      chart + "</svg>\n<br><svg width=\"900\" height=\"" + num(lh) + "\">" + kSvgStyle + legend +
      "</svg>\n";
  std::vector<std::pair<size_t, bool>> stack = {{0, false}};  // (module, closing)
  while (!stack.empty()) {
    auto [m, closing] = stack.back();
    stack.pop_back();
    if (closing) {
      out += "</details>\n";
      continue;
    }
    const Module& mod = l.modules[m];
    out += std::string("<details") + (mod.depth <= 1 ? " open" : "") + "><summary>" +
           xmlEscape(moduleTitle(mod)) + "</summary>\n";
    for (size_t i : mod.nodes) {
      const PlanNode& n = p.nodes[i];
      std::string placement = placementOf(n);
      const bool comm = !l.comm[i].empty();
      out += std::string("<div class=\"chip") + (n.kind != "op" ? " pill" : "") +
             (comm ? " comm" : "") + "\" style=\"background:" + placementColour(placement) +
             "\" title=\"" +
             xmlEscape(n.op + ", compute " + formatMicros(n.compute_us) + ", comm " +
                       formatMicros(n.comm_us)) +
             "\"><b>" + xmlEscape(chipName(n)) + "</b><br>" + xmlEscape(placement) + " " +
             xmlEscape(n.kind == "op" ? n.op : n.kind) + " " + xmlEscape(formatMicros(n.cost_us));
      if (comm) out += "<br><span class=\"c\">" + xmlEscape(l.comm[i]) + "</span>";
      out += "</div>\n";
    }
    stack.push_back({m, true});
    for (auto it = mod.children.rbegin(); it != mod.children.rend(); ++it)
      stack.push_back({*it, false});
  }
  out += "</body></html>\n";
  return out;
}

}  // namespace apc::plan
