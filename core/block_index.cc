#include "core/block_index.h"

#include <cassert>

namespace prefixd {
namespace {

constexpr int kPointerBits = 48;
constexpr uint64_t kPointerMask = (uint64_t{1} << kPointerBits) - 1;

// Calls f(page, run) for each maximal run of consecutive ids in one page.
template <typename F>
void ForEachPageRun(absl::Span<const BlockId> ids, F&& f) {
  size_t i = 0;
  while (i < ids.size()) {
    const uint64_t page = ids[i] >> BlockIndex::kPageBits;
    size_t j = i + 1;
    while (j < ids.size() && (ids[j] >> BlockIndex::kPageBits) == page) ++j;
    f(page, i, ids.subspan(i, j - i));
    i = j;
  }
}

}  // namespace

uint64_t BlockIndex::Pack(uint32_t tenant, const Node* node) {
  assert(tenant < kMaxTenants);
  const auto p = reinterpret_cast<uintptr_t>(node);
  // User-space pointers on x86-64 and arm64 Linux fit in 48 bits.
  assert((p & ~kPointerMask) == 0);
  return (uint64_t{tenant} + 1) << kPointerBits | p;
}

BlockOwner BlockIndex::Unpack(uint64_t word) {
  return BlockOwner{static_cast<uint32_t>((word >> kPointerBits) - 1),
                    reinterpret_cast<Node*>(word & kPointerMask)};
}

bool BlockIndex::ClaimAll(absl::Span<const BlockId> ids, uint32_t tenant,
                          size_t* failed) {
  const uint64_t word = Pack(tenant, nullptr);
  bool ok = true;
  size_t claimed = 0;  // ids[0, claimed) are claimed
  ForEachPageRun(
      ids, [&](uint64_t page_no, size_t start, absl::Span<const BlockId> run) {
        if (!ok) return;
        Shard& s = ShardFor(page_no);
        MutexLock lock(&s.mu);
        std::unique_ptr<Page>& page = s.pages[page_no];
        if (page == nullptr) page = std::make_unique<Page>();
        for (size_t k = 0; k < run.size(); ++k) {
          uint64_t& w = page->words[Slot(run[k])];
          if (w != 0) {
            ok = false;
            *failed = start + k;
            break;
          }
          w = word;
          ++page->used;
          ++s.size;
          ++claimed;
        }
        if (page->used == 0) s.pages.erase(page_no);
      });
  if (!ok) Erase(ids.subspan(0, claimed));
  return ok;
}

void BlockIndex::SetNode(absl::Span<const BlockId> ids, Node* node) {
  const uint64_t ptr = Pack(0, node) & kPointerMask;
  ForEachPageRun(ids,
                 [&](uint64_t page_no, size_t, absl::Span<const BlockId> run) {
                   Shard& s = ShardFor(page_no);
                   MutexLock lock(&s.mu);
                   auto it = s.pages.find(page_no);
                   assert(it != s.pages.end());
                   for (BlockId id : run) {
                     uint64_t& w = it->second->words[Slot(id)];
                     assert(w != 0);
                     w = (w & ~kPointerMask) | ptr;
                   }
                 });
}

void BlockIndex::Erase(absl::Span<const BlockId> ids) {
  ForEachPageRun(ids,
                 [&](uint64_t page_no, size_t, absl::Span<const BlockId> run) {
                   Shard& s = ShardFor(page_no);
                   MutexLock lock(&s.mu);
                   auto it = s.pages.find(page_no);
                   if (it == s.pages.end()) return;
                   Page& page = *it->second;
                   for (BlockId id : run) {
                     uint64_t& w = page.words[Slot(id)];
                     if (w == 0) continue;
                     w = 0;
                     --page.used;
                     --s.size;
                   }
                   if (page.used == 0) s.pages.erase(it);
                 });
}

std::optional<BlockOwner> BlockIndex::Find(BlockId id) const {
  const uint64_t page_no = PageOf(id);
  const Shard& s = ShardFor(page_no);
  MutexLock lock(&s.mu);
  auto it = s.pages.find(page_no);
  if (it == s.pages.end()) return std::nullopt;
  const uint64_t w = it->second->words[Slot(id)];
  if (w == 0) return std::nullopt;
  return Unpack(w);
}

size_t BlockIndex::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    MutexLock lock(&s.mu);
    n += s.size;
  }
  return n;
}

size_t BlockIndex::pages() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    MutexLock lock(&s.mu);
    n += s.pages.size();
  }
  return n;
}

}  // namespace prefixd
