#include "client/health.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace prefixd::client_internal {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr char kWatchMethod[] = "/grpc.health.v1.Health/Watch";

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(absl::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Health/Watch over a generic bidi call on a private completion queue; each
// operation is waited for before the next, so the stream reads like a
// synchronous one.
class GenericHealthStream : public Client::HealthStream {
 public:
  GenericHealthStream(const std::shared_ptr<grpc::Channel>& channel,
                      std::unique_ptr<grpc::ClientContext> context,
                      const std::string& service)
      : context_(std::move(context)) {
    grpc::GenericStub stub(channel);
    call_ = stub.PrepareCall(context_.get(), kWatchMethod, &cq_);
    call_->StartCall(this);
    grpc::ByteBuffer request = ToByteBuffer(EncodeHealthCheckRequest(service));
    broken_ = !Wait();
    if (!broken_) {
      call_->Write(request, this);
      broken_ = !Wait();
    }
    if (!broken_) {
      call_->WritesDone(this);
      broken_ = !Wait();
    }
  }

  ~GenericHealthStream() override {
    if (!finished_) {
      Cancel();
      Finish().IgnoreError();
    }
  }

  bool Read(HealthStatus* status) override {
    if (broken_ || finished_) return false;
    grpc::ByteBuffer buffer;
    call_->Read(&buffer, this);
    if (!Wait()) {
      broken_ = true;
      return false;
    }
    absl::StatusOr<HealthStatus> decoded =
        DecodeHealthCheckResponse(FromByteBuffer(buffer));
    if (!decoded.ok()) {
      decode_error_ = decoded.status();
      Cancel();
      broken_ = true;
      return false;
    }
    *status = *decoded;
    return true;
  }

  absl::Status Finish() override {
    if (finished_) return final_;
    grpc::Status status;
    call_->Finish(&status, this);
    Wait();
    finished_ = true;
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    final_ = decode_error_.ok() ? FromGrpcStatus(status) : decode_error_;
    return final_;
  }

  void Cancel() override { context_->TryCancel(); }

 private:
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    return cq_.Next(&tag, &ok) && ok;
  }

  std::unique_ptr<grpc::ClientContext> context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool broken_ = false;
  bool finished_ = false;
  absl::Status decode_error_;
  absl::Status final_;
};

}  // namespace

std::string EncodeHealthCheckRequest(absl::string_view service) {
  std::string out;
  if (service.empty()) return out;  // proto3: the default is not sent
  out.push_back(0x0a);              // field 1, length-delimited
  PutVarint(service.size(), &out);
  out.append(service.data(), service.size());
  return out;
}

absl::StatusOr<HealthStatus> DecodeHealthCheckResponse(
    absl::string_view bytes) {
  uint64_t status = 0;
  while (!bytes.empty()) {
    uint64_t key = 0;
    if (!GetVarint(&bytes, &key)) break;
    uint64_t value = 0;
    switch (key & 7) {
      case 0:  // varint
        if (!GetVarint(&bytes, &value))
          return absl::InternalError("bad health response varint");
        if (key >> 3 == 1) status = value;
        continue;
      case 1:  // 64-bit
        if (bytes.size() < 8)
          return absl::InternalError("truncated health response");
        bytes.remove_prefix(8);
        continue;
      case 2:  // length-delimited
        if (!GetVarint(&bytes, &value) || value > bytes.size()) {
          return absl::InternalError("truncated health response");
        }
        bytes.remove_prefix(value);
        continue;
      case 5:  // 32-bit
        if (bytes.size() < 4)
          return absl::InternalError("truncated health response");
        bytes.remove_prefix(4);
        continue;
      default:
        return absl::InternalError(
            absl::StrCat("bad health response wire type ", key & 7));
    }
  }
  if (!bytes.empty()) return absl::InternalError("bad health response key");
  if (status > 3)
    return absl::InternalError(absl::StrCat("unknown health status ", status));
  return static_cast<HealthStatus>(status);
}

absl::StatusOr<HealthStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
    const std::string& service) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request = ToByteBuffer(EncodeHealthCheckRequest(service));
  auto call = stub.PrepareUnaryCall(context, kCheckMethod, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, &cq);
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return FromGrpcStatus(status);
  return DecodeHealthCheckResponse(FromByteBuffer(response));
}

std::unique_ptr<Client::HealthStream> WatchHealth(
    const std::shared_ptr<grpc::Channel>& channel,
    std::unique_ptr<grpc::ClientContext> context, const std::string& service) {
  return std::make_unique<GenericHealthStream>(channel, std::move(context),
                                               service);
}

}  // namespace prefixd::client_internal
