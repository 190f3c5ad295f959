#include "server/http_fetches.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace prefixd {

struct HttpFetches::Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  curl_slist* connect_to = nullptr;
  std::string body;
  size_t max_body = 0;
  bool too_large = false;
  CURLcode result = CURLE_OK;
  bool done = false;
  bool ran = false;  // in the last Run
};

namespace {

size_t Append(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<HttpFetches::Transfer*>(user);
  const size_t n = size * count;
  if (t->body.size() + n > t->max_body) {
    t->too_large = true;
    return 0;  // libcurl ends the transfer with CURLE_WRITE_ERROR
  }
  t->body.append(data, n);
  return n;
}

}  // namespace

absl::Status HttpFetches::InitLibcurl() {
  static std::once_flag once;
  static CURLcode init = CURLE_OK;
  std::call_once(once, [] { init = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init == CURLE_OK) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("libcurl did not initialise: ", curl_easy_strerror(init)));
}

HttpFetches::HttpFetches(const std::vector<HttpTarget>& targets,
                         HttpFetchOptions options)
    : multi_(curl_multi_init()), transfers_(targets.size()) {
  for (size_t i = 0; i < transfers_.size(); ++i) {
    Transfer& t = transfers_[i];
    t.easy = curl_easy_init();
    t.max_body = options.max_body_bytes;
    if (!options.accept.empty()) {
      t.headers = curl_slist_append(
          t.headers, absl::StrCat("Accept: ", options.accept).c_str());
    }
    const HttpTarget& target = targets[i];
    if (!target.header.empty())
      t.headers = curl_slist_append(t.headers, target.header.c_str());
    CURL* e = t.easy;
    curl_easy_setopt(e, CURLOPT_URL, target.url.c_str());
    if (!target.connect_to.empty()) {
      t.connect_to = curl_slist_append(nullptr, target.connect_to.c_str());
      curl_easy_setopt(e, CURLOPT_CONNECT_TO, t.connect_to);
    }
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(
        e, CURLOPT_TIMEOUT_MS,
        static_cast<long>(absl::ToInt64Milliseconds(options.timeout)));
    if (t.headers != nullptr)
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, Append);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");  // gzip if offered
  }
}

HttpFetches::~HttpFetches() {
  for (Transfer& t : transfers_) {
    curl_easy_cleanup(t.easy);
    curl_slist_free_all(t.headers);
    curl_slist_free_all(t.connect_to);
  }
  curl_multi_cleanup(multi_);
}

void HttpFetches::Run(const std::atomic<bool>& stopping,
                      const std::vector<bool>& due) {
  for (size_t i = 0; i < transfers_.size(); ++i) {
    Transfer& t = transfers_[i];
    t.ran = due.empty() || due[i];
    if (!t.ran) continue;
    t.too_large = t.done = false;
    t.result = CURLE_OK;
    t.body.clear();
    curl_multi_add_handle(multi_, t.easy);
  }
  int running = 1;
  while (running > 0 && !stopping.load(std::memory_order_relaxed)) {
    curl_multi_perform(multi_, &running);
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      char* priv = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
      auto* t = reinterpret_cast<Transfer*>(priv);
      t->done = true;
      t->result = m->data.result;
    }
    if (running > 0) curl_multi_poll(multi_, nullptr, 0, 100, nullptr);
  }
  for (Transfer& t : transfers_) {
    if (t.ran) curl_multi_remove_handle(multi_, t.easy);
  }
}

absl::StatusOr<std::string> HttpFetches::Take(size_t i) {
  Transfer& t = transfers_[i];
  std::string body;
  body.swap(t.body);
  if (t.too_large) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the response is larger than ", t.max_body, " bytes"));
  }
  if (!t.ran || !t.done || t.result != CURLE_OK) {
    return absl::UnavailableError(curl_easy_strerror(
        t.ran && t.done ? t.result : CURLE_OPERATION_TIMEDOUT));
  }
  long status = 0;
  curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    return absl::UnavailableError(absl::StrCat("HTTP status ", status));
  }
  return body;
}

}  // namespace prefixd
