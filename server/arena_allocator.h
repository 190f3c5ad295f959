// Arena-backed messages for the hot unary calls (Match, Insert, their
// batches, Route, RouteBatch): gRPC's callback API asks a MessageAllocator
// for each call's request and response, and these come from a pool of
// protobuf arenas whose first block is part of the holder.
#ifndef PREFIXD_SERVER_ARENA_ALLOCATOR_H_
#define PREFIXD_SERVER_ARENA_ALLOCATOR_H_

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace prefixd {

// Requests and responses of the hot calls live on a protobuf arena whose
// first block (Block bytes) is part of a holder, and holders are reused: in
// the steady state parsing a request and building its response allocate
// nothing (a Match of 4k tokens, a batch of 32 prompts of 1k tokens fit;
// bigger ones add blocks, freed when the holder comes back). Without this,
// malloc, free and the page faults of trimmed heap were a fifth of a
// MatchBatch's server time. At most kPooledHolders idle holders are kept
// per method: 1 MiB for each unary method, 4 MiB for each batch method.
inline constexpr size_t kUnaryBlock = 32 << 10;
inline constexpr size_t kBatchBlock = 128 << 10;
inline constexpr size_t kPooledHolders = 32;

template <typename Req, typename Resp, size_t Block>
class ArenaAllocator;

template <typename Req, typename Resp, size_t Block>
class ArenaHolder final : public grpc::MessageHolder<Req, Resp> {
 public:
  explicit ArenaHolder(ArenaAllocator<Req, Resp, Block>* pool)
      : pool_(pool), arena_(Options(initial_block_, sizeof(initial_block_))) {}
  // Fresh messages for the next call.
  void Start() {
    this->set_request(google::protobuf::Arena::CreateMessage<Req>(&arena_));
    this->set_response(google::protobuf::Arena::CreateMessage<Resp>(&arena_));
  }
  void Release() override {
    arena_.Reset();  // keeps the initial block only
    pool_->Recycle(this);
  }

 private:
  static google::protobuf::ArenaOptions Options(char* block, size_t size) {
    google::protobuf::ArenaOptions o;
    o.initial_block = block;
    o.initial_block_size = size;
    o.max_block_size = size_t{1} << 20;  // big batches: few, large blocks
    return o;
  }

  ArenaAllocator<Req, Resp, Block>* const pool_;
  alignas(16) char initial_block_[Block];  // before arena_, which uses it
  google::protobuf::Arena arena_;
};

template <typename Req, typename Resp, size_t Block>
class ArenaAllocator final : public grpc::MessageAllocator<Req, Resp> {
 public:
  ~ArenaAllocator() override {
    for (ArenaHolder<Req, Resp, Block>* h : idle_) delete h;
  }
  grpc::MessageHolder<Req, Resp>* AllocateMessages() override {
    ArenaHolder<Req, Resp, Block>* h = nullptr;
    {
      MutexLock lock(&mu_);
      if (!idle_.empty()) {
        h = idle_.back();
        idle_.pop_back();
      }
    }
    if (h == nullptr) h = new ArenaHolder<Req, Resp, Block>(this);
    h->Start();
    return h;
  }
  void Recycle(ArenaHolder<Req, Resp, Block>* h) {
    {
      MutexLock lock(&mu_);
      if (idle_.size() < kPooledHolders) {
        idle_.push_back(h);
        return;
      }
    }
    delete h;
  }

 private:
  Mutex mu_;
  std::vector<ArenaHolder<Req, Resp, Block>*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ARENA_ALLOCATOR_H_
