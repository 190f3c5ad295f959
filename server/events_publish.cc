#include "server/events_publish.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <variant>

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/auth.h"

namespace prefixd {
namespace {

// Events read from one ring per ReadEvents call.
constexpr size_t kReadEvents = 1024;

BlockStoredEvent StoredEvent(absl::string_view tenant, const std::string& ns,
                             std::vector<BlockId> ids,
                             std::optional<BlockId> parent,
                             std::vector<Token> tokens, int block_size) {
  BlockStoredEvent s;
  s.block_hashes = std::move(ids);
  s.parent_block_hash = parent;
  s.token_ids = std::move(tokens);
  s.block_size = block_size;
  if (!ns.empty()) s.lora_name = ns;
  s.cache_salt = CacheSaltOfTenant(tenant);
  s.chain_blocks = s.block_hashes.size();
  return s;
}

double NowSeconds() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

}  // namespace

std::string CacheSaltOfTenant(absl::string_view tenant) {
  return tenant == kDefaultTenant ? "" : std::string(tenant);
}

void AppendKvEvents(const Event& e, absl::string_view tenant, int block_size,
                    RopeShift rope_shift, std::vector<KvEvent>* out) {
  switch (e.type) {
    case EventType::kBlockStored: {
      if (e.block_ids.empty() ||
          e.tokens.size() !=
              e.block_ids.size() * static_cast<size_t>(block_size)) {
        return;  // no tokens: the cache runs without detailed_events
      }
      // DENY: a Match of the prompt stops before blocks cached at another
      // position, so the index must not hold them (nor, as unknown
      // parents, what hangs below).
      if (rope_shift == RopeShift::kDeny && e.position != e.prefix_tokens)
        return;
      out->emplace_back(
          StoredEvent(tenant, e.ns, e.block_ids,
                      e.has_parent ? std::optional<BlockId>(e.parent_block_id)
                                   : std::nullopt,
                      e.tokens, block_size));
      return;
    }
    case EventType::kBlockRemoved:
    case EventType::kCleared: {
      // A Cleared event carries every ID its reset removed: exactly those
      // leave the index, other tenants keep theirs.
      if (e.block_ids.empty()) return;
      BlockRemovedEvent r;
      r.block_hashes.assign(e.block_ids.begin(), e.block_ids.end());
      out->emplace_back(std::move(r));
      return;
    }
  }
}

absl::StatusOr<std::unique_ptr<EventsPublisher>> EventsPublisher::Start(
    const PrefixCache* cache, KvPublisherOptions options, PublishLimits limits,
    absl::Duration interval) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvEventSockets> sockets,
                   KvEventSockets::Start(options, limits));
  std::unique_ptr<EventsPublisher> p(
      new EventsPublisher(cache, std::move(options), std::move(sockets)));
  p->poller_ = std::make_unique<PeriodicThread>(
      interval, [raw = p.get()] { raw->Poll(); });
  p->poller_->Wake();  // the first round (the whole cache) at once
  return p;
}

EventsPublisher::EventsPublisher(const PrefixCache* cache,
                                 KvPublisherOptions options,
                                 std::unique_ptr<KvEventSockets> sockets)
    : cache_(cache),
      options_(std::move(options)),
      block_size_(cache->options().block_size),
      rope_shift_(cache->options().rope_shift),
      sockets_(std::move(sockets)),
      batcher_([this](std::vector<KvEvent> events) {
        PublishBatch(std::move(events));
      }) {}

EventsPublisher::~EventsPublisher() { Stop(); }

void EventsPublisher::Stop() {
  if (poller_ != nullptr) poller_->Stop();
  sockets_->Stop();
}

EventsPublishStats EventsPublisher::stats() const {
  EventsPublishStats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
  }
  s.wire = sockets_->counters();
  return s;
}

void EventsPublisher::Poll() {
  if (resync_pending_) {
    resync_pending_ = false;
    Resync(ResyncReason::kStart);
  }
  // Every event whose order is at most `watermark` is in its ring by now;
  // later ones wait for the next round, so that the merged order is core's
  // (a block ID removed from one tenant before another stores it).
  const uint64_t watermark = cache_->last_event_order();
  struct Taken {
    size_t tenant;
    Event event;
  };
  std::vector<Taken> taken;
  const std::vector<std::string> tenants = cache_->TenantNames();
  for (size_t i = 0; i < tenants.size(); ++i) {
    // A tenant first seen now was created after the last resync: its ring
    // starts at 1 and holds all it did.
    uint64_t& next = next_.try_emplace(tenants[i], 1).first->second;
    while (true) {
      absl::StatusOr<EventBatch> batch =
          cache_->ReadEvents(tenants[i], next, kReadEvents);
      if (!batch.ok()) break;
      if (batch->missed) {
        // The ring dropped events before they were read: what they removed
        // is unknown, so the index must forget everything and learn the
        // cache again.
        Resync(ResyncReason::kOverflow);
        return;
      }
      bool later = false;
      for (Event& e : batch->events) {
        if (e.order > watermark) {
          later = true;
          break;
        }
        next = e.sequence + 1;
        taken.push_back({i, std::move(e)});
      }
      if (later || batch->events.size() < kReadEvents) break;
    }
  }
  std::sort(taken.begin(), taken.end(), [](const Taken& a, const Taken& b) {
    return a.event.order < b.event.order;
  });
  std::vector<KvEvent> converted;
  for (const Taken& t : taken) {
    converted.clear();
    AppendKvEvents(t.event, tenants[t.tenant], block_size_, rope_shift_,
                   &converted);
    for (KvEvent& e : converted) batcher_.Add(std::move(e));
  }
  batcher_.Flush();
  MutexLock lock(&mu_);
  stats_.published_order = watermark;
}

// AllBlocksCleared, then every tree of every tenant from its root. Each
// tenant's read position is taken before its trees are dumped, so the
// events after it (published next, in order) bring the index from the dump
// to the present: a block the dump shows and a later event removed is
// removed again; one stored after the dump is stored. A block ID in two
// tenants' dumps (moved between them in between) is held once, by the last
// store, until the removal that follows in the events.
void EventsPublisher::Resync(ResyncReason reason) {
  {
    MutexLock lock(&mu_);
    ++stats_.resyncs[static_cast<int>(reason)];
  }
  batcher_.Clear();
  next_.clear();
  const std::vector<std::string> tenants = cache_->TenantNames();
  for (const std::string& t : tenants) {
    uint64_t next = 1;
    while (true) {
      absl::StatusOr<EventBatch> b = cache_->ReadEvents(t, next, kReadEvents);
      if (!b.ok()) break;
      next = b->next_sequence;
      if (b->events.size() < kReadEvents) break;
    }
    next_[t] = next;
  }
  batcher_.Add(AllBlocksClearedEvent{});
  const bool deny = rope_shift_ == RopeShift::kDeny;
  for (const std::string& t : tenants) {
    absl::StatusOr<std::vector<std::string>> namespaces = cache_->Namespaces(t);
    if (!namespaces.ok()) continue;
    for (const std::string& ns : *namespaces) {
      absl::StatusOr<std::vector<DumpNode>> nodes = cache_->Dump(t, ns);
      if (!nodes.ok()) continue;  // emptied since
      // Per depth: the node's last block, the tokens up to its end, and
      // whether it was published (DENY skips shifted nodes and below).
      struct Level {
        BlockId last;
        int64_t end_tokens;
        bool published;
      };
      std::vector<Level> path;
      for (DumpNode& n : *nodes) {
        if (n.block_ids.empty()) continue;
        path.resize(static_cast<size_t>(n.depth - 1));
        const Level* parent = path.empty() ? nullptr : &path.back();
        const int64_t before = parent == nullptr ? 0 : parent->end_tokens;
        const bool published = (parent == nullptr || parent->published) &&
                               (!deny || n.position == before);
        const BlockId last = n.block_ids.back();
        const int64_t end = before + static_cast<int64_t>(n.tokens.size());
        if (published) {
          batcher_.Add(StoredEvent(t, ns, std::move(n.block_ids),
                                   parent == nullptr
                                       ? std::nullopt
                                       : std::optional<BlockId>(parent->last),
                                   std::move(n.tokens), block_size_));
        }
        path.push_back({last, end, published});
      }
    }
  }
  batcher_.Flush();
}

void EventsPublisher::PublishBatch(std::vector<KvEvent> events) {
  std::array<uint64_t, 3> counts = {};
  for (const KvEvent& e : events) ++counts[e.index()];
  KvEventBatch batch;
  batch.ts = NowSeconds();
  batch.events = std::move(events);
  sockets_->Publish(EncodeEventBatch(batch));
  MutexLock lock(&mu_);
  for (size_t i = 0; i < counts.size(); ++i) stats_.events[i] += counts[i];
}

}  // namespace prefixd
