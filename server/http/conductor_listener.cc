#include "server/http/conductor_listener.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/http/https_listener.h"
#include "server/listen_address.h"

namespace prefixd {
namespace {

absl::string_view EndpointOf(absl::string_view path) {
  for (absl::string_view e : kConductorEndpoints) {
    if (e != "other" && path.size() == e.size() + 1 && path[0] == '/' &&
        absl::EndsWith(path, e)) {
      return e;
    }
  }
  return "other";
}

HttpResponse Answer(const ConductorAnswer& a) {
  return HttpResponse{a.status,
                      a.format == BodyFormat::kMsgpack ? "application/msgpack"
                                                       : "application/json",
                      a.body,
                      {}};
}

// MessagePack for "application/msgpack" or "application/x-msgpack" (any
// case, parameters ignored); JSON otherwise.
BodyFormat FormatOf(absl::string_view content_type) {
  const absl::string_view type = absl::StripAsciiWhitespace(
      content_type.substr(0, content_type.find(';')));
  return absl::EqualsIgnoreCase(type, "application/msgpack") ||
                 absl::EqualsIgnoreCase(type, "application/x-msgpack")
             ? BodyFormat::kMsgpack
             : BodyFormat::kJson;
}

// What the principal may do through this API.
ConductorCaller CallerOf(const CallContext& call) {
  ConductorCaller c;
  c.principal = call.principal;
  c.may_register = call.index_write;
  c.any_tenant = call.index_all;
  c.tenant = call.tenant;
  c.salts = call.cache_salts;
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConductorListener>> ConductorListener::Start(
    const std::string& listen, HttpLimits limits, const ConductorApi* api,
    const Authorizer* auth, ConductorObserver* observer) {
  ASSIGN_OR_RETURN(ListenAddress address, ParseListenAddress(listen));
  RETURN_IF_ERROR(ProbeTcpListen(
      address, "--index_http_listen or index.http_listen in the config"));
  std::unique_ptr<ConductorListener> self(
      new ConductorListener(api, auth, observer));
  limits.read_only = false;
  limits.keep_alive = true;  // routers send request after request
  limits.body_too_large = [](size_t max, const HttpRequest& request) {
    return Answer(ErrorAnswer(
        absl::InvalidArgumentError(absl::StrCat(
            "body: over ", max, " bytes (limits.max_message_size)")),
        FormatOf(request.content_type)));
  };
  HttpHandler handle = [s = self.get()](const HttpRequest& r) {
    return s->Handle(r);
  };
  absl::StatusOr<std::unique_ptr<HttpTransport>> listener;
  if (auth->tls() != nullptr) {
    self->tls_ = true;
    listener = HttpsListener::Start(address, limits, auth->tls(), handle);
  } else {
    const std::string host =
        address.host == "localhost" ? "127.0.0.1" : address.host;
    listener = HttpListener::Start(host.empty()
                                       ? absl::StrCat(address.port)
                                       : absl::StrCat(host, ":", address.port),
                                   limits, handle);
  }
  if (!listener.ok()) {
    return absl::Status(
        listener.status().code(),
        absl::StrCat("cannot serve the Conductor API on \"", listen,
                     "\": ", listener.status().message()));
  }
  self->listener_ = *std::move(listener);
  return self;
}

HttpResponse ConductorListener::Handle(const HttpRequest& request) const {
  const absl::Time start = absl::Now();
  const absl::string_view endpoint = EndpointOf(request.path);
  const HttpResponse response = Answer(Dispatch(endpoint, request));
  if (observer_ != nullptr)
    observer_->OnConductorRequest(endpoint, response.status,
                                  absl::Now() - start);
  return response;
}

ConductorAnswer ConductorListener::Dispatch(absl::string_view endpoint,
                                            const HttpRequest& request) const {
  const BodyFormat format = FormatOf(request.content_type);
  if (endpoint == "other") {
    return ErrorAnswer(absl::NotFoundError(absl::StrCat(
                           "no endpoint ", request.path,
                           ": POST /register, /unregister, /query, "
                           "/query_by_hash or GET /services")),
                       format);
  }
  const absl::string_view method = endpoint == "services" ? "GET" : "POST";
  if (request.method != method) {
    ConductorAnswer a = ErrorAnswer(absl::InvalidArgumentError(absl::StrCat(
                                        request.method, " ", request.path,
                                        ": only ", method, " is served")),
                                    format);
    a.status = 405;
    return a;
  }
  CallCredentials credentials;
  credentials.cert = request.client_cert;
  credentials.authorization = request.authorization;
  credentials.tenant = std::string();
  absl::StatusOr<CallContext> call = auth_->AuthorizeCredentials(credentials);
  if (!call.ok()) return ErrorAnswer(call.status(), format);
  const ConductorCaller caller = CallerOf(*call);
  if (endpoint == "register")
    return api_->Register(caller, request.body, format);
  if (endpoint == "unregister")
    return api_->Unregister(caller, request.body, format);
  if (endpoint == "services") return api_->Services(caller);
  return api_->Query(caller, request.body, endpoint == "query_by_hash", format);
}

}  // namespace prefixd
