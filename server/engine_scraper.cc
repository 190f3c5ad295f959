#include "server/engine_scraper.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"

namespace prefixd {
namespace {

// One target's transfer: its easy handle and what it received.
struct Transfer {
  CURL* easy = nullptr;
  std::string body;
  size_t max_body = 0;
  bool too_large = false;
  CURLcode result = CURLE_OK;
  bool done = false;
};

size_t Append(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->body.size() + n > t->max_body) {
    t->too_large = true;
    return 0;  // libcurl ends the transfer with CURLE_WRITE_ERROR
  }
  t->body.append(data, n);
  return n;
}

// The filer's sources: each target's worker and URL.
std::vector<EngineLoadFiler::Source> Sources(const EngineScrapeOptions& o) {
  std::vector<EngineLoadFiler::Source> out;
  for (const EngineMetricsTarget& t : o.targets)
    out.push_back({t.worker, t.url});
  return out;
}

}  // namespace

// The libcurl handles of every target, made once and reused round after
// round, so that a connection an engine keeps alive serves the next
// round's request too. Touched only by the scraping thread.
class EngineScraper::Transfers {
 public:
  explicit Transfers(const EngineScrapeOptions& o)
      : multi_(curl_multi_init()),
        headers_(
            curl_slist_append(nullptr, "Accept: text/plain;version=0.0.4")),
        transfers_(o.targets.size()) {
    for (size_t i = 0; i < transfers_.size(); ++i) {
      Transfer& t = transfers_[i];
      t.easy = curl_easy_init();
      t.max_body = o.max_body_bytes;
      CURL* e = t.easy;
      curl_easy_setopt(e, CURLOPT_URL, o.targets[i].url.c_str());
      curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(absl::ToInt64Milliseconds(o.timeout)));
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, Append);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
      curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
      curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");  // gzip if offered
    }
  }
  ~Transfers() {
    for (Transfer& t : transfers_) curl_easy_cleanup(t.easy);
    curl_slist_free_all(headers_);
    curl_multi_cleanup(multi_);
  }
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // One request per target, all at once, until each has finished (or
  // timed out) or `stopping` is set.
  void Run(const std::atomic<bool>& stopping) {
    for (Transfer& t : transfers_) {
      t.too_large = t.done = false;
      t.result = CURLE_OK;
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
    for (Transfer& t : transfers_) curl_multi_remove_handle(multi_, t.easy);
  }

  // What target i's request of the last Run yields: its body's reading or
  // why there is none. Its body is freed.
  absl::StatusOr<EngineLoad> Outcome(size_t i,
                                     absl::Span<const LabelPair> labels) {
    Transfer& t = transfers_[i];
    absl::StatusOr<EngineLoad> out = Read(t, labels);
    std::string().swap(t.body);
    return out;
  }

 private:
  static absl::StatusOr<EngineLoad> Read(const Transfer& t,
                                         absl::Span<const LabelPair> labels) {
    if (t.too_large) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the response is larger than ", t.max_body, " bytes"));
    }
    if (!t.done || t.result != CURLE_OK) {
      return absl::UnavailableError(
          curl_easy_strerror(t.done ? t.result : CURLE_OPERATION_TIMEDOUT));
    }
    long status = 0;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
      return absl::UnavailableError(absl::StrCat("HTTP status ", status));
    }
    return ReadEngineMetrics(t.body, labels);
  }

  CURLM* const multi_;
  curl_slist* const headers_;
  std::vector<Transfer> transfers_;  // never resized: libcurl holds &t
};

EngineScraper::EngineScraper(EngineScrapeOptions options, EngineLoads* loads,
                             WorkerNames workers)
    : options_(std::move(options)),
      workers_(std::move(workers)),
      filer_(loads, "engine metrics", Sources(options_)),
      unlisted_(options_.targets.size()),
      transfers_(std::make_unique<Transfers>(options_)) {}

EngineScraper::~EngineScraper() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineScraper>> EngineScraper::Start(
    EngineScrapeOptions options, EngineLoads* loads, WorkerNames workers) {
  static std::once_flag once;
  static CURLcode init = CURLE_OK;
  std::call_once(once, [] { init = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init != CURLE_OK) {
    return absl::InternalError(
        absl::StrCat("libcurl did not initialise: ", curl_easy_strerror(init)));
  }
  std::unique_ptr<EngineScraper> s(
      new EngineScraper(std::move(options), loads, std::move(workers)));
  s->thread_ = std::make_unique<PeriodicThread>(s->options_.interval,
                                                [p = s.get()] { p->Round(); });
  s->thread_->Wake();  // the first round now, not an interval on
  return s;
}

void EngineScraper::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_ != nullptr) thread_->Stop();
}

void EngineScraper::Round() {
  transfers_->Run(stopping_);
  if (stopping_.load(std::memory_order_relaxed)) return;
  const absl::Time at = absl::Now();
  const std::vector<std::string> names =
      workers_ ? workers_() : std::vector<std::string>();
  for (size_t i = 0; i < options_.targets.size(); ++i) {
    filer_.File(i, transfers_->Outcome(i, options_.targets[i].labels), at);
    if (workers_ && filer_.ok(i)) CheckListed(i, names);
  }
}

void EngineScraper::CheckListed(size_t i,
                                const std::vector<std::string>& names) {
  const EngineMetricsTarget& t = options_.targets[i];
  const bool unlisted =
      !std::binary_search(names.begin(), names.end(), t.worker);
  if (unlisted && !unlisted_[i]) {
    std::fprintf(stderr,
                 "prefixd: engine metrics of %s (%s) read, but the index has "
                 "no worker %s (ListWorkers names them): Pick charges its "
                 "readings once a source or registration adds it\n",
                 t.worker.c_str(), t.url.c_str(), t.worker.c_str());
  }
  unlisted_[i] = unlisted;
}

}  // namespace prefixd
