#include "agora/rl/learner_page.h"

#include <fmt/format.h>

namespace agora {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string cell(const nlohmann::json& v) {
  if (v.is_string()) return escape(v.get<std::string>());
  if (v.is_number_float()) return fmt::format("{:.3f}", v.get<double>());
  return escape(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

std::string learner_page_html(const nlohmann::json& status) {
  const nlohmann::json s = status.is_object() ? status : nlohmann::json::object();
  const auto get = [&](const char* key) { return s.contains(key) ? cell(s.at(key)) : "-"; };
  std::string html = R"(<!doctype html><html><head><meta charset="utf-8">
<meta http-equiv="refresh" content="3"><title>agora rl</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#f4f4f4}</style>
</head><body>)";
  html += fmt::format("<h1>agora rl: {} ({})</h1>\n", get("run_id"), get("task"));
  html += fmt::format(
      "<p>update {} of {} &middot; policy version {} &middot; held-out accuracy {} (base {}) "
      "&middot; slots filled {} of {} &middot; {} rollouts in {} s{}</p>\n",
      get("step"), get("steps"), get("version"), get("held_out_accuracy"), get("base_accuracy"),
      get("slots_filled"), get("slots"), get("rollouts"), get("elapsed_s"),
      s.value("finished", false) ? " &middot; <b>finished</b>" : "");
  html += "<h2>Rollouts by verdict</h2><table><tr>";
  if (s.contains("verdicts")) {
    for (const auto& [k, v] : s.at("verdicts").items()) html += "<th>" + escape(k) + "</th>";
    html += "</tr><tr>";
    for (const auto& [k, v] : s.at("verdicts").items()) html += "<td>" + cell(v) + "</td>";
  }
  html += "</tr></table>\n<h2>Workers</h2><table><tr><th>worker</th><th>accepted</th>"
          "<th>refused</th><th>strikes</th><th>banned</th><th>holding</th></tr>";
  if (s.contains("workers")) {
    for (const auto& w : s.at("workers")) {
      html += "<tr>";
      for (const char* k : {"worker", "accepted", "refused", "strikes", "banned", "holding"}) {
        html += "<td>" + (w.contains(k) ? cell(w.at(k)) : "-") + "</td>";
      }
      html += "</tr>";
    }
  }
  html += "</table>\n<h2>Newest updates</h2><table><tr><th>step</th><th>reward</th>"
          "<th>accepted</th><th>rejected</th><th>clipped</th><th>held-out</th><th>s</th></tr>";
  if (s.contains("history")) {
    const auto& h = s.at("history");
    const size_t from = h.size() > 20 ? h.size() - 20 : 0;
    for (size_t i = h.size(); i-- > from;) {
      html += "<tr>";
      for (const char* k : {"step", "reward", "accepted", "rejected", "clipped_fraction",
                            "held_out_accuracy", "elapsed_s"}) {
        html += "<td>" + (h[i].contains(k) ? cell(h[i].at(k)) : "") + "</td>";
      }
      html += "</tr>";
    }
  }
  html += "</table></body></html>\n";
  return html;
}

}  // namespace agora
