#include "server/sglang_discovery.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "index/zmq_dial.h"

namespace prefixd {
namespace {

std::string RankName(const std::string& name, int rank) {
  return rank == 0 ? name : absl::StrCat(name, "/dp", rank);
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

// What `url` reads /server_info at.
std::string ServerInfoUrl(std::string url) {
  while (absl::EndsWith(url, "/")) url.pop_back();
  return absl::StrCat(url, "/server_info");
}

// One URL through libcurl's URL API; the first failing call's code is
// kept, and later calls do nothing.
class CurlUrl {
 public:
  explicit CurlUrl(const std::string& url) : u_(curl_url()) {
    Set(CURLUPART_URL, url);
  }
  ~CurlUrl() { curl_url_cleanup(u_); }
  CurlUrl(const CurlUrl&) = delete;
  CurlUrl& operator=(const CurlUrl&) = delete;

  void Set(CURLUPart part, const std::string& value) {
    if (rc_ == CURLUE_OK) rc_ = curl_url_set(u_, part, value.c_str(), 0);
  }
  // The part, or "" when it is not there (or an earlier call failed).
  std::string Get(CURLUPart part, unsigned int flags = 0) {
    char* out = nullptr;
    if (rc_ != CURLUE_OK || curl_url_get(u_, part, &out, flags) != CURLUE_OK)
      return "";
    std::string value = out;
    curl_free(out);
    return value;
  }
  CURLUcode rc() const { return rc_; }

 private:
  CURLU* const u_;
  CURLUcode rc_ = u_ == nullptr ? CURLUE_OUT_OF_MEMORY : CURLUE_OK;
};

// `url` with its host replaced by `address` (a pool's member).
absl::StatusOr<std::string> AtAddress(const std::string& url,
                                      const std::string& address) {
  CurlUrl u(url);
  u.Set(CURLUPART_HOST, BracketedHost(address));
  std::string out = u.Get(CURLUPART_URL);
  // libcurl writes an empty path as "/"; the address label is compared
  // byte for byte with a router's URL for the worker, which has none.
  if (!absl::EndsWith(url, "/") && absl::EndsWith(out, "/")) out.pop_back();
  if (u.rc() != CURLUE_OK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", url, "\" at ", address, ": ", curl_url_strerror(u.rc())));
  }
  return out;
}

// The URL's port as a pool member's name gives it (the scheme's own when
// the URL has none).
std::string UrlPort(const std::string& url) {
  return CurlUrl(url).Get(CURLUPART_PORT, CURLU_DEFAULT_PORT);
}

}  // namespace

absl::StatusOr<std::string> WorkerHost(const std::string& url) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an http(s)://HOST:PORT URL: ", why));
  };
  if (!absl::StartsWith(url, "http://") && !absl::StartsWith(url, "https://"))
    return bad("its scheme is not http or https");
  CurlUrl u(url);
  const std::string host = u.Get(CURLUPART_HOST);
  if (u.rc() != CURLUE_OK) return bad(curl_url_strerror(u.rc()));
  if (host.empty()) return bad("it has no host");
  return host;
}

SglangDiscovery::SglangDiscovery(SglangDiscoveryOptions options, Ingest* ingest,
                                 EngineLoadFeed* loads)
    : options_(std::move(options)), ingest_(ingest), loads_(loads) {}

SglangDiscovery::~SglangDiscovery() { Stop(); }

absl::StatusOr<std::unique_ptr<SglangDiscovery>> SglangDiscovery::Start(
    SglangDiscoveryOptions options, Ingest* ingest, EngineLoadFeed* loads) {
  RETURN_IF_ERROR(HttpFetches::InitLibcurl());
  std::unique_ptr<SglangDiscovery> d(
      new SglangDiscovery(std::move(options), ingest, loads));
  for (size_t i = 0; i < d->options_.workers.size(); ++i) {
    const SglangWorker& w = d->options_.workers[i];
    absl::StatusOr<std::string> host = WorkerHost(w.url);
    if (!host.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("index source ", w.name,
                                                     " server_info_url ",
                                                     host.status().message()));
    }
    const std::string name(absl::StripSuffix(absl::StripPrefix(*host, "["),
                                             "]"));  // as the resolver takes it
    if (w.pool || ResolvesToSeveral(name)) {
      d->pools_.push_back(
          {i,
           std::make_unique<PoolResolver>(
               w.name, absl::StrCat("SGLang pool ", w.name, " (", w.url, ")"),
               name),
           {},
           absl::InfinitePast()});
    } else {
      d->AddMember(i, "", w.name, w.url, *std::move(host));
    }
  }
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
  return reads_.counts();
}

std::vector<PoolLookups> SglangDiscovery::pool_lookups() const {
  std::vector<PoolLookups> out;
  for (const Pool& p : pools_) out.push_back(p.resolver->lookups());
  return out;
}

void SglangDiscovery::AddMember(size_t entry, std::string address,
                                std::string name, std::string url,
                                std::string host) {
  Member m;
  m.entry = entry;
  m.address = std::move(address);
  m.name = std::move(name);
  m.url = std::move(url);
  m.host = std::move(host);
  m.next = absl::InfinitePast();
  m.counter = reads_.Add(m.name);
  members_.push_back(std::move(m));
}

void SglangDiscovery::MakeFetches() {
  std::vector<HttpTarget> targets;
  for (const Member& m : members_) {
    const SglangWorker& w = options_.workers[m.entry];
    HttpTarget t;
    if (m.address.empty()) {
      t.url = ServerInfoUrl(m.url);
    } else {
      // A pod is read under the pool's name, connected to its address: an
      // https:// certificate names the Service, seldom each pod's address.
      t.url = ServerInfoUrl(w.url);
      t.connect_to =
          absl::StrCat("::", JoinHostPort(m.address, UrlPort(w.url)));
    }
    if (!w.api_key.empty()) {
      t.header = absl::StrCat("Authorization: Bearer ", w.api_key);
    }
    targets.push_back(std::move(t));
  }
  HttpFetchOptions f;
  f.timeout = options_.timeout;
  f.max_body_bytes = size_t{4} << 20;
  f.accept = "application/json";
  fetches_ = std::make_unique<HttpFetches>(targets, f);
}

bool SglangDiscovery::Resolve(Pool& p, absl::Time now) {
  const SglangWorker& w = options_.workers[p.entry];
  p.next = now + w.interval;
  std::optional<std::vector<std::string>> answer = p.resolver->Next();
  if (!answer.has_value()) return false;
  std::vector<std::string> addresses = *std::move(answer);
  for (size_t i = members_.size(); i-- > 0;) {
    const Member& m = members_[i];
    if (m.entry != p.entry || std::find(addresses.begin(), addresses.end(),
                                        m.address) != addresses.end()) {
      continue;
    }
    Follow(i, std::nullopt);
    members_.erase(members_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  const std::string port = UrlPort(w.url);
  for (const std::string& a : addresses) {
    if (std::find(p.addresses.begin(), p.addresses.end(), a) !=
        p.addresses.end()) {
      continue;
    }
    absl::StatusOr<std::string> url = AtAddress(w.url, a);
    if (!url.ok()) {
      std::fprintf(stderr, "prefixd: SGLang pool %s: %s not followed: %s\n",
                   w.name.c_str(), a.c_str(),
                   std::string(url.status().message()).c_str());
      continue;
    }
    AddMember(p.entry, a, absl::StrCat(w.name, "/", JoinHostPort(a, port)),
              *std::move(url), BracketedHost(a));
  }
  p.addresses = std::move(addresses);
  return true;
}

void SglangDiscovery::Round() {
  const absl::Time start = absl::Now();
  bool changed = fetches_ == nullptr;
  for (Pool& p : pools_) {
    if (p.next <= start) changed = Resolve(p, start) || changed;
  }
  if (changed) MakeFetches();
  std::vector<bool> due(members_.size());
  bool any = false;
  for (size_t i = 0; i < members_.size(); ++i) {
    due[i] = members_[i].next <= start;
    any = any || due[i];
  }
  if (!any) return;
  fetches_->Run(stopping_, due);
  if (stopping_.load(std::memory_order_relaxed)) return;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < members_.size(); ++i) {
    if (due[i]) Apply(i, fetches_->Take(i), now);
  }
}

void SglangDiscovery::Apply(size_t i, const absl::StatusOr<std::string>& body,
                            absl::Time now) {
  Member& m = members_[i];
  const SglangWorker& w = options_.workers[m.entry];
  if (!body.ok()) {
    const std::string then =
        m.followed ? "still following what it said last"
                   : absl::StrCat("asking again every ",
                                  absl::FormatDuration(options_.retry));
    const bool refused = absl::EndsWith(body.status().message(), " 401");
    Log(m, absl::StrCat("/server_info not read: ", body.status().message(),
                        refused && w.api_key.empty()
                            ? " (a worker started with --api-key needs "
                              "server_info_api_key_file)"
                            : "",
                        "; ", then));
    reads_.Count(m.counter, false);
    m.next = now + (m.followed ? w.interval : options_.retry);
    return;
  }
  absl::StatusOr<std::optional<SglangEventSockets>> found =
      ParseSglangServerInfo(*body, m.host);
  std::optional<SglangEventSockets> follow;
  if (!found.ok()) {
    Log(m, absl::StrCat(found.status().message(), "; not followed"));
  } else if (!found->has_value()) {
    Log(m,
        "/server_info has no kv_events (start it with --kv-events-config "
        "and a zmq publisher); not followed");
  } else if ((*found)->block_size != options_.block_size) {
    Log(m, absl::StrCat("its blocks are of ", (*found)->block_size,
                        " tokens, the index's of ", options_.block_size,
                        " (index.block_size; SGLang's --page-size); not "
                        "followed"));
  } else {
    follow = **found;
    Log(m, Described(*follow));
  }
  reads_.Count(m.counter, follow.has_value());
  Follow(i, follow);
  m.next = now + (follow ? w.interval : options_.retry);
}

IndexSource SglangDiscovery::RankSource(const Member& m,
                                        const SglangEventSockets& s,
                                        int rank) const {
  const SglangWorker& w = options_.workers[m.entry];
  IndexSource src;
  src.name = RankName(m.name, rank);
  src.endpoint = s.EventEndpoints()[static_cast<size_t>(rank)];
  if (w.replay_port != 0) {
    src.replay_endpoint =
        absl::StrCat("tcp://", s.host, ":", w.replay_port + rank);
  }
  src.labels = w.labels;
  src.labels.dp_rank = rank;
  // A pool's worker is its own instance at its own URL, whatever the
  // entry says (a host found to be a pool at start may name one).
  const bool of_pool = !m.address.empty();
  if (of_pool || src.labels.instance_id.empty())
    src.labels.instance_id = m.name;
  if (of_pool || src.labels.address.empty()) src.labels.address = m.url;
  src.pinned = true;
  return src;
}

void SglangDiscovery::Follow(size_t i,
                             const std::optional<SglangEventSockets>& sockets) {
  Member& m = members_[i];
  if (m.followed == sockets) return;
  m.followed = sockets;
  std::vector<IndexSource> ranks;
  std::vector<EngineLoadSocket> load;
  if (sockets) {
    for (int r = 0; r < sockets->dp_size; ++r)
      ranks.push_back(RankSource(m, *sockets, r));
    const std::vector<std::string> endpoints = sockets->LoadEndpoints();
    for (size_t r = 0; r < endpoints.size(); ++r)
      load.push_back({RankName(m.name, static_cast<int>(r)), endpoints[r]});
  }
  // A rank whose sockets are the same stays followed, its worker intact.
  const auto same = [](const IndexSource& a, const IndexSource& b) {
    return a.name == b.name && a.endpoint == b.endpoint &&
           a.replay_endpoint == b.replay_endpoint;
  };
  std::vector<IndexSource> kept;
  for (IndexSource& old : m.sources) {
    const bool stays =
        std::any_of(ranks.begin(), ranks.end(),
                    [&](const IndexSource& r) { return same(old, r); });
    if (stays) {
      kept.push_back(std::move(old));
    } else {
      ingest_->RemoveSource(old.name).IgnoreError();  // gone only if stopped
    }
  }
  m.sources = std::move(kept);
  for (IndexSource& r : ranks) {
    const bool followed =
        std::any_of(m.sources.begin(), m.sources.end(),
                    [&](const IndexSource& k) { return same(k, r); });
    if (followed) continue;
    if (absl::Status s = ingest_->AddSource(r); !s.ok()) {
      Log(m, absl::StrCat("rank ", r.labels.dp_rank,
                          " not followed: ", s.message()));
      continue;
    }
    m.sources.push_back(std::move(r));
  }
  if (loads_ != nullptr) loads_->SetSockets(m.name, std::move(load));
}

void SglangDiscovery::Log(Member& m, const std::string& outcome) {
  if (outcome == m.last_outcome) return;
  m.last_outcome = outcome;
  std::fprintf(stderr, "prefixd: SGLang worker %s (%s): %s\n", m.name.c_str(),
               m.url.c_str(), outcome.c_str());
}

}  // namespace prefixd
