// What the daemon's pages share (server/http/): the style sheet, the
// Content-Security-Policy, HTML escaping, the page frame and the answers.
//
// Everything a page uses is served by the daemon: no external scripts,
// fonts or images (the policy forbids them), so the pages work where the
// daemon has no internet.
//
// Thread safety: pure functions.
#ifndef PREFIXD_SERVER_HTTP_HTML_H_
#define PREFIXD_SERVER_HTTP_HTML_H_

#include <string>

#include "absl/strings/string_view.h"
#include "server/http/http_listener.h"

namespace prefixd {

// The pages may use only what they are served with: no other origin, no
// plugins, no framing. Inline styles only (the pages' own <style>); inline
// SVG is markup, not an image, so the plots need nothing more.
inline constexpr char kSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

// The style sheet of every page.
extern const char kPageStyle[];

// &, <, >, " and ' as entities: safe in element text and quoted attributes.
std::string HtmlEscape(absl::string_view text);

// "<!DOCTYPE html>...<body><nav>...</nav><main>": a page's start, with
// `title` (escaped) and `head` (extra markup for <head>, e.g. a refresh).
std::string PageStart(absl::string_view title, absl::string_view head = "");
// "</main></body></html>", after `scripts` (markup such as a <script>).
std::string PageEnd(absl::string_view scripts = "");

// 200 text/html with the policy.
HttpResponse HtmlResponse(std::string body);
// `status` application/json.
HttpResponse JsonResponse(int status, std::string body);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_HTML_H_
