#include "server/http/html.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace prefixd {

const char kPageStyle[] = R"css(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
 margin:0;color:#1d2330;background:#f6f7f9}
nav{background:#1d2330;color:#fff;padding:8px 20px}
nav a{color:#cfe0ff;margin-left:16px;text-decoration:none}
main{padding:4px 20px 20px;max-width:1200px}
h1{font-size:20px;margin:14px 0 6px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;margin:4px 0}
th,td{border:1px solid #d8dce3;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f5} td.l,th.l{text-align:left}
table.kv th{text-align:left;width:9em}
table.kv td{text-align:left}
.bar{display:inline-block;width:160px;height:10px;background:#e3e7ee;
 vertical-align:middle;margin-left:8px}
.bar span{display:block;height:100%;background:#3b7ddd}
.bar.over span{background:#d64545} tr.over td.pct{color:#b02a2a;font-weight:600}
.muted{color:#667085} code{font-size:13px}
label{display:inline-block;margin:4px 14px 4px 0}
input,select{font:inherit;padding:1px 4px} input[type=text]{width:7em}
.stack{display:flex;height:22px;width:100%;max-width:900px;background:#e3e7ee;
 margin:6px 0;border:1px solid #c9ced8}
.stack div{height:100%} .stack .w{background:#8a94a6} .stack .o{background:#b9c0cc}
.stack .k{background:#3b7ddd} .stack.over .k{background:#d64545}
#error{color:#b02a2a;font-weight:600}
td.tenant{white-space:normal;word-break:break-all;max-width:18em}
.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
.stale{opacity:.35} input:disabled{background:#eef1f5;color:#98a0ae}
#command{font-family:monospace;font-size:13px;word-break:break-all}
#plots{display:flex;flex-wrap:wrap;gap:10px 16px}
figure.plot{margin:0;background:#fff;border:1px solid #d8dce3;padding:6px 8px}
figure.plot figcaption{font-size:13px;font-weight:600}
figure.plot .legend{font-size:12px;color:#667085}
)css";

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
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
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string PageStart(absl::string_view title, absl::string_view head) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
      head, "<title>", HtmlEscape(title), "</title>\n<style>", kPageStyle,
      "</style></head><body>\n<nav><b>prefixd</b><a href=\"/\">status</a>"
      "<a href=\"/plan\">KV calculator</a><a href=\"/metrics\">metrics</a>"
      "</nav>\n<main>\n");
}

std::string PageEnd(absl::string_view scripts) {
  return absl::StrCat("</main>\n", scripts, "</body></html>\n");
}

HttpResponse HtmlResponse(std::string body) {
  return {200,
          "text/html; charset=utf-8",
          std::move(body),
          {{"Content-Security-Policy", kSecurityPolicy}}};
}

HttpResponse JsonResponse(int status, std::string body) {
  return {status, "application/json", std::move(body), {}};
}

}  // namespace prefixd
