#include "server/sglang_discovery.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

std::string RankName(const std::string& name, int rank) {
  return rank == 0 ? name : absl::StrCat(name, "/dp", rank);
}

// Rank r's index source.
IndexSource RankSource(const SglangWorker& w, const SglangEventSockets& s,
                       int rank) {
  IndexSource src;
  src.name = RankName(w.name, rank);
  src.endpoint = s.EventEndpoints()[rank];
  if (w.replay_port != 0) {
    src.replay_endpoint =
        absl::StrCat("tcp://", s.host, ":", w.replay_port + rank);
  }
  src.labels = w.labels;
  src.labels.dp_rank = rank;
  if (src.labels.instance_id.empty()) src.labels.instance_id = w.name;
  if (src.labels.address.empty()) src.labels.address = w.url;
  src.pinned = true;
  return src;
}

std::string Range(const std::vector<std::string>& endpoints) {
  if (endpoints.size() == 1) return endpoints[0];
  const std::string& last = endpoints.back();
  return absl::StrCat(endpoints[0], "..", last.substr(last.rfind(':') + 1));
}

// What following `s` means, for the log.
std::string Described(const SglangEventSockets& s) {
  std::string out = absl::StrCat("following ", s.dp_size,
                                 s.dp_size == 1 ? " DP rank" : " DP ranks",
                                 ": events at ", Range(s.EventEndpoints()));
  if (s.load_port_base != 0) {
    absl::StrAppend(&out, ", load at ", Range(s.LoadEndpoints()));
  }
  return out;
}

// Each worker's header line for its --api-key ("" without one).
std::vector<std::string> ApiKeyHeaders(const SglangDiscoveryOptions& o) {
  std::vector<std::string> out;
  for (const SglangWorker& w : o.workers) {
    out.push_back(w.api_key.empty()
                      ? std::string()
                      : absl::StrCat("Authorization: Bearer ", w.api_key));
  }
  return out;
}

std::vector<std::string> ServerInfoUrls(const SglangDiscoveryOptions& o) {
  std::vector<std::string> out;
  for (const SglangWorker& w : o.workers) {
    std::string base = w.url;
    while (absl::EndsWith(base, "/")) base.pop_back();
    out.push_back(absl::StrCat(base, "/server_info"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> WorkerHost(const std::string& url) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an http(s)://HOST:PORT URL: ", why));
  };
  if (!absl::StartsWith(url, "http://") && !absl::StartsWith(url, "https://"))
    return bad("its scheme is not http or https");
  CURLU* u = curl_url();
  if (u == nullptr) return absl::ResourceExhaustedError("curl_url failed");
  std::string host;
  char* part = nullptr;
  const CURLUcode set = curl_url_set(u, CURLUPART_URL, url.c_str(), 0);
  if (set == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &part, 0) == CURLUE_OK) {
    host = part;
    curl_free(part);
  }
  curl_url_cleanup(u);
  if (set != CURLUE_OK) return bad(curl_url_strerror(set));
  if (host.empty()) return bad("it has no host");
  return host;
}

SglangDiscovery::SglangDiscovery(SglangDiscoveryOptions options, Ingest* ingest,
                                 EngineLoadFeed* loads,
                                 std::vector<State> states)
    : options_(std::move(options)),
      ingest_(ingest),
      loads_(loads),
      states_(std::move(states)),
      ok_(new std::atomic<uint64_t>[states_.size()]()),
      failed_(new std::atomic<uint64_t>[states_.size()]()) {
  HttpFetchOptions f;
  f.timeout = options_.timeout;
  f.max_body_bytes = size_t{4} << 20;
  f.accept = "application/json";
  fetches_ = std::make_unique<HttpFetches>(ServerInfoUrls(options_), f,
                                           ApiKeyHeaders(options_));
}

SglangDiscovery::~SglangDiscovery() { Stop(); }

absl::StatusOr<std::unique_ptr<SglangDiscovery>> SglangDiscovery::Start(
    SglangDiscoveryOptions options, Ingest* ingest, EngineLoadFeed* loads) {
  RETURN_IF_ERROR(HttpFetches::InitLibcurl());
  std::vector<State> states(options.workers.size());
  for (size_t i = 0; i < states.size(); ++i) {
    absl::StatusOr<std::string> host = WorkerHost(options.workers[i].url);
    if (!host.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("index source ", options.workers[i].name,
                       " server_info_url ", host.status().message()));
    }
    states[i].host = *std::move(host);
  }
  std::unique_ptr<SglangDiscovery> d(new SglangDiscovery(
      std::move(options), ingest, loads, std::move(states)));
  d->thread_ = std::make_unique<PeriodicThread>(d->options_.retry,
                                                [p = d.get()] { p->Round(); });
  d->thread_->Wake();  // the first round now
  return d;
}

void SglangDiscovery::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_ != nullptr) thread_->Stop();
}

std::vector<EngineLoadFiler::Counts> SglangDiscovery::counts() const {
  std::vector<EngineLoadFiler::Counts> out;
  for (size_t i = 0; i < options_.workers.size(); ++i) {
    out.push_back({options_.workers[i].name,
                   ok_[i].load(std::memory_order_relaxed),
                   failed_[i].load(std::memory_order_relaxed)});
  }
  return out;
}

void SglangDiscovery::Round() {
  const absl::Time start = absl::Now();
  std::vector<bool> due(states_.size());
  bool any = false;
  for (size_t i = 0; i < states_.size(); ++i) {
    due[i] = states_[i].next <= start;
    any = any || due[i];
  }
  if (!any) return;
  fetches_->Run(stopping_, due);
  if (stopping_.load(std::memory_order_relaxed)) return;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < states_.size(); ++i) {
    if (due[i]) Apply(i, fetches_->Take(i), now);
  }
}

void SglangDiscovery::Apply(size_t i, const absl::StatusOr<std::string>& body,
                            absl::Time now) {
  const SglangWorker& w = options_.workers[i];
  State& st = states_[i];
  if (!body.ok()) {
    const std::string then =
        st.followed ? "still following what it said last"
                    : absl::StrCat("asking again every ",
                                   absl::FormatDuration(options_.retry));
    const bool refused = absl::EndsWith(body.status().message(), " 401");
    Log(i, absl::StrCat("/server_info not read: ", body.status().message(),
                        refused && w.api_key.empty()
                            ? " (a worker started with --api-key needs "
                              "server_info_api_key_file)"
                            : "",
                        "; ", then));
    failed_[i].fetch_add(1, std::memory_order_relaxed);
    st.next = now + (st.followed ? w.interval : options_.retry);
    return;
  }
  absl::StatusOr<std::optional<SglangEventSockets>> found =
      ParseSglangServerInfo(*body, st.host);
  std::optional<SglangEventSockets> follow;
  if (!found.ok()) {
    Log(i, absl::StrCat(found.status().message(), "; not followed"));
  } else if (!found->has_value()) {
    Log(i,
        "/server_info has no kv_events (start it with --kv-events-config "
        "and a zmq publisher); not followed");
  } else if ((*found)->block_size != options_.block_size) {
    Log(i, absl::StrCat("its blocks are of ", (*found)->block_size,
                        " tokens, the index's of ", options_.block_size,
                        " (index.block_size; SGLang's --page-size); not "
                        "followed"));
  } else {
    follow = **found;
    Log(i, Described(*follow));
  }
  (follow ? ok_ : failed_)[i].fetch_add(1, std::memory_order_relaxed);
  Follow(i, follow);
  st.next = now + (follow ? w.interval : options_.retry);
}

void SglangDiscovery::Follow(size_t i,
                             const std::optional<SglangEventSockets>& sockets) {
  State& st = states_[i];
  if (st.followed == sockets) return;
  st.followed = sockets;
  const SglangWorker& w = options_.workers[i];
  std::vector<IndexSource> ranks;
  std::vector<EngineLoadSocket> load;
  if (sockets) {
    for (int r = 0; r < sockets->dp_size; ++r)
      ranks.push_back(RankSource(w, *sockets, r));
    const std::vector<std::string> endpoints = sockets->LoadEndpoints();
    for (size_t r = 0; r < endpoints.size(); ++r)
      load.push_back({RankName(w.name, static_cast<int>(r)), endpoints[r]});
  }
  // A rank whose sockets are the same stays followed, its worker intact.
  const auto same = [](const IndexSource& a, const IndexSource& b) {
    return a.name == b.name && a.endpoint == b.endpoint &&
           a.replay_endpoint == b.replay_endpoint;
  };
  std::vector<IndexSource> kept;
  for (IndexSource& old : st.sources) {
    const bool stays =
        std::any_of(ranks.begin(), ranks.end(),
                    [&](const IndexSource& r) { return same(old, r); });
    if (stays) {
      kept.push_back(std::move(old));
    } else {
      ingest_->RemoveSource(old.name).IgnoreError();  // gone only if stopped
    }
  }
  st.sources = std::move(kept);
  for (IndexSource& r : ranks) {
    const bool followed =
        std::any_of(st.sources.begin(), st.sources.end(),
                    [&](const IndexSource& k) { return same(k, r); });
    if (followed) continue;
    if (absl::Status s = ingest_->AddSource(r); !s.ok()) {
      Log(i, absl::StrCat("rank ", r.labels.dp_rank,
                          " not followed: ", s.message()));
      continue;
    }
    st.sources.push_back(std::move(r));
  }
  if (loads_ != nullptr) loads_->SetSockets(w.name, std::move(load));
}

void SglangDiscovery::Log(size_t i, const std::string& outcome) {
  State& st = states_[i];
  if (outcome == st.last_outcome) return;
  st.last_outcome = outcome;
  const SglangWorker& w = options_.workers[i];
  std::fprintf(stderr, "prefixd: SGLang worker %s (%s): %s\n", w.name.c_str(),
               w.url.c_str(), outcome.c_str());
}

}  // namespace prefixd
